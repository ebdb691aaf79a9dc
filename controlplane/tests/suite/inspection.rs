//! The inspection engine in-process against the fake Ironic over real HTTP: flows, retries, bad input, races,
//! periodic tasks. A test client plays the leader agent: it follows WatchFilters and reports what it received as
//! applied (the real agent and kernel are in tests/netns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use fake_ironic::{FakeIronic, Fault, Port};
use ironguard_controlplane::ControlPlaneConfig;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{
    ContinueRequest, DataRequest, DropQuarantinedRequest, GetFilterStateRequest, ListQuarantinedRequest, ListRequest,
    NodeRequest, StartRequest,
};

const N1: &str = "11111111-1111-1111-1111-111111111111";
const MAC1: &str = "52:54:00:aa:00:01";

use crate::site_support;
use site_support::{Site, node};

/// The site with N1 (manageable, one port MAC1) in the fake Ironic.
async fn site(tag: &str, tweak: impl FnOnce(&mut ControlPlaneConfig)) -> Site {
    let ironic = FakeIronic::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    ironic.add_node(node(N1, "manageable", "10.0.0.1"));
    ironic.add_port(Port { address: MAC1.into(), node_uuid: N1.into(), ..Default::default() }).unwrap();
    site_support::start(tag, ironic, |c, _| tweak(c)).await
}

impl Site {
    async fn state(&self, node: &str) -> (String, String) {
        let s = self.insp().get(NodeRequest { node: node.into() }).await.unwrap().into_inner();
        (s.state, s.error)
    }

    async fn wait_state(&self, node: &str, want: &str) -> (String, String) {
        let t = Instant::now();
        loop {
            if let Ok(r) = self.insp().get(NodeRequest { node: node.into() }).await {
                let s = r.into_inner();
                if s.state == want {
                    return (s.state, s.error);
                }
            }
            assert!(t.elapsed() < Duration::from_secs(30), "{node} never reached {want}: {:?}", self.state(node).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn calls(&self, needle: &str) -> Vec<fake_ironic::Call> {
        self.ironic.calls().into_iter().filter(|c| c.path.contains(needle)).collect()
    }
}

/// What ironic-python-agent sends for a one-NIC machine booted from `mac`.
fn data_for(mac: &str) -> String {
    serde_json::json!({
        "inventory": {
            "interfaces": [{"name": "eth0", "mac_address": mac, "ipv4_address": "192.0.2.10"}],
            "cpu": {"count": 4, "architecture": "x86_64", "flags": ["vmx"]},
            "memory": {"physical_mb": 8192, "total": 8_000_000_000u64},
            "disks": [{"name": "/dev/sda", "size": 64_424_509_440u64, "rotational": false}],
            "bmc_address": "10.0.0.1",
        },
        "root_disk": {"name": "/dev/sda", "size": 64_424_509_440u64, "rotational": false},
        "boot_interface": format!("01-{}", mac.replace(':', "-")),
        "foo": "bar",
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn start_wait_continue_finish() {
    let s = site("flow", |_| {}).await;
    let r = s
        .insp()
        .start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.node, N1);
    // Right after the start (queued, perhaps not taken by a worker yet) the node reads as started, never as "never
    // inspected" (T20).
    let (now, _) = s.state(N1).await;
    assert!(now == "starting" || now == "waiting", "{now}");
    s.wait_state(N1, "waiting").await;
    assert_eq!(s.allow_reasons(MAC1).await, vec![format!("inspection:{N1}")]);
    assert_eq!(s.ironic.boot_device(N1).as_deref(), Some("pxe"));
    assert_eq!(s.ironic.power_state(N1).as_deref(), Some("power on"));
    let boot = s.calls("/management/boot_device");
    let power = s.calls("/states/power");
    assert!(boot[0].seq < power[0].seq, "PXE set before powering on");
    // Every versioned call carried the negotiated microversion.
    assert!(
        s.ironic.calls().iter().filter(|c| c.path.starts_with("/v1")).all(|c| c.api_version.as_deref() == Some("1.81"))
    );

    let c = s
        .insp()
        .r#continue(ContinueRequest { node_uuid: String::new(), data_json: data_for(MAC1) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.node, N1);
    // `explain --timeline` shows the callback under the MAC it named; a callback from a machine nobody inspects
    // is shown refused, with the reason, under its MAC.
    let explain = |mac: &'static str| {
        let mut filters = s.filters();
        async move {
            filters
                .explain_mac(ironguard_proto::v1::ExplainMacRequest { mac: mac.into() })
                .await
                .unwrap()
                .into_inner()
                .callbacks
        }
    };
    let cb = explain(MAC1).await;
    assert_eq!(cb.len(), 1, "{cb:?}");
    assert!(cb[0].accepted && cb[0].node == N1 && cb[0].at_unix_ms > 0, "{cb:?}");
    let stranger = "52:54:00:aa:00:77";
    // Its own BMC address too: data_for gives every machine N1's, by which the lookup would find N1 (still waiting
    // until a worker takes its data).
    let data_json = data_for(stranger).replace("10.0.0.1", "10.9.9.9");
    let refused = s.insp().r#continue(ContinueRequest { node_uuid: String::new(), data_json }).await;
    assert!(refused.is_err(), "data from a machine nobody inspects is refused");
    let cb = explain(stranger).await;
    assert!(cb.len() == 1 && !cb[0].accepted && !cb[0].detail.is_empty(), "{cb:?}");
    let (_, err) = s.wait_state(N1, "finished").await;
    assert_eq!(err, "");
    assert!(s.allow_reasons(MAC1).await.is_empty(), "the allow is removed at once");
    assert_eq!(s.ironic.power_state(N1).as_deref(), Some("power off"));
    let data = s.insp().get_data(DataRequest { node: N1.into(), unprocessed: false }).await.unwrap().into_inner();
    let v: serde_json::Value = serde_json::from_str(&data.data_json).unwrap();
    assert_eq!(v["foo"], "bar");
    assert_eq!((v["cpus"].as_u64(), v["memory_mb"].as_u64(), v["local_gb"].as_u64()), (Some(4), Some(8192), Some(59)));
    assert_eq!(v["macs"], serde_json::json!([MAC1]), "the hooks ran: {v}");
    // A second inspection of the same node works (finished --start--> starting).
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abort_and_timeout_end_in_error_and_remove_the_allow() {
    let s = site("abort", |c| {
        c.inspection.timeout_secs = 1;
        c.sync.timeout_check_secs = 1;
    })
    .await;
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    s.insp().abort(NodeRequest { node: N1.into() }).await.unwrap();
    let (_, err) = s.wait_state(N1, "error").await;
    assert_eq!(err, "inspection aborted");
    let reasons = s.allow_reasons(MAC1).await;
    assert!(reasons.is_empty(), "{reasons:?}");
    assert_eq!(s.ironic.power_state(N1).as_deref(), Some("power off"));
    // Timeout: start again and never continue.
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    let (_, err) = s.wait_state(N1, "error").await;
    assert!(err.contains("timed out"), "{err}");
    // The timeout lands in `error` before its task (removing the allow) runs: the removal follows at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !s.allow_reasons(MAC1).await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the allow outlived the timed-out inspection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ironic_503_and_409_are_retried_and_a_dead_ironic_is_a_clear_error() {
    let s = site("retry", |_| {}).await;
    s.ironic.inject(Fault {
        method: Some("PUT".into()),
        path_prefix: format!("/v1/nodes/{N1}/states/power"),
        status: 503,
        count: 1,
        latency_ms: 0,
    });
    s.ironic.inject(Fault {
        method: Some("PUT".into()),
        path_prefix: format!("/v1/nodes/{N1}/management"),
        status: 409,
        count: 1,
        latency_ms: 0,
    });
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    assert_eq!(s.calls("/states/power").len(), 2, "503 then 200");
    assert_eq!(s.calls("/management/boot_device").len(), 2, "409 then 200");
    s.insp().abort(NodeRequest { node: N1.into() }).await.unwrap();
    s.wait_state(N1, "error").await;
    // Ironic down beyond the retry budget.
    s.ironic.inject(Fault {
        method: Some("PUT".into()),
        path_prefix: format!("/v1/nodes/{N1}/states/power"),
        status: 503,
        count: 0,
        latency_ms: 0,
    });
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    let t = Instant::now();
    let err = loop {
        let (state, err) = s.state(N1).await;
        if state == "error" && err.contains("503") {
            break err;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{state} {err}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(err.contains("attempts"), "{err}");
    assert!(s.allow_reasons(MAC1).await.is_empty(), "no allow left behind after an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_clear_errors_and_changes_nothing() {
    let s = site("bad", |_| {}).await;
    let e = s
        .insp()
        .start(StartRequest { node: "no-such-node".into(), manage_boot: true, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(e.message().contains("no-such-node"));
    s.ironic.add_node(node("22222222-2222-2222-2222-222222222222", "active", "10.0.0.2"));
    let e = s
        .insp()
        .start(StartRequest {
            node: "22222222-2222-2222-2222-222222222222".into(),
            manage_boot: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("active"), "{}", e.message());
    let e = s.insp().abort(NodeRequest { node: N1.into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "never inspected");
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    let e = s.insp().reapply(NodeRequest { node: N1.into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "reapply is illegal while waiting");
    assert!(e.message().contains("waiting"), "{}", e.message());
    let e = s
        .insp()
        .r#continue(ContinueRequest {
            node_uuid: String::new(),
            data_json: data_for("52:54:00:ff:ff:ff").replace("10.0.0.1", "10.9.9.9"),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = s
        .insp()
        .r#continue(ContinueRequest { node_uuid: String::new(), data_json: "{not json".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = s
        .insp()
        .r#continue(ContinueRequest { node_uuid: String::new(), data_json: "x".repeat(3 << 20) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "oversized");
    let e = s.insp().list(ListRequest { states: vec!["bogus".into()], ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Nothing changed: still waiting.
    assert_eq!(s.state(N1).await.0, "waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ironic_sync_denies_known_ports_and_forgets_deleted_nodes() {
    let s = site("sync", |c| {
        c.sync.ironic_sync_secs = 1;
    })
    .await;
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    let deny = || async {
        PxeFilterClient::new(s.channel.clone())
            .get_filter_state(GetFilterStateRequest { macs: vec![MAC1.into()] })
            .await
            .unwrap()
            .into_inner()
    };
    let t = Instant::now();
    loop {
        let st = deny().await;
        if st.entries.iter().any(|e| e.deny_reasons.contains(&"ironic".to_string())) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An operator removes the `ironic` deny by hand while Ironic still has the port: the next run adds it again,
    // as the API promises (it used to compare with its own previous run only, and never did).
    let denied_at = s.revision().await;
    let removed_at = PxeFilterClient::new(s.channel.clone())
        .update_pxe_filters(ironguard_proto::v1::UpdatePxeFiltersRequest {
            remove: vec![MAC1.into()],
            remove_reason: "ironic".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .revision;
    assert!(removed_at > denied_at, "the removal is a revision of its own");
    let t = Instant::now();
    loop {
        let st = deny().await;
        if st.revision > removed_at && st.entries.iter().any(|e| e.deny_reasons.contains(&"ironic".to_string())) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the removed ironic deny never came back: {st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.ironic.remove_node(N1).unwrap();
    let t = Instant::now();
    while s.insp().get(NodeRequest { node: N1.into() }).await.is_ok() {
        assert!(t.elapsed() < Duration::from_secs(30), "deleted node not removed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = deny().await;
    assert!(st.entries.is_empty(), "its MACs leave both sets: {st:?}");
}

/// One short answer from Ironic (every port gone at once: a token scoped to another project, a restored database)
/// does not open every denied MAC: the drop is held (the sync still adds new ports); an operator who removes those
/// denies by hand confirms it, and they are not added back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ironic_sync_holds_a_mass_drop_of_denies() {
    let s = site("mass-drop", |c| {
        c.sync.ironic_sync_secs = 1;
    })
    .await;
    let mac = |i: u32| format!("52:54:00:dd:00:{i:02x}");
    let mut ports = vec![];
    for i in 0..12u32 {
        let uuid = format!("22222222-2222-2222-2222-{i:012}");
        s.ironic.add_node(node(&uuid, "manageable", &format!("10.0.1.{i}")));
        ports.push(s.ironic.add_port(Port { address: mac(i), node_uuid: uuid, ..Default::default() }).unwrap());
    }
    let denied = || async {
        let st = PxeFilterClient::new(s.channel.clone())
            .get_filter_state(GetFilterStateRequest { macs: vec![] })
            .await
            .unwrap()
            .into_inner();
        st.entries
            .into_iter()
            .filter(|e| e.deny_reasons.contains(&"ironic".to_string()))
            .map(|e| e.mac)
            .collect::<std::collections::BTreeSet<String>>()
    };
    let wait_denied = |m: String| async move {
        let t = Instant::now();
        while !denied().await.contains(&m) {
            assert!(t.elapsed() < Duration::from_secs(30), "{m} never denied");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    for i in 0..12 {
        wait_denied(mac(i)).await;
    }
    // Ironic answers without the twelve ports, and with a new one: the new one is denied by a later run, the twelve
    // stay denied.
    for p in &ports {
        s.ironic.remove_port(&p.uuid).unwrap();
    }
    s.ironic.add_port(Port { address: mac(100), node_uuid: N1.into(), ..Default::default() }).unwrap();
    wait_denied(mac(100)).await;
    let now = denied().await;
    for i in 0..12 {
        assert!(now.contains(&mac(i)), "{} was dropped with the rest: {now:?}", mac(i));
    }
    // Said where an operator looks: the metric (and its alert), and `explain` for a held MAC.
    let site = &s;
    let metric_becomes = |line: &'static str| async move {
        let s = site;
        let t = Instant::now();
        loop {
            let m = s.metrics().await;
            if m.lines().any(|l| l == line) {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "never {line:?}:\n{m}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    metric_becomes("ironguard_controlplane_ironic_sync_held{what=\"denies\"} 12").await;
    let explain = |m: String| {
        let mut c = PxeFilterClient::new(s.channel.clone());
        async move { c.explain_mac(ironguard_proto::v1::ExplainMacRequest { mac: m }).await.unwrap().into_inner() }
    };
    let e = explain(mac(3)).await;
    assert!(e.decision.contains("its deny is held"), "{e:?}");
    let ironic = e.deny.iter().find(|r| r.reason == "ironic").unwrap();
    assert!(ironic.source.contains("12 of the 1"), "{ironic:?}");
    assert!(ironic.source.contains("ironguardctl filters remove MAC... --reason ironic"), "{ironic:?}");
    assert!(!explain(mac(100)).await.decision.contains("held"), "a port Ironic lists is not held");
    // The operator confirms: removes the twelve denies by hand. A later run (seen by another new port) does not add
    // them back: Ironic does not list them.
    PxeFilterClient::new(s.channel.clone())
        .update_pxe_filters(ironguard_proto::v1::UpdatePxeFiltersRequest {
            remove: (0..12).map(mac).collect(),
            remove_reason: "ironic".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    s.ironic.add_port(Port { address: mac(101), node_uuid: N1.into(), ..Default::default() }).unwrap();
    wait_denied(mac(101)).await;
    let now = denied().await;
    assert!((0..12).all(|i| !now.contains(&mac(i))), "{now:?}");
    assert!(now.contains(&mac(100)) && now.contains(MAC1), "{now:?}");
    // Nothing is held any more: the metric says 0 and the record is gone.
    metric_becomes("ironguard_controlplane_ironic_sync_held{what=\"denies\"} 0").await;
    let e = explain(mac(3)).await;
    assert!(!e.decision.contains("held"), "{e:?}");
}

/// A queued request that cannot be read (written here before the control plane starts, as a flipped bit would leave
/// it) is set aside by the workers, and said where an operator looks: `/metrics` counts it (the alert's metric),
/// `List` counts it, `ListQuarantined` names it with its bytes; `DropQuarantined` forgets it once, and then the
/// count is 0 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quarantined_request_is_counted_listed_and_dropped() {
    const ID: u64 = 1000;
    let ironic = fake_ironic::FakeIronic::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let s = site_support::start("quarantine", ironic, |c, _| {
        std::fs::create_dir_all(&c.store.data_dir).unwrap();
        let db =
            redb::Database::create(c.store.data_dir.join(ironguard_controlplane::store::embedded::DB_FILE)).unwrap();
        let w = db.begin_write().unwrap();
        let queue: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("inspection_queue");
        // JSON, but not a request (a kind no version has): its node can still be read.
        let entry = br#"{"request": {"id": 1000, "node": "n-q", "kind": "no-such-kind", "enqueued_at": 1}}"#;
        w.open_table(queue).unwrap().insert(ID, entry.as_slice()).unwrap();
        w.commit().unwrap();
    })
    .await;
    let t = Instant::now();
    let q = loop {
        let q = s.insp().list_quarantined(ListQuarantinedRequest {}).await.unwrap().into_inner().requests;
        if !q.is_empty() {
            break q;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the workers never set the request aside");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!((q[0].id, q[0].node.as_str(), q[0].key.as_str()), (ID, "n-q", "inspection_queue/1000"));
    assert!(q[0].raw.starts_with(r#"{"request""#) && q[0].raw_bytes == q[0].raw.len() as u64, "{:?}", q[0]);
    assert!(!q[0].error.is_empty() && q[0].quarantined_at_ms > 0, "{:?}", q[0]);
    let gauge =
        |m: &str| m.lines().find(|l| l.starts_with("ironguard_controlplane_inspection_quarantined ")).map(String::from);
    let m = s.metrics().await;
    assert_eq!(gauge(&m).as_deref(), Some("ironguard_controlplane_inspection_quarantined 1"), "{m}");
    let listed = s.insp().list(ListRequest::default()).await.unwrap().into_inner();
    assert_eq!(listed.quarantined, 1);

    let e = s.insp().drop_quarantined(DropQuarantinedRequest { id: ID + 1 }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    s.insp().drop_quarantined(DropQuarantinedRequest { id: ID }).await.unwrap();
    let e = s.insp().drop_quarantined(DropQuarantinedRequest { id: ID }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "dropped once: {e:?}");
    assert!(s.insp().list_quarantined(ListQuarantinedRequest {}).await.unwrap().into_inner().requests.is_empty());
    assert_eq!(s.insp().list(ListRequest::default()).await.unwrap().into_inner().quarantined, 0);
    // The replica that dropped it reads the store again at the next scrape.
    let m = s.metrics().await;
    assert_eq!(gauge(&m).as_deref(), Some("ironguard_controlplane_inspection_quarantined 0"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ironics_own_inspection_allows_its_ports_while_it_lasts() {
    let s = site("own", |c| {
        c.sync.ironic_inspection = true;
        c.sync.ironic_inspection_period_ms = 100;
    })
    .await;
    s.ironic.set_provision_state(N1, "inspect wait").unwrap();
    let t = Instant::now();
    while !s.allow_reasons(MAC1).await.contains(&"ironic-inspection".to_string()) {
        assert!(t.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.ironic.set_provision_state(N1, "manageable").unwrap();
    let t = Instant::now();
    while !s.allow_reasons(MAC1).await.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another inspect interface does not count.
    s.ironic.set_inspect_interface(N1, "inspector").unwrap();
    s.ironic.set_provision_state(N1, "inspect wait").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(s.allow_reasons(MAC1).await.is_empty());
}

/// A node's ports are read when Ironic starts inspecting it, then again once `[sync] ironic_inspection_ports_secs`
/// has passed, not at every poll; a port added meanwhile is allowed after that refresh, and a node that leaves
/// `inspect wait` loses its allows at the next poll whatever its ports' age. (Before, every poll read the ports of
/// every inspected node: with thirty nodes and a 300 ms poll, a hundred port lists a second.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ironics_own_inspection_reads_a_nodes_ports_once_per_refresh() {
    const MAC2: &str = "52:54:00:aa:00:02";
    let s = site("own-ports", |c| {
        c.sync.ironic_inspection = true;
        c.sync.ironic_inspection_period_ms = 100;
        c.sync.ironic_inspection_ports_secs = 3;
        c.sync.ironic_sync_secs = 0;
    })
    .await;
    let allowed = |mac: &'static str| {
        let s = &s;
        async move { s.allow_reasons(mac).await.contains(&"ironic-inspection".to_string()) }
    };
    let port_reads = || s.calls(&format!("node_uuid={N1}"));
    s.ironic.set_provision_state(N1, "inspect wait").unwrap();
    let t = Instant::now();
    while !allowed(MAC1).await {
        assert!(t.elapsed() < Duration::from_secs(30), "the node's port was never allowed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A port added during the inspection: allowed once the node's ports are read again.
    s.ironic.add_port(Port { address: MAC2.into(), node_uuid: N1.into(), ..Default::default() }).unwrap();
    let t = Instant::now();
    while !allowed(MAC2).await {
        assert!(t.elapsed() < Duration::from_secs(30), "the port added during the inspection was never allowed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reads = port_reads();
    assert!(reads.len() >= 2, "read again: {reads:?}");
    for pair in reads.windows(2) {
        // Each read starts at least 3 s after the one before; 2 s here for the first request's own way to Ironic.
        let gap = pair[1].at.duration_since(pair[0].at).unwrap_or_default();
        assert!(gap >= Duration::from_secs(2), "ports read again {gap:?} after the last read: {reads:?}");
        // ... while the nodes were listed at every poll in between.
        let polls = s.calls("/v1/nodes?").iter().filter(|c| c.seq > pair[0].seq && c.seq < pair[1].seq).count();
        assert!(polls >= 2, "{polls} polls between two reads of the ports");
    }
    // Out of `inspect wait`: both allows go at the next poll, with no read of the ports.
    let reads = port_reads().len();
    s.ironic.set_provision_state(N1, "manageable").unwrap();
    let t = Instant::now();
    while allowed(MAC1).await || allowed(MAC2).await {
        assert!(t.elapsed() < Duration::from_secs(30), "the allows stayed after the inspection");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(port_reads().len(), reads, "no port read for a node that left the inspected states");
}

/// Ironic unreachable for longer than `[sync] ironic_inspection_unreachable_secs`: the allows of the nodes it was
/// inspecting go (nobody can confirm them), and come back once it answers again and still inspects them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ironics_own_inspection_allows_expire_while_ironic_does_not_answer() {
    let s = site("own-expiry", |c| {
        c.sync.ironic_inspection = true;
        c.sync.ironic_inspection_period_ms = 100;
        c.sync.ironic_inspection_unreachable_secs = 1;
    })
    .await;
    let allowed = || async { s.allow_reasons(MAC1).await.contains(&"ironic-inspection".to_string()) };
    let becomes = |want: bool| async move {
        let t = Instant::now();
        while allowed().await != want {
            assert!(t.elapsed() < Duration::from_secs(30), "the ironic-inspection allow never became {want}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    s.ironic.set_provision_state(N1, "inspect wait").unwrap();
    becomes(true).await;
    let down =
        Fault { method: Some("GET".into()), path_prefix: "/v1/nodes".into(), status: 503, count: 0, latency_ms: 0 };
    s.ironic.inject(down);
    let t = Instant::now();
    becomes(false).await;
    // The bound counts from the last answer, at most one poll (100 ms) before the fault.
    assert!(t.elapsed() >= Duration::from_millis(800), "not before the bound: {:?}", t.elapsed());
    s.ironic.clear_faults();
    becomes(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reboot_throttle_spaces_power_ons() {
    let s = site("throttle", |c| {
        c.inspection.reboot_quantum_ms = 400;
        c.inspection.workers = 3;
    })
    .await;
    let ids = ["33333333-0000-0000-0000-000000000001", "33333333-0000-0000-0000-000000000002"];
    for (i, id) in ids.iter().enumerate() {
        s.ironic.add_node(node(id, "manageable", &format!("10.0.1.{i}")));
        s.ironic
            .add_port(Port { address: format!("52:54:00:bb:00:0{i}"), node_uuid: id.to_string(), ..Default::default() })
            .unwrap();
    }
    for id in [N1, ids[0], ids[1]] {
        s.insp().start(StartRequest { node: id.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    }
    for id in [N1, ids[0], ids[1]] {
        s.wait_state(id, "waiting").await;
    }
    let mut at: Vec<_> = s.calls("/states/power").into_iter().map(|c| c.at).collect();
    at.sort();
    assert_eq!(at.len(), 3);
    for w in at.windows(2) {
        let gap = w[1].duration_since(w[0]).unwrap();
        assert!(gap >= Duration::from_millis(380), "power-ons {gap:?} apart");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_racing_for_one_node_one_proceeds_the_other_leaves_the_request() {
    use ironguard_inspection::records::{Kind, Taken};
    use ironguard_proto::time::now_ms;
    let s = site("race", |_| {}).await;
    // The first worker's task blocks in Ironic (validating the power interface), holding the node's lock, for far
    // longer than the loser can need: the loser must be done while the winner still holds the lock.
    s.ironic.inject(Fault {
        method: Some("GET".into()),
        path_prefix: format!("/v1/nodes/{N1}/validate"),
        status: 0,
        count: 1,
        latency_ms: 3000,
    });
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "starting").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.ironic.calls().iter().any(|c| c.path.contains("/validate")) {
        assert!(Instant::now() < deadline, "the winner's task never reached Ironic's validate");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A second worker (say on another replica) holds a request for the same node.
    let id = s.engine.store.enqueue(N1, Kind::Abort, serde_json::Value::Null).await.unwrap();
    let req = s.engine.store.pending().await.unwrap().into_iter().find(|r| r.id == id).unwrap();
    let taken = Taken { request: req, attempt: 1, worker: "racer".into(), lease_until: now_ms() + 5000 };
    let session = s.engine.coord.session(Duration::from_secs(10)).await.unwrap();
    s.engine.handle(taken, &session, &tokio_util::sync::CancellationToken::new()).await;
    // Order, not time: the winner's task is still blocked in Ironic (nothing after its validate call reached
    // Ironic), so the loser came back while the lock was held instead of waiting for it.
    let calls = s.ironic.calls();
    let validate = calls.iter().rposition(|c| c.path.contains("/validate")).expect("the winner's validate call");
    let changes: Vec<String> = calls[validate + 1..]
        .iter()
        .filter(|c| c.method != "GET" && c.path.contains(N1))
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert!(changes.is_empty(), "the loser does not wait for the lock: the winner went on meanwhile ({changes:?})");
    assert!(
        s.engine.store.pending().await.unwrap().iter().any(|r| r.id == id),
        "the loser left its request in the queue"
    );
    assert_eq!(s.state(N1).await.0, "starting", "the loser changed nothing");
    // The winner finishes (starting -> waiting); the left request is then taken by a worker and applied (abort is
    // only legal from waiting, so reaching "aborted" proves the order).
    let (_, err) = s.wait_state(N1, "error").await;
    assert_eq!(err, "inspection aborted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policy_while_inspecting_allows_unknown_macs_only_during_an_inspection() {
    use ironguard_controlplane::inspection::periodic::PolicySetting;
    use ironguard_proto::v1::UnknownMacPolicy;
    let s = site("policy", |c| {
        c.filter.unknown_mac_policy = PolicySetting::WhileInspecting;
        c.sync.ironic_inspection_period_ms = 100;
    })
    .await;
    let policy = || async {
        PxeFilterClient::new(s.channel.clone())
            .get_filter_state(GetFilterStateRequest::default())
            .await
            .unwrap()
            .into_inner()
            .unknown_mac_policy
    };
    let wait_policy = |want: UnknownMacPolicy| async move {
        let t = Instant::now();
        while policy().await != want as i32 {
            assert!(t.elapsed() < Duration::from_secs(30), "policy never became {want:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait_policy(UnknownMacPolicy::Deny).await;
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    wait_policy(UnknownMacPolicy::Allow).await;
    s.insp().r#continue(ContinueRequest { node_uuid: String::new(), data_json: data_for(MAC1) }).await.unwrap();
    s.wait_state(N1, "finished").await;
    wait_policy(UnknownMacPolicy::Deny).await;
}

/// Before: while Ironic was unreachable the while-inspecting policy was not recomputed, so unknown MACs stayed
/// allowed for as long as Ironic was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_inspecting_closes_when_ironic_is_unreachable() {
    use ironguard_controlplane::inspection::periodic::PolicySetting;
    use ironguard_proto::v1::UnknownMacPolicy;
    let s = site("policy-down", |c| {
        c.filter.unknown_mac_policy = PolicySetting::WhileInspecting;
        c.sync.ironic_inspection = true;
        c.sync.ironic_inspection_period_ms = 100;
        c.ironic.retries = 0;
    })
    .await;
    // Ironic inspects a node itself: the policy opens.
    s.ironic.set_inspect_interface(N1, "agent").unwrap();
    s.ironic.set_provision_state(N1, "inspect wait").unwrap();
    let policy = || async {
        PxeFilterClient::new(s.channel.clone())
            .get_filter_state(GetFilterStateRequest::default())
            .await
            .unwrap()
            .into_inner()
            .unknown_mac_policy
    };
    let wait_policy = |want: UnknownMacPolicy| async move {
        let t = Instant::now();
        while policy().await != want as i32 {
            assert!(t.elapsed() < Duration::from_secs(30), "policy never became {want:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait_policy(UnknownMacPolicy::Allow).await;
    // Ironic stops answering: nobody can tell what is inspected any more, so unknown MACs are denied.
    s.ironic.inject(Fault { method: None, path_prefix: "/v1".into(), status: 503, count: 0, latency_ms: 0 });
    wait_policy(UnknownMacPolicy::Deny).await;
    s.ironic.clear_faults();
    wait_policy(UnknownMacPolicy::Allow).await;
}

/// ironic-inspector refuses to inspect a node in maintenance unless asked; before, ironguard inspected it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn maintenance_nodes_are_refused_unless_asked() {
    let s = site("maint", |_| {}).await;
    s.ironic.update_node(N1, |n| n.maintenance = true).unwrap();
    let e =
        s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("maintenance"), "{}", e.message());
    let http = reqwest::Client::new();
    let r = http.post(format!("{}/v1/introspection/{N1}", s.inspector)).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(s.allow_reasons(MAC1).await.is_empty(), "nothing allowed");
    assert!(s.calls("/states/power").is_empty(), "never powered");
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, maintenance_ok: true }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    assert_eq!(s.allow_reasons(MAC1).await, vec![format!("inspection:{N1}")]);
}

/// Before: a failed removal of an inspection's allow was only logged, and the allow stayed forever. Now the workers
/// retry and the stale-allows task removes any allow whose inspection is over; an operator can also drop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allow_that_outlived_its_inspection_is_removed() {
    use ironguard_controlplane::filter::{ReasonChange, Side};
    let s = site("stale", |c| c.sync.timeout_check_secs = 1).await;
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    s.insp().r#continue(ContinueRequest { node_uuid: String::new(), data_json: data_for(MAC1) }).await.unwrap();
    s.wait_state(N1, "finished").await;
    // What a swallowed removal left behind: the finished inspection's allow.
    let mac = MAC1.parse().unwrap();
    let change = ReasonChange { mac, side: Side::Allow, reason: format!("inspection:{N1}"), present: true };
    s.engine.filters.apply(vec![change], None).await.unwrap();
    assert_eq!(s.allow_reasons(MAC1).await, vec![format!("inspection:{N1}")]);
    let t = Instant::now();
    while !s.allow_reasons(MAC1).await.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30), "the stale allow was never removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A running inspection's allow is left alone.
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(s.allow_reasons(MAC1).await, vec![format!("inspection:{N1}")]);
    // The operator's override drops any reason (ironguardctl filters remove --reason inspection:<node>).
    let r = PxeFilterClient::new(s.channel.clone())
        .update_pxe_filters(ironguard_proto::v1::UpdatePxeFiltersRequest {
            remove: vec![MAC1.into()],
            remove_reason: format!("inspection:{N1}"),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(r.into_inner().revision > 0);
    assert!(s.allow_reasons(MAC1).await.is_empty());
}

/// The ironic-inspector v1 REST API over real HTTP, as ironic-python-agent and `openstack baremetal
/// introspection` use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ironic_inspector_v1_rest_api() {
    let s = site("v1api", |_| {}).await;
    let http = reqwest::Client::new();
    let u = |p: &str| format!("{}{p}", s.inspector);

    let root = http.get(u("/")).send().await.unwrap();
    assert_eq!(root.status(), 200);
    assert_eq!(root.headers()["X-OpenStack-Ironic-Inspector-API-Maximum-Version"], "1.18");
    let v: serde_json::Value = root.json().await.unwrap();
    assert_eq!(v["versions"][0]["id"], "1.18");

    // Start: 202, then the status follows the engine.
    let r = http.post(u(&format!("/v1/introspection/{N1}"))).send().await.unwrap();
    assert_eq!(r.status(), 202);
    s.wait_state(N1, "waiting").await;
    let st: serde_json::Value =
        http.get(u(&format!("/v1/introspection/{N1}"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(st["uuid"], N1);
    assert_eq!(st["state"], "waiting");
    assert_eq!(st["finished"], false);
    assert!(st["error"].is_null(), "{st}");
    assert!(st["started_at"].as_str().unwrap().len() == 19, "{st}");
    assert!(st["finished_at"].is_null());
    // A node Ironic has deployed may not be inspected: refused, and nothing changes.
    s.ironic.set_provision_state(N1, "active").unwrap();
    let r = http.post(u(&format!("/v1/introspection/{N1}"))).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let e: serde_json::Value = r.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("active"), "{e}");
    assert_eq!(s.state(N1).await.0, "waiting");
    s.ironic.set_provision_state(N1, "manageable").unwrap();

    // Bad input on /v1/continue: clear errors, nothing changes.
    let r = http.post(u("/v1/continue")).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.json::<serde_json::Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("not JSON"));
    let stranger = data_for("52:54:00:99:99:99").replace("10.0.0.1", "10.9.9.9");
    let r = http.post(u("/v1/continue")).body(stranger).send().await.unwrap();
    assert_eq!(r.status(), 400, "no node has that MAC: a pre-processing failure, as in ironic-inspector");
    let msg = r.json::<serde_json::Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("Look up error: Could not find a node for attributes"), "{msg}");
    // Junk naming the waiting node's MAC (anyone on the PXE network hears it in the node's DHCP broadcasts), and a
    // forged ramdisk error: refused, and the node keeps waiting for its real data (ironic-inspector would end its
    // inspection).
    let junk = serde_json::json!({"inventory": "junk", "macs": [MAC1]});
    let mut forged: serde_json::Value = serde_json::from_str(&data_for(MAC1)).unwrap();
    forged["error"] = "the ramdisk failed (forged)".into();
    for body in [junk, forged] {
        let r = http.post(u("/v1/continue")).body(body.to_string()).send().await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let msg = r.json::<serde_json::Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains("pre-processing"), "{msg}");
        assert_eq!(s.state(N1).await.0, "waiting", "a refused callback ended N1's inspection: {body}");
    }
    // (Had either queued an end of N1's inspection, the worker would run it before the real data below, which
    // would then be refused: N1 finishing with its own data is the proof.)
    let no_ip =
        serde_json::json!({"inventory": {"interfaces": [{"name": "eth0", "mac_address": "52:54:00:99:99:98"}]}});
    let r = http.post(u("/v1/continue")).body(no_ip.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let msg = r.json::<serde_json::Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("No suitable interfaces"), "{msg}");
    let big = vec![b' '; ironguard_controlplane::http_access::config::DEFAULT_CONTINUE_MAX_BYTES + 1];
    let r = http.post(u("/v1/continue")).body(big).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert!(r.json::<serde_json::Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("over"));
    assert_eq!(s.state(N1).await.0, "waiting");

    // The ramdisk's report, as ironic-python-agent posts it, once the node booted through the filter.
    s.boot(MAC1).await;
    let r = http.post(u("/v1/continue")).body(data_for(MAC1)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["uuid"], N1);
    s.wait_state(N1, "finished").await;
    let st: serde_json::Value =
        http.get(u(&format!("/v1/introspection/{N1}"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(st["finished"], true);
    assert!(st["finished_at"].is_string());
    let d: serde_json::Value =
        http.get(u(&format!("/v1/introspection/{N1}/data"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(d["foo"], "bar");

    // Listing, with filters and bad parameters.
    let l: serde_json::Value = http.get(u("/v1/introspection")).send().await.unwrap().json().await.unwrap();
    assert_eq!(l["introspection"].as_array().unwrap().len(), 1);
    assert_eq!(l["introspection"][0]["uuid"], N1);
    let l: serde_json::Value =
        http.get(u("/v1/introspection?state=waiting")).send().await.unwrap().json().await.unwrap();
    assert!(l["introspection"].as_array().unwrap().is_empty());
    assert_eq!(http.get(u("/v1/introspection?limit=0")).send().await.unwrap().status(), 400);
    assert_eq!(http.get(u("/v1/introspection?state=bogus")).send().await.unwrap().status(), 400);
    assert_eq!(http.get(u("/v1/introspection?marker=nope")).send().await.unwrap().status(), 400);

    // Unknown nodes and bad parameters.
    let unknown = "99999999-9999-9999-9999-999999999999";
    let r = http.get(u(&format!("/v1/introspection/{unknown}"))).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<serde_json::Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains(unknown));
    assert_eq!(http.post(u(&format!("/v1/introspection/{unknown}"))).send().await.unwrap().status(), 404);
    let r = http.post(u(&format!("/v1/introspection/{N1}?manage_boot=maybe"))).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(s.state(N1).await.0, "finished");

    // Start without managing boot, then abort: error, allow removed.
    let r = http.post(u(&format!("/v1/introspection/{N1}?manage_boot=false"))).send().await.unwrap();
    assert_eq!(r.status(), 202);
    s.wait_state(N1, "waiting").await;
    assert_eq!(http.post(u(&format!("/v1/introspection/{N1}/abort"))).send().await.unwrap().status(), 202);
    let (_, err) = s.wait_state(N1, "error").await;
    assert_eq!(err, "inspection aborted");
    assert!(s.allow_reasons(MAC1).await.is_empty());
    let st: serde_json::Value =
        http.get(u(&format!("/v1/introspection/{N1}"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(st["error"], "inspection aborted");
    assert_eq!(st["finished"], true);
}

/// With the default `callback_source = "link"`, data whose boot interface booted through the filter is still
/// refused when its sender is on no link of the control plane's host (here 127.0.0.1: the real kernel's neighbour
/// table has no entry for it), with a reply that says so, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sender_on_no_link_is_refused_by_default() {
    use ironguard_controlplane::inspection::engine::CallbackSource;
    let s = site("no-link", |c| c.inspection.callback_source = CallbackSource::Link).await;
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    s.boot(MAC1).await;
    let mut d: serde_json::Value = serde_json::from_str(&data_for(MAC1)).unwrap();
    d["boot_interface"] = format!("01-{}", MAC1.replace(':', "-")).into();
    let r = reqwest::Client::new().post(format!("{}/v1/continue", s.inspector)).body(d.to_string()).send().await;
    let r = r.unwrap();
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap_or_default().to_string();
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("the data came from 127.0.0.1, which is on no link of the control plane's host"), "{msg}");
    assert_eq!(s.state(N1).await.0, "waiting", "the refusal changed nothing");
    assert!(s.calls("/v1/nodes/").iter().all(|c| c.method != "PATCH"), "no property was written");
}

/// `/v1/continue` data is accepted for a node only with evidence that ties the poster to the node's inspection:
/// its boot interface is a MAC the inspection allowed and the leader's kernel let DHCP from it through since the
/// inspection started (here a stand-in kernel; the real agent's in tests/netns). A machine on the PXE network that
/// names the node's MAC and its own as the boot interface is refused and changes nothing (O14). A port processing
/// creates for another interface of the node is marked unverified and is not allowed in the next inspection; a MAC
/// the filter denies never becomes a port.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ramdisk_data_needs_evidence_that_its_boot_interface_booted_through_the_filter() {
    use ironguard_inspection::processing::AddPorts;
    let s = site("evidence", |c| c.processing.add_ports = AddPorts::All).await;
    let (attacker, extra, denied) = ("52:54:00:aa:00:66", "52:54:00:aa:00:02", "52:54:00:aa:00:03");
    s.filters()
        .update_pxe_filters(ironguard_proto::v1::UpdatePxeFiltersRequest {
            deny: vec![denied.into()],
            ..Default::default()
        })
        .await
        .unwrap();
    s.insp().start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    let http = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        let req = http.post(format!("{}/v1/continue", s.inspector)).body(body.to_string());
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
            let v: serde_json::Value = r.json().await.unwrap();
            (status, v["error"]["message"].as_str().unwrap_or_default().to_string(), retry)
        }
    };
    let ports_before = s.ironic.ports().len();
    let with = |boot: Option<&str>, macs: &[&str]| {
        let mut d: serde_json::Value = serde_json::from_str(&data_for(macs[0])).unwrap();
        d["inventory"]["interfaces"] = macs
            .iter()
            .enumerate()
            .map(|(i, m)| serde_json::json!({"name": format!("eth{i}"), "mac_address": m, "ipv4_address": format!("192.0.2.{}", 10 + i)}))
            .collect();
        d["boot_interface"] = boot.map_or(serde_json::Value::Null, |b| format!("01-{}", b.replace(':', "-")).into());
        d
    };

    // The hijack: node1's MAC (heard in its broadcasts) and the attacker's own as the boot interface.
    let (status, msg, _) = post(with(Some(attacker), &[MAC1, attacker])).await;
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains(&format!("boot interface {attacker} was not allowed DHCP")), "{msg}");
    assert!(!msg.contains(N1), "the refusal names no node: {msg}");
    // No boot interface named at all.
    let (status, msg, _) = post(with(None, &[MAC1])).await;
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("names no boot interface"), "{msg}");
    // The node's own MAC as the boot interface, before anything booted from it: not yet, retry.
    let (status, msg, retry) = post(with(Some(MAC1), &[MAC1])).await;
    assert_eq!((status, retry.as_deref()), (503, Some("5")), "{msg}");
    assert!(msg.contains(&format!("no DHCP from the boot interface {MAC1}")), "{msg}");
    assert_eq!(s.state(N1).await.0, "waiting", "the refusals changed nothing");
    assert_eq!(s.ironic.ports().len(), ports_before, "no port was created");
    assert!(s.calls("/v1/nodes/").iter().all(|c| c.method != "PATCH"), "no property was written");
    // The kernel's word for another MAC ties nothing to N1.
    s.boot(attacker).await;
    let (status, msg, _) = post(with(Some(attacker), &[MAC1, attacker])).await;
    assert_eq!(status, 400, "{msg}");

    // The node boots through the filter; its ramdisk reports three interfaces.
    s.boot(MAC1).await;
    let (status, msg, _) = post(with(Some(MAC1), &[MAC1, extra, denied])).await;
    assert_eq!(status, 200, "{msg}");
    s.wait_state(N1, "finished").await;
    let ports = s.ironic.ports();
    let port = |mac: &str| ports.iter().find(|p| p.address == mac && p.node_uuid == N1).cloned();
    let created = port(extra).expect("a port for the other interface");
    assert!(created.extra.contains_key("ironguard_unverified"), "{created:?}");
    assert!(port(denied).is_none(), "a MAC the filter denies never becomes a port: {ports:?}");
    assert!(port(attacker).is_none());

    // The next inspection allows the node's own port only: the unverified one gets no DHCP.
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.wait_state(N1, "waiting").await;
    assert_eq!(s.allow_reasons(MAC1).await, vec![format!("inspection:{N1}")]);
    assert!(s.allow_reasons(extra).await.is_empty(), "an unverified port is not allowed");
    let inspection = s.insp().get(NodeRequest { node: N1.into() }).await.unwrap().into_inner();
    assert_eq!(inspection.macs, vec![MAC1.to_string()]);
}
