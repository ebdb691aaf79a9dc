//! `fake-ironic` — a test double of OpenStack Ironic's REST API, served over real HTTP, with injectable faults.
//! ironguard's tests and benchmarks use it where they would talk to Ironic: in-process through [`FakeIronic`], or
//! out of process through the `fake-ironic` binary and its `/_fake` admin API.
//!
//! - [`model`]: what the fake holds — [`Node`], [`Port`], armed [`Fault`]s and the [`Call`] log — in one store.
//! - [`config`]: [`FakeIronicConfig`]: microversion range, `max_limit`, optional basic-auth or token.
//! - `gate` (private): in front of every Ironic request — record the call, apply a fault, check authentication
//!   and the requested microversion, stamp the version headers.
//! - `api` and `views` (private): the emulated endpoints (`/`, `/v1`, `/v1/nodes…`, `/v1/ports…`) and how nodes
//!   and ports look on the wire, with Ironic's `fields`, `detail`, `limit`, `marker` and `next`.
//! - `node_write`, `port_write` and `traits` (private): creating and patching nodes and ports, and a node's
//!   traits, with Ironic's checks, order and messages.
//! - `patch`, `schema`, `validate` and `pyfmt` (private): what those writes share with Ironic — JSON Patch as
//!   python-jsonpatch applies it, JSON Schema errors as Python's `jsonschema` picks and words them, Ironic's
//!   argument checks, Python's `repr` of values in messages.
//! - [`admin`]: the `/_fake/...` admin API.
//! - [`error`]: [`FakeError`] for the helpers, [`error::ApiError`] for Ironic-format HTTP errors.
//! - [`client`]: a minimal HTTP/1.1 client for tests (the workspace has no HTTP client crate).
//!
//! [`FakeIronic::start`] binds (port 0 is fine), serves in a background task and returns a handle whose methods
//! inspect and change the state; [`FakeIronic::stop`] shuts it down.
#![forbid(unsafe_code)]

pub mod admin;
mod api;
pub mod client;
pub mod config;
pub mod error;
mod gate;
pub mod model;
mod node_write;
mod patch;
mod port_write;
mod pyfmt;
mod schema;
mod server;
mod traits;
mod validate;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::FakeIronicConfig;
pub use error::FakeError;
pub use model::{Call, Fault, Node, Port, mac_for_index, new_uuid, now_iso};

use server::Shared;

/// How long [`FakeIronic::stop`] lets requests in flight (a latency fault, say) finish before cutting them off.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running fake Ironic. Dropping it without [`FakeIronic::stop`] aborts the server task.
#[derive(Debug)]
pub struct FakeIronic {
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl FakeIronic {
    /// Binds `addr` (port 0 picks a free port) and serves with the default configuration.
    pub async fn start(addr: SocketAddr) -> anyhow::Result<FakeIronic> {
        FakeIronic::start_with(addr, FakeIronicConfig::default()).await
    }

    /// Binds `addr` and serves with `config`.
    pub async fn start_with(addr: SocketAddr, config: FakeIronicConfig) -> anyhow::Result<FakeIronic> {
        let listener = TcpListener::bind(addr).await.map_err(|source| FakeError::Bind { addr, source })?;
        let local_addr = listener.local_addr().context("reading the bound address")?;
        let shared = Arc::new(Shared::new(config, local_addr));
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::serve(listener, shared.clone(), async move {
            // A dropped sender stops the server too.
            let _ = stopped.await;
        }));
        tracing::debug!(%local_addr, "fake Ironic listening");
        Ok(FakeIronic { shared, shutdown: Some(shutdown), task: Some(task) })
    }

    /// The address the server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// `http://ADDR`, the Ironic endpoint (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.local_addr)
    }

    /// The configuration it serves with.
    pub fn config(&self) -> &FakeIronicConfig {
        &self.shared.config
    }

    /// Stops accepting, lets requests in flight finish (for up to 5 s), and waits for the server task.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(mut task) = self.task.take() {
            match tokio::time::timeout(STOP_GRACE, &mut task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "fake Ironic server failed"),
                Ok(Err(e)) => tracing::warn!(error = %e, "fake Ironic server task failed"),
                Err(_) => task.abort(),
            }
        }
    }

    // --- nodes ---------------------------------------------------------------------------------------------------

    /// Adds a node, or replaces the node with the same UUID. An empty UUID gets a fresh one; returns the UUID.
    pub fn add_node(&self, node: Node) -> String {
        self.shared.store().upsert_node(node)
    }

    /// The node with this UUID or name.
    pub fn node(&self, ident: &str) -> Option<Node> {
        self.shared.store().node(ident).cloned()
    }

    /// All nodes, in the order the API lists them.
    pub fn nodes(&self) -> Vec<Node> {
        self.shared.store().nodes().cloned().collect()
    }

    /// Changes a node (by UUID or name) in place.
    pub fn update_node(&self, ident: &str, change: impl FnOnce(&mut Node)) -> Result<(), FakeError> {
        change(self.shared.store().node_mut(ident)?);
        Ok(())
    }

    /// Deletes a node and its ports, as `DELETE /v1/nodes/{ident}` does.
    pub fn remove_node(&self, ident: &str) -> Result<Node, FakeError> {
        self.shared.store().delete_node(ident)
    }

    pub fn set_provision_state(&self, ident: &str, state: &str) -> Result<(), FakeError> {
        self.update_node(ident, |n| n.provision_state = state.to_owned())
    }

    pub fn set_inspect_interface(&self, ident: &str, interface: &str) -> Result<(), FakeError> {
        self.update_node(ident, |n| n.inspect_interface = interface.to_owned())
    }

    /// `false` makes `GET /v1/nodes/{ident}/validate` report the power interface invalid.
    pub fn set_power_valid(&self, ident: &str, valid: bool) -> Result<(), FakeError> {
        self.update_node(ident, |n| n.power_valid = valid)
    }

    /// "power on" or "power off"; `None` for an unknown node. Empty for a node created through the API whose
    /// power state is not known yet (Ironic shows `null`).
    pub fn power_state(&self, ident: &str) -> Option<String> {
        self.shared.store().node(ident).map(|n| n.power_state.clone())
    }

    /// The last boot device set through the API; `None` when never set or for an unknown node.
    pub fn boot_device(&self, ident: &str) -> Option<String> {
        self.shared.store().node(ident).and_then(|n| n.boot_device.clone())
    }

    /// The node's traits (sorted when set through the API); `None` for an unknown node.
    pub fn traits(&self, ident: &str) -> Option<Vec<String>> {
        self.shared.store().node(ident).map(|n| n.traits.clone())
    }

    /// Gives the node a trait, as `PUT /v1/nodes/{ident}/traits/{trait}` does but without checking the name.
    pub fn add_trait(&self, ident: &str, name: &str) -> Result<(), FakeError> {
        self.update_node(ident, |n| {
            if let Err(at) = n.traits.binary_search_by(|t| t.as_str().cmp(name)) {
                n.traits.insert(at, name.to_owned());
            }
        })
    }

    // --- ports ---------------------------------------------------------------------------------------------------

    /// Adds a port (address lowercased; an empty UUID gets a fresh one). Refuses a duplicate address or UUID, an
    /// invalid MAC and an unknown node, as Ironic does.
    pub fn add_port(&self, port: Port) -> Result<Port, FakeError> {
        self.shared.store().add_port(port)
    }

    /// All ports, in the order the API lists them.
    pub fn ports(&self) -> Vec<Port> {
        self.shared.store().ports().cloned().collect()
    }

    /// The port with this UUID.
    pub fn port(&self, uuid: &str) -> Option<Port> {
        self.shared.store().port(uuid).cloned()
    }

    /// The ports of the node with this UUID or name, in the order the API lists them (none for an unknown node).
    pub fn ports_of(&self, node: &str) -> Vec<Port> {
        let store = self.shared.store();
        let Some(uuid) = store.node(node).map(|n| n.uuid.clone()) else { return Vec::new() };
        store.ports().filter(|p| p.node_uuid == uuid).cloned().collect()
    }

    /// Changes a port in place; refuses (and does not apply) a change to an address another port has, an invalid
    /// MAC or an unknown node. Returns the port as stored.
    pub fn update_port(&self, uuid: &str, change: impl FnOnce(&mut Port)) -> Result<Port, FakeError> {
        let mut store = self.shared.store();
        let mut port = store.port(uuid).cloned().ok_or_else(|| FakeError::PortNotFound(uuid.to_owned()))?;
        change(&mut port);
        port.uuid = uuid.to_owned();
        store.update_port(port)
    }

    pub fn remove_port(&self, uuid: &str) -> Result<Port, FakeError> {
        self.shared.store().delete_port(uuid)
    }

    /// Creates `nodes` nodes in `provision_state`, each with `ports_per_node` ports with unique unicast MACs
    /// `52:54:xx:xx:xx:xx` (from [`mac_for_index`]); returns their UUIDs in creation order.
    pub fn populate(&self, nodes: usize, ports_per_node: usize, provision_state: &str) -> Vec<String> {
        self.shared.store().populate(nodes, ports_per_node, provision_state)
    }

    // --- calls and faults ----------------------------------------------------------------------------------------

    /// Every Ironic API request since the last [`FakeIronic::clear_calls`], in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.store().calls()
    }

    pub fn clear_calls(&self) {
        self.shared.store().clear_calls();
    }

    /// Arms a fault; a request matching several gets the first one not exhausted.
    pub fn inject(&self, fault: Fault) {
        self.shared.store().inject(fault);
    }

    pub fn clear_faults(&self) {
        self.shared.store().clear_faults();
    }
}

impl Drop for FakeIronic {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
