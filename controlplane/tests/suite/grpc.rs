//! The control plane in-process on 127.0.0.1:0: gRPC health and reflection (what `grpcurl` relies on), the
//! admin endpoint, and the PxeFilter contract seen by a client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ironguard_controlplane::ControlPlaneConfig;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{GetFilterStateRequest, UpdatePxeFiltersRequest, WatchFiltersRequest, filter_event::Event};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn config(tag: &str) -> ControlPlaneConfig {
    let mut c = ControlPlaneConfig::default();
    c.server.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
    c.grpc.insecure = true;
    c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
    c.server.heartbeat_secs = 1;
    c.store.data_dir = std::env::temp_dir().join(format!("ig-cp-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&c.store.data_dir);
    c
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let code = buf.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, buf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reflection_admin_and_the_filter_contract() {
    let cfg = config("grpc");
    let server = ironguard_controlplane::serve(&cfg).await.unwrap();
    let (grpc, admin) = (server.grpc_addr, server.admin_addr);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stop_rx.await;
    }));
    let url = format!("http://{grpc}");
    let channel = tonic::transport::Endpoint::from_shared(url.clone()).unwrap().connect().await.unwrap();

    // gRPC health: the PxeFilter service reports SERVING.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let r = health
        .check(tonic_health::pb::HealthCheckRequest { service: "ironguard.v1.PxeFilter".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    // Reflection lists the services, so grpcurl works without the .proto files.
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut refl = ServerReflectionClient::new(channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else { panic!("{resp:?}") };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"ironguard.v1.PxeFilter".to_string()), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health".to_string()), "{names:?}");

    // Admin endpoint.
    assert_eq!(http_get(admin, "/healthz").await.0, 200);
    assert_eq!(http_get(admin, "/readyz").await.0, 200);

    // The contract: a watch starts with a snapshot, then deltas, each with its revision.
    let mut c = PxeFilterClient::new(channel.clone());
    let mut w = c
        .watch_filters(WatchFiltersRequest { agent_id: "t".into(), since_revision: 0, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let first = w.message().await.unwrap().unwrap();
    let Some(Event::Snapshot(s0)) = first.event else { panic!("{first:?}") };
    let r = c
        .update_pxe_filters(UpdatePxeFiltersRequest { allow: vec!["52:54:00:00:00:01".into()], ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.revision, s0.revision + 1);
    assert_eq!(r.changed, 1);
    let next = tokio::time::timeout(Duration::from_secs(5), w.message()).await.unwrap().unwrap().unwrap();
    let Some(Event::Delta(d)) = next.event else { panic!("{next:?}") };
    assert_eq!((d.revision, d.allow_add.clone()), (r.revision, vec!["52:54:00:00:00:01".to_string()]));
    // Heartbeats keep an idle stream visibly alive.
    let hb = tokio::time::timeout(Duration::from_secs(5), w.message()).await.unwrap().unwrap().unwrap();
    assert!(
        matches!(hb.event, Some(Event::Heartbeat(ref h)) if h.revision == r.revision && h.epoch == s0.epoch),
        "{hb:?}"
    );
    // The same request again changes nothing and creates no revision.
    let again = c
        .update_pxe_filters(UpdatePxeFiltersRequest { allow: vec!["52-54-00-00-00-01".into()], ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.revision, again.changed), (r.revision, 0));
    assert!(!s0.epoch.is_empty() && d.epoch == s0.epoch, "{s0:?} {d:?}");
    // A watch resuming from a recent revision of this store's epoch gets only what it missed.
    let resume = |id: &str, since_revision: u64, epoch: &str| WatchFiltersRequest {
        agent_id: id.into(),
        since_revision,
        epoch: epoch.into(),
        ..Default::default()
    };
    let mut w2 = c.watch_filters(resume("t2", s0.revision, &s0.epoch)).await.unwrap().into_inner();
    let m = w2.message().await.unwrap().unwrap();
    assert!(matches!(m.event, Some(Event::Delta(ref d)) if d.revision == r.revision), "{m:?}");
    // The same revision of another epoch (a store created again), or of none named, means nothing: a snapshot.
    for epoch in ["0123456789abcdef", ""] {
        let mut w = c.watch_filters(resume("t4", s0.revision, epoch)).await.unwrap().into_inner();
        let m = w.message().await.unwrap().unwrap();
        assert!(
            matches!(m.event, Some(Event::Snapshot(ref s)) if s.revision == r.revision && s.epoch == s0.epoch),
            "{epoch:?}: {m:?}"
        );
    }
    // An agent ahead of the server (its store was replaced) gets a snapshot.
    let mut w3 = c
        .watch_filters(WatchFiltersRequest { agent_id: "t3".into(), since_revision: 9999, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let m = w3.message().await.unwrap().unwrap();
    assert!(matches!(m.event, Some(Event::Snapshot(ref s)) if s.revision == r.revision), "{m:?}");
    // Bad input: an empty agent id, a malformed MAC in GetFilterState.
    assert_eq!(c.watch_filters(WatchFiltersRequest::default()).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let e = c.get_filter_state(GetFilterStateRequest { macs: vec!["x".into()] }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    let (code, body) = http_get(admin, "/metrics").await;
    assert_eq!(code, 200);
    assert!(body.contains("ironguard_controlplane_filter_revision"), "{body}");
    assert!(body.contains("ironguard_controlplane_filter_updates_total{result=\"ok\"} 2"), "{body}");

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&cfg.store.data_dir);
}

#[test]
fn print_config_shows_the_effective_configuration() {
    let exe = env!("CARGO_BIN_EXE_ironguard-controlplane");
    let out = std::process::Command::new(exe)
        .args(["--print-config", "--grpc-listen", "127.0.0.1:7000", "--grpc-insecure", "--unknown-mac-policy", "deny"])
        .env("IRONGUARD_CP_DATA_DIR", "/tmp/from-env")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed: ControlPlaneConfig = toml::from_str(&text).unwrap();
    assert_eq!(parsed.server.grpc_listen.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:7000"));
    assert!(parsed.grpc.insecure);
    assert_eq!(parsed.store.data_dir.to_str(), Some("/tmp/from-env"));
    assert_eq!(parsed.filter.unknown_mac_policy, ironguard_controlplane::inspection::periodic::PolicySetting::Deny);
    // A bad configuration file is a clear error.
    let dir = std::env::temp_dir().join(format!("ig-cp-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("c.toml"), "[server]\ngrpc_listne = \"x\"\n").unwrap();
    let out =
        std::process::Command::new(exe).args(["--print-config", "--config"]).arg(dir.join("c.toml")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("grpc_listne"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The next event of `w` that is not a heartbeat.
async fn next_news(
    w: &mut tonic::Streaming<ironguard_proto::v1::FilterEvent>,
) -> ironguard_proto::v1::filter_event::Event {
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), w.message()).await.expect("an event").unwrap().unwrap();
        match ev.event {
            Some(Event::Heartbeat(_)) | None => continue,
            Some(e) => return e,
        }
    }
}

/// A network's discovery window reaches the filter streams of that network's agents, and only theirs: when it
/// opens (with its remaining time), on a new stream while it is open (after the snapshot), and when it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_window_is_sent_to_its_networks_agents() {
    use ironguard_proto::v1::{CloseDiscoveryRequest, OpenDiscoveryRequest};
    let mut cfg = config("discovery");
    cfg.filter.unknown_mac_policy = ironguard_controlplane::inspection::periodic::PolicySetting::WhileInspecting;
    let server = ironguard_controlplane::serve(&cfg).await.unwrap();
    let grpc = server.grpc_addr;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stop_rx.await;
    }));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    let mut c = PxeFilterClient::new(channel);
    let watch = |network: &str| WatchFiltersRequest {
        agent_id: format!("agent-{network}"),
        network: network.into(),
        ..Default::default()
    };
    let mut prov = c.watch_filters(watch("prov")).await.unwrap().into_inner();
    let mut lab = c.watch_filters(watch("lab")).await.unwrap().into_inner();
    assert!(matches!(next_news(&mut prov).await, Event::Snapshot(_)));
    assert!(matches!(next_news(&mut lab).await, Event::Snapshot(_)));

    let opened = c.open_discovery(OpenDiscoveryRequest { network: "prov".into(), seconds: 600 }).await.unwrap();
    assert_eq!(opened.into_inner().windows.len(), 1);
    let Event::Discovery(w) = next_news(&mut prov).await else { panic!("the window reaches prov's agent") };
    assert!(w.open_for_ms > 590_000 && w.open_for_ms <= 600_000, "{w:?}");
    // A new stream of the network while the window is open: the snapshot, then the window.
    let mut again = c.watch_filters(watch("prov")).await.unwrap().into_inner();
    assert!(matches!(next_news(&mut again).await, Event::Snapshot(_)));
    assert!(matches!(next_news(&mut again).await, Event::Discovery(w) if w.open_for_ms > 0));

    let bad = c.open_discovery(OpenDiscoveryRequest { network: "prov".into(), seconds: 0 }).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
    c.close_discovery(CloseDiscoveryRequest { network: "prov".into() }).await.unwrap();
    assert!(matches!(next_news(&mut prov).await, Event::Discovery(w) if w.open_for_ms == 0), "closed");
    // Another network's agent heard nothing but heartbeats all along.
    let quiet = tokio::time::timeout(Duration::from_millis(2500), next_news(&mut lab)).await;
    assert!(quiet.is_err(), "lab's agent was told of prov's window: {quiet:?}");

    let _ = stop_tx.send(());
    let _ = task.await;
    let _ = std::fs::remove_dir_all(&cfg.store.data_dir);
}
