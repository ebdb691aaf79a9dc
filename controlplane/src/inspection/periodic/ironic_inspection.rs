//! `ironic-inspection`: Ironic's own in-band inspection (Ironic 39 inspects nodes itself and relies on a PXE
//! filter when it does not manage the boot). The ports of nodes in `inspect wait` or `inspecting` whose inspect
//! interface is one of `[sync] ironic_inspect_interfaces` (and, unless configured otherwise, not in maintenance)
//! are allowed with reason `ironic-inspection`, and lose it once the node leaves those states.
//!
//! Ironic's list filter is not trusted alone: every node is re-checked here (the client re-checks the provision
//! state; this task the inspect interface and maintenance). With `while-inspecting`, this task also publishes the
//! effective unknown-MAC policy; when Ironic cannot be asked, only ironguard's own inspections count (closed).
//!
//! What each poll asks Ironic: the nodes in those states (one list per state), every period. A node's ports are
//! read when it starts being inspected and again once `[sync] ironic_inspection_ports_secs` has passed, not at
//! every poll: with thirty nodes in `inspect wait` a poll every 300 ms was a hundred port lists a second. A node
//! that leaves the inspected states loses its allows at the next poll, whatever its ports' age; one that comes back
//! has its ports read again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ironguard_dataplane::{MacAddr, UnknownMacPolicy};
use ironguard_inspection::machine::State;
use ironguard_ironic::{Ironic, Node};
use tracing::{debug, error, info, warn};

use super::mirror::ReasonMirror;
use super::{IRONIC_INSPECTION, PolicySetting, SyncConfig, Task};
use crate::filter::Side;
use crate::inspection::engine::Engine;
use crate::store::Fence;

/// The provision states of a node Ironic is inspecting in band.
const INSPECTING: [&str; 2] = ["inspect wait", "inspecting"];

#[derive(Debug)]
pub(super) struct IronicInspections {
    engine: Arc<Engine>,
    ironic: Arc<Ironic>,
    sync: SyncConfig,
    policy: PolicySetting,
    allow: ReasonMirror,
    /// When Ironic last answered the poll (the task's creation before the first answer).
    answered: Mutex<Instant>,
    /// The allowable MACs of each node being inspected, and when its ports were read.
    ports: Mutex<HashMap<String, NodePorts>>,
}

#[derive(Debug)]
struct NodePorts {
    read: Instant,
    macs: BTreeSet<MacAddr>,
}

impl IronicInspections {
    pub(super) fn new(engine: Arc<Engine>, ironic: Arc<Ironic>, sync: SyncConfig, policy: PolicySetting) -> Self {
        let allow = ReasonMirror::new(Side::Allow, IRONIC_INSPECTION);
        Self { engine, ironic, sync, policy, allow, answered: Mutex::new(Instant::now()), ports: Mutex::default() }
    }

    /// Whether a listed node is one whose ports this task allows.
    fn counts(&self, n: &Node) -> bool {
        let state_ok = n.provision_state.as_deref().is_some_and(|s| INSPECTING.contains(&s));
        let interface_ok =
            n.inspect_interface.as_deref().is_some_and(|i| self.sync.ironic_inspect_interfaces.iter().any(|x| x == i));
        let maintenance_ok = self.sync.ironic_inspection_maintenance || n.maintenance != Some(true);
        if state_ok && interface_ok && !maintenance_ok {
            debug!(node = %n.uuid, "Ironic inspects a node in maintenance: no DHCP for it");
        }
        state_ok && interface_ok && maintenance_ok
    }

    /// The nodes Ironic is inspecting now, re-checked.
    async fn inspected_nodes(&self) -> anyhow::Result<Vec<Node>> {
        let nodes = self.ironic.list_nodes(&INSPECTING, "uuid,provision_state,inspect_interface,maintenance").await?;
        Ok(nodes.into_iter().filter(|n| self.counts(n)).collect())
    }

    async fn allow_ports(&self, nodes: &[Node], fence: &Fence) -> anyhow::Result<()> {
        let refresh = Duration::from_secs(self.sync.ironic_inspection_ports_secs);
        let due: Vec<&str> = {
            let mut cached = self.ports.lock().unwrap_or_else(|e| e.into_inner());
            cached.retain(|uuid, _| nodes.iter().any(|n| &n.uuid == uuid));
            nodes
                .iter()
                .filter(|n| cached.get(&n.uuid).is_none_or(|c| c.read.elapsed() >= refresh))
                .map(|n| n.uuid.as_str())
                .collect()
        };
        for uuid in due {
            let read = Instant::now();
            let macs = self.node_macs(uuid).await?;
            self.ports.lock().unwrap_or_else(|e| e.into_inner()).insert(uuid.to_string(), NodePorts { read, macs });
        }
        let macs: BTreeSet<MacAddr> = {
            let cached = self.ports.lock().unwrap_or_else(|e| e.into_inner());
            nodes.iter().filter_map(|n| cached.get(&n.uuid)).flat_map(|c| c.macs.iter().copied()).collect()
        };
        let synced = self.allow.sync(&self.engine, macs, None, fence).await?;
        if synced.changed > 0 {
            info!(
                nodes = nodes.len(),
                changed = synced.changed,
                revision = synced.revision,
                "Ironic's own inspections: allow set updated"
            );
        }
        Ok(())
    }

    /// The MACs of `uuid`'s ports that may be allowed: every port but those ironguard's processing created without
    /// evidence that the machine owns them.
    async fn node_macs(&self, uuid: &str) -> anyhow::Result<BTreeSet<MacAddr>> {
        let mut macs = BTreeSet::new();
        for p in self.ironic.list_ports_detail(uuid).await? {
            let address = p["address"].as_str().unwrap_or_default();
            match address.parse::<MacAddr>() {
                Ok(m) if p["extra"].get(crate::inspection::process::UNVERIFIED).is_some() => {
                    debug!(node = %uuid, address = %m, "unverified port (extra.ironguard_unverified): not allowed");
                }
                Ok(m) => {
                    macs.insert(m);
                }
                Err(e) => warn!(node = %uuid, address = %address, "port address ironguard cannot use: {e}"),
            }
        }
        Ok(macs)
    }

    /// Ironic did not answer: once that has lasted `ironic_inspection_unreachable_secs`, the allows go.
    async fn expire_allows(&self, fence: &Fence) -> anyhow::Result<()> {
        let bound = Duration::from_secs(self.sync.ironic_inspection_unreachable_secs);
        let silent = self.answered.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
        if bound.is_zero() || silent < bound {
            return Ok(());
        }
        let synced = self.allow.sync(&self.engine, BTreeSet::new(), None, fence).await?;
        if synced.changed > 0 {
            error!(
                dropped = synced.changed,
                silent_secs = silent.as_secs(),
                bound_secs = bound.as_secs(),
                revision = synced.revision,
                "Ironic has not answered for longer than [sync] ironic_inspection_unreachable_secs: the allows of the \
                 nodes it was inspecting are dropped (no DHCP for them) until it answers again; check [ironic] url, \
                 credentials and Ironic itself"
            );
        }
        Ok(())
    }

    /// `while-inspecting`: unknown MACs are allowed while any inspection runs (or with auto-discovery).
    async fn publish_policy(&self, ironic_inspects: bool, fence: &Fence) -> anyhow::Result<()> {
        let ours = self
            .engine
            .store
            .list()
            .await?
            .iter()
            .any(|r| matches!(r.state, State::Starting | State::Waiting | State::Processing));
        let effective = if ours || ironic_inspects || self.sync.auto_discovery {
            UnknownMacPolicy::Allow
        } else {
            UnknownMacPolicy::Deny
        };
        self.engine.filters.apply_fenced(vec![], Some(effective), fence).await?;
        Ok(())
    }
}

#[async_trait]
impl Task for IronicInspections {
    async fn run(&self, fence: &Fence) -> anyhow::Result<()> {
        let listed = self.inspected_nodes().await;
        let mut result = Ok(());
        if listed.is_ok() {
            *self.answered.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
        if self.sync.ironic_inspection {
            match &listed {
                Ok(nodes) => result = self.allow_ports(nodes, fence).await,
                Err(_) => result = self.expire_allows(fence).await,
            }
        }
        if self.policy == PolicySetting::WhileInspecting {
            // Ironic unreachable: only what ironguard knows counts, so unknown MACs are not left open on a guess.
            let ironic_inspects = listed.as_ref().is_ok_and(|n| !n.is_empty());
            self.publish_policy(ironic_inspects, fence).await?;
        }
        listed?;
        result
    }
}
