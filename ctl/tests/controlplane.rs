//! `ironguardctl filters` and `agents`, the binary itself, against a fake `PxeFilter` server on `127.0.0.1:0`:
//! what it sends, what it prints, and its exit codes.
// A test crate: the fake server's helpers panic on setup failures, which fails the test that called them.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::process::Output;
use std::sync::{Arc, Mutex};

use ironguard_proto::v1::pxe_filter_server::{PxeFilter, PxeFilterServer};
use ironguard_proto::v1::{
    AgentInfo, AgentStatus, DhcpHealth, FilterEntry, FilterEvent, FilterState, GetFilterStateRequest,
    ListAgentsRequest, ListAgentsResponse, Mode, ReportStatusResponse, UnknownMacPolicy, UpdatePxeFiltersRequest,
    UpdatePxeFiltersResponse, WatchFiltersRequest,
};
use tonic::codegen::tokio_stream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// A MAC the fake server refuses with INVALID_ARGUMENT (valid to the CLI: the refusal must come from the server).
const REFUSED_MAC: &str = "02:00:00:00:00:01";

/// Records the requests it receives (shared with the test) and answers with fixed data.
#[derive(Debug, Clone, Default)]
struct FakeControlPlane {
    updates: Arc<Mutex<Vec<UpdatePxeFiltersRequest>>>,
    state_requests: Arc<Mutex<Vec<GetFilterStateRequest>>>,
}

#[tonic::async_trait]
impl PxeFilter for FakeControlPlane {
    async fn update_pxe_filters(
        &self,
        request: Request<UpdatePxeFiltersRequest>,
    ) -> Result<Response<UpdatePxeFiltersResponse>, Status> {
        let request = request.into_inner();
        self.updates.lock().unwrap().push(request.clone());
        let all = request.allow.iter().chain(&request.deny).chain(&request.remove);
        if all.clone().any(|m| m == REFUSED_MAC) {
            return Err(Status::invalid_argument(format!("MAC {REFUSED_MAC} is reserved")));
        }
        Ok(Response::new(UpdatePxeFiltersResponse { revision: 43, changed: u32::try_from(all.count()).unwrap() }))
    }

    type WatchFiltersStream = tokio_stream::Empty<Result<FilterEvent, Status>>;

    async fn watch_filters(
        &self,
        _request: Request<WatchFiltersRequest>,
    ) -> Result<Response<Self::WatchFiltersStream>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn report_status(&self, _request: Request<AgentStatus>) -> Result<Response<ReportStatusResponse>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn get_filter_state(&self, request: Request<GetFilterStateRequest>) -> Result<Response<FilterState>, Status> {
        self.state_requests.lock().unwrap().push(request.into_inner());
        Ok(Response::new(FilterState {
            revision: 42,
            entries: vec![FilterEntry {
                mac: "52:54:00:12:34:56".into(),
                allow_reasons: vec!["api".into()],
                deny_reasons: vec![],
            }],
            unknown_mac_policy: UnknownMacPolicy::Deny as i32,
            allow_count: 1,
            deny_count: 0,
        }))
    }

    async fn explain_mac(
        &self,
        _request: Request<ironguard_proto::v1::ExplainMacRequest>,
    ) -> Result<Response<ironguard_proto::v1::MacExplanation>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn open_discovery(
        &self,
        _request: Request<ironguard_proto::v1::OpenDiscoveryRequest>,
    ) -> Result<Response<ironguard_proto::v1::DiscoveryWindows>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn close_discovery(
        &self,
        _request: Request<ironguard_proto::v1::CloseDiscoveryRequest>,
    ) -> Result<Response<ironguard_proto::v1::DiscoveryWindows>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn list_discovery(
        &self,
        _request: Request<ironguard_proto::v1::ListDiscoveryRequest>,
    ) -> Result<Response<ironguard_proto::v1::DiscoveryWindows>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn list_agents(&self, _request: Request<ListAgentsRequest>) -> Result<Response<ListAgentsResponse>, Status> {
        Ok(Response::new(ListAgentsResponse {
            current_revision: 42,
            agents: vec![AgentInfo {
                status: Some(AgentStatus {
                    agent_id: "pxe-a".into(),
                    host: "ctrl-1".into(),
                    network: "provisioning".into(),
                    applied_revision: 42,
                    mode: Mode::Leader as i32,
                    dhcp: Some(DhcpHealth { healthy: true, detail: "dnsmasq listening on udp/67".into() }),
                    mode_reason: "leader".into(),
                    ..Default::default()
                }),
                lag: 0,
                last_seen_ms: 500,
                stale: false,
                elected: true,
            }],
            coordination: "embedded".into(),
            leaders: vec![ironguard_proto::v1::NetworkLeader {
                network: "provisioning".into(),
                agent_id: "pxe-a".into(),
            }],
            store_amnesia: String::new(),
            warnings: vec![],
        }))
    }
}

async fn start_fake() -> (FakeControlPlane, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let fake = FakeControlPlane::default();
    let server = tonic::transport::Server::builder().add_service(PxeFilterServer::new(fake.clone()));
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    (fake, format!("http://{addr}"))
}

async fn ironguardctl(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_ironguardctl"))
        .args(args)
        .env_remove("IRONGUARD_CONTROLPLANE")
        .output()
        .await
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn allow_sends_the_macs_and_prints_the_revision() {
    let (fake, url) = start_fake().await;
    let out =
        ironguardctl(&["--controlplane", &url, "filters", "allow", "52-54-00-AB-CD-EF", "52:54:00:12:34:56"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "allow: 2 MACs sent, 2 changed; revision 43\n");
    let updates = fake.updates.lock().unwrap();
    assert_eq!(
        *updates,
        [UpdatePxeFiltersRequest {
            allow: vec!["52:54:00:ab:cd:ef".into(), "52:54:00:12:34:56".into()],
            deny: vec![],
            remove: vec![],
            remove_reason: String::new(),
        }]
    );
}

#[tokio::test]
async fn deny_and_remove_use_their_own_fields() {
    let (fake, url) = start_fake().await;
    for word in ["deny", "remove"] {
        let out = ironguardctl(&["filters", word, "52:54:00:12:34:56", "--controlplane", &url]).await;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let updates = fake.updates.lock().unwrap();
    assert_eq!(updates[0].deny, ["52:54:00:12:34:56"]);
    assert_eq!(updates[1].remove, ["52:54:00:12:34:56"]);
    assert!(updates.iter().all(|u| u.allow.is_empty()));
}

#[tokio::test]
async fn a_malformed_mac_exits_2_before_any_rpc() {
    let (fake, url) = start_fake().await;
    let out = ironguardctl(&["--controlplane", &url, "filters", "deny", "52:54:00:12:34:56", "52:54:00:12:34"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(r#"invalid MAC address "52:54:00:12:34""#), "{}", stderr(&out));
    assert!(fake.updates.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_server_rejection_prints_the_servers_message_and_exits_2() {
    let (_fake, url) = start_fake().await;
    let out = ironguardctl(&["--controlplane", &url, "filters", "allow", REFUSED_MAC]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains(&format!("MAC {REFUSED_MAC} is reserved")), "{err}");
    assert!(err.contains(&url), "{err}");
}

#[tokio::test]
async fn show_passes_the_macs_and_prints_text_or_json() {
    let (fake, url) = start_fake().await;
    let out = ironguardctl(&["--controlplane", &url, "filters", "show", "--mac", "52:54:00:12:34:56"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "revision: 42\nunknown-MAC policy: deny\nallowed MACs: 1\ndenied MACs: 0\n\
         MAC                ALLOWED BY  DENIED BY\n52:54:00:12:34:56  api         -\n"
    );
    assert_eq!(fake.state_requests.lock().unwrap()[0].macs, ["52:54:00:12:34:56"]);

    let out = ironguardctl(&["--controlplane", &url, "filters", "show", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["unknown_mac_policy"], "deny");
    assert_eq!(json["entries"][0]["allow_reasons"][0], "api");
}

#[tokio::test]
async fn agents_prints_text_or_json_and_honours_the_environment() {
    let (_fake, url) = start_fake().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ironguardctl"))
        .arg("agents")
        .env("IRONGUARD_CONTROLPLANE", &url)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("current revision: 42\ncoordination: embedded\nnetwork provisioning: leader pxe-a\nAGENT"),
        "{text}"
    );
    assert!(text.contains("pxe-a *  ctrl-1  provisioning  LEADER"), "{text}");

    let out = ironguardctl(&["agents", "--json", "--controlplane", &url]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["agents"][0]["mode"], "leader");
    assert_eq!(json["agents"][0]["last_error"], serde_json::Value::Null);
}

#[tokio::test]
async fn an_unreachable_control_plane_exits_2_naming_its_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let out = ironguardctl(&["--controlplane", &url, "agents"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.starts_with(&format!("ironguardctl: cannot reach the control plane at {url}")), "{err}");
}
