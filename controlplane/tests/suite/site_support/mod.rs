//! What the in-process site tests share: the control plane on loopback ports over the fake Ironic (real HTTP and
//! gRPC), with the short timings the tests need, and a stand-in leader agent that follows `WatchFilters` and
//! reports every revision it receives as applied, with the MACs a test says booted as its kernel's DHCP seen (the
//! real agent and kernel are in tests/netns).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use fake_ironic::{FakeIronic, Node};
use ironguard_controlplane::ControlPlaneConfig;
use ironguard_controlplane::inspection::engine::Engine;
use ironguard_proto::v1::inspection_client::InspectionClient;
use ironguard_proto::v1::pxe_filter_client::PxeFilterClient;
use ironguard_proto::v1::{
    AgentStatus, DhcpSeen, GetFilterStateRequest, Mode, SeenCount, WatchFiltersRequest, filter_event::Event,
};
use tonic::transport::Channel;

pub struct Site {
    /// Names the site's directory.
    pub tag: String,
    pub engine: Arc<Engine>,
    pub ironic: FakeIronic,
    pub channel: Channel,
    /// `http(s)://127.0.0.1:PORT` of the ironic-inspector v1 REST API.
    pub inspector: String,
    /// The site's own directory (the store is in `store/` under it); removed when the site is dropped.
    pub dir: PathBuf,
    /// The admin endpoint (`/metrics`, `/healthz`).
    pub admin: std::net::SocketAddr,
    /// What the stand-in leader reports.
    leader: Arc<Mutex<StandIn>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The stand-in leader's state: the revision it applied, and the MACs its "kernel" lets through (machines that
/// booted, and keep asking for DHCP: each report says they were let through just now).
#[derive(Default)]
struct StandIn {
    revision: u64,
    passed: BTreeSet<String>,
}

impl StandIn {
    fn status(&self) -> AgentStatus {
        let at = ironguard_proto::time::now_ms();
        let count = |n: u64| Some(SeenCount { count: n, last_unix_ms: at });
        AgentStatus {
            agent_id: "test-leader".into(),
            network: "n".into(),
            applied_revision: self.revision,
            mode: Mode::Leader as i32,
            dhcp_seen_observed: true,
            dhcp_seen: self
                .passed
                .iter()
                .map(|mac| DhcpSeen { mac: mac.clone(), requests: count(1), passed: count(1), answers: count(1) })
                .collect(),
            ..Default::default()
        }
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A node in `state` with an IPMI address.
pub fn node(uuid: &str, state: &str, ip: &str) -> Node {
    let mut n = Node::new(uuid);
    n.provision_state = state.into();
    n.driver_info.insert("ipmi_address".into(), serde_json::json!(ip));
    n
}

/// Starts the control plane over `ironic`: gRPC without TLS, the inspector REST API on, heartbeats every second,
/// two workers with short leases and retries, no periodic Ironic sync. `tweak` changes the configuration last and
/// gets the site's directory (created empty, unique to `tag` and this process) for files it wants to point at.
pub async fn start(tag: &str, ironic: FakeIronic, tweak: impl FnOnce(&mut ControlPlaneConfig, &Path)) -> Site {
    let dir = std::env::temp_dir().join(format!("ig-cp-site-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = ControlPlaneConfig::default();
    c.server.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
    c.grpc.insecure = true;
    c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
    c.server.inspector_listen = Some("127.0.0.1:0".parse().unwrap());
    c.server.heartbeat_secs = 1;
    c.store.data_dir = dir.join("store");
    c.ironic.url = ironic.url();
    c.ironic.retries = 3;
    c.ironic.retry_backoff_ms = 20;
    c.inspection.workers = 2;
    c.inspection.take_timeout_ms = 100;
    c.inspection.request_lease_ms = 2000;
    c.inspection.allow_timeout_secs = 5;
    c.sync.ironic_sync_secs = 0;
    c.sync.ironic_inspection = false;
    // Every post here comes from 127.0.0.1, which is on no link: the sender check (`callback_source = "link"`, the
    // default) is proven against real neighbour tables in tests/netns (`hostile_client.rs`), and its refusal of a
    // sender on no link by `inspection.rs::a_sender_on_no_link_is_refused_by_default`.
    c.inspection.callback_source = ironguard_controlplane::inspection::engine::CallbackSource::Any;
    tweak(&mut c, &dir);
    let server = ironguard_controlplane::serve(&c).await.unwrap();
    let engine = server.engine.clone();
    let admin = server.admin_addr;
    let scheme = if c.inspector_api.tls() { "https" } else { "http" };
    let inspector = format!("{scheme}://{}", server.inspector_addr.unwrap());
    let url = format!("http://{}", server.grpc_addr);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    let channel = tonic::transport::Endpoint::from_shared(url).unwrap().connect().await.unwrap();
    let leader = Arc::new(Mutex::new(StandIn::default()));
    tokio::spawn(stand_in_leader(channel.clone(), leader.clone()));
    Site { tag: tag.to_owned(), engine, ironic, channel, inspector, dir, admin, leader, stop: Some(tx) }
}

/// The leader agent's part: reports every revision it receives as applied.
async fn stand_in_leader(channel: Channel, leader: Arc<Mutex<StandIn>>) {
    let mut c = PxeFilterClient::new(channel);
    let watch = WatchFiltersRequest { agent_id: "test-leader".into(), network: "n".into(), ..Default::default() };
    let mut w = c.watch_filters(watch).await.unwrap().into_inner();
    while let Ok(Some(ev)) = w.message().await {
        let revision = match ev.event {
            Some(Event::Snapshot(s)) => s.revision,
            Some(Event::Delta(d)) => d.revision,
            Some(Event::Heartbeat(h)) => h.revision,
            Some(Event::Discovery(_)) | None => continue,
        };
        let status = {
            let mut l = leader.lock().unwrap();
            l.revision = revision;
            l.status()
        };
        let _ = c.report_status(status).await;
    }
}

impl Site {
    pub fn insp(&self) -> InspectionClient<Channel> {
        InspectionClient::new(self.channel.clone())
    }

    pub fn filters(&self) -> PxeFilterClient<Channel> {
        PxeFilterClient::new(self.channel.clone())
    }

    /// The reasons `mac` is allowed for, as the control plane reports them.
    pub async fn allow_reasons(&self, mac: &str) -> Vec<String> {
        let s = self.filters().get_filter_state(GetFilterStateRequest { macs: vec![mac.into()] }).await.unwrap();
        s.into_inner().entries.into_iter().flat_map(|e| e.allow_reasons).collect()
    }

    /// The admin endpoint's `/metrics` text.
    #[allow(dead_code)] // not every test binary that includes this module reads metrics
    pub async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(self.admin).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        buf
    }

    /// The machine with `mac` boots: the stand-in leader's kernel lets its DHCP through from now on, and says so at
    /// once (the evidence `/v1/continue` asks of a ramdisk's data).
    pub async fn boot(&self, mac: &str) {
        let status = {
            let mut l = self.leader.lock().unwrap();
            l.passed.insert(mac.to_string());
            l.status()
        };
        self.filters().report_status(status).await.unwrap();
    }

    /// The filter state's revision.
    pub async fn revision(&self) -> u64 {
        self.filters().get_filter_state(GetFilterStateRequest { macs: vec![] }).await.unwrap().into_inner().revision
    }
}
