//! The processing task: what happens to a node once its ramdisk's data arrived (and again on reapply), as
//! ironic-inspector does it:
//!
//! 1. the node as Ironic has it (one GET of the node, one of its ports), and its provision state checked;
//! 2. every hook's `before_update` ([`ironguard_inspection::processing`]), building one [`Plan`];
//! 3. the processed data stored (without `logs`), beside the unprocessed data for reapply;
//! 4. the introspection rules applied to the processed data and the node ([`rules`]), folded into the same plan
//!    ([`ironguard_inspection::outcome`]);
//! 5. the plan written to Ironic: ONE JSON-PATCH of the node, then the port creations, port patches, port
//!    deletions and traits. A failure stops there and the inspection fails with a message that says which write
//!    failed and which went through, so nothing half-written goes unreported.

use std::collections::BTreeMap;

use ironguard_dataplane::MacAddr;
use ironguard_inspection::outcome::RuleOutcome;
use ironguard_inspection::processing::{NodeView, PatchOp, Plan};
use ironguard_inspection::rules;
use ironguard_ironic::{Ironic, IronicError};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::store::RuleStore;

/// The provision states in which ironic-inspector processes data.
pub const PROCESSABLE: [&str; 5] = ["enroll", "manageable", "inspecting", "inspect wait", "inspect failed"];

/// What the store keeps of an inspection's data.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredData {
    /// What `GET /v1/introspection/{node}/data` returns: the data after the hooks, without `logs`.
    pub processed: Value,
    /// The ramdisk's data as it arrived (after `before_processing`), for reapply.
    pub unprocessed: Value,
}

impl StoredData {
    pub fn to_value(&self) -> Value {
        json!({"processed": self.processed, "unprocessed": self.unprocessed})
    }

    /// Reads what [`StoredData::to_value`] wrote (or, from an older version, the processed data alone).
    pub fn from_value(v: Value) -> Self {
        match v {
            Value::Object(mut m) if m.contains_key("processed") && m.contains_key("unprocessed") => Self {
                processed: m.remove("processed").unwrap_or(Value::Null),
                unprocessed: m.remove("unprocessed").unwrap_or(Value::Null),
            },
            other => Self { processed: other.clone(), unprocessed: other },
        }
    }
}

/// How many Ironic requests a processing made (the benchmark reports it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    pub reads: usize,
    pub writes: usize,
}

/// The stored rules, parsed (a rule that no longer parses is skipped with a warning rather than blocking every
/// inspection).
pub async fn load_rules(store: &dyn RuleStore) -> Result<Vec<rules::Rule>, String> {
    let stored = store.list().await.map_err(|e| format!("reading the introspection rules: {e}"))?;
    Ok(stored
        .into_iter()
        .filter_map(|s| match serde_json::from_value::<rules::Rule>(s.body) {
            Ok(r) => Some(r),
            Err(e) => {
                warn!(rule = %s.uuid, error = %e, "a stored rule does not parse; skipped");
                None
            }
        })
        .collect())
}

fn ops_json(ops: &[PatchOp]) -> Value {
    serde_json::to_value(ops).unwrap_or(Value::Array(vec![]))
}

/// The key in a port's `extra` that marks a port processing created without evidence that the machine owns its
/// MAC: ironguard's inspections do not allow it DHCP until an operator removes the key.
pub const UNVERIFIED: &str = "ironguard_unverified";

/// What a port marked [`UNVERIFIED`] says in Ironic.
const UNVERIFIED_NOTE: &str = "created from introspection data whose boot interface was another MAC: no DHCP from \
     this one was seen, so ironguard does not allow it in later inspections until this key is removed";

/// Which of a plan's new ports are created, and how ([`apply_plan`]).
#[derive(Debug, Default)]
pub struct PortGate {
    /// Never created, with why: a MAC the filter denies, or one another node's inspection holds.
    pub refused: BTreeMap<MacAddr, String>,
    /// The boot interface the callback's evidence tied to the node: every other new port is marked [`UNVERIFIED`].
    pub verified: Option<MacAddr>,
}

/// Writes the plan to Ironic in ironic-inspector's order. `Err` names the failed write and lists the ones done.
pub async fn apply_plan(
    ironic: &Ironic,
    node: &NodeView,
    plan: &Plan,
    outcome: &RuleOutcome,
    gate: &PortGate,
    requests: &mut Requests,
) -> Result<Vec<String>, String> {
    let mut done: Vec<String> = Vec::new();
    let fail = |what: String, e: IronicError, done: &[String]| {
        let so_far =
            if done.is_empty() { "nothing was written".to_string() } else { format!("done: {}", done.join("; ")) };
        format!("writing to Ironic failed at {what}: {e} ({so_far})")
    };
    let patch = plan.node_patch(node);
    if !patch.is_empty() {
        requests.writes += 1;
        ironic
            .patch_node_with(&node.uuid, &ops_json(&patch), outcome.reset_interfaces)
            .await
            .map_err(|e| fail("the node's properties".into(), e, &done))?;
        done.push(format!("node patched ({} ops)", patch.len()));
    }
    for p in plan.new_ports() {
        let mac = p.address.parse::<MacAddr>().ok();
        if let Some(why) = mac.and_then(|m| gate.refused.get(&m)) {
            warn!(node = %node.uuid, address = %p.address, why = %why, "a port for this MAC is not created");
            continue;
        }
        let mut extra = p.extra.clone();
        if gate.verified.is_some() && mac != gate.verified {
            extra.insert(UNVERIFIED.into(), json!(UNVERIFIED_NOTE));
        }
        let mut body = json!({
            "node_uuid": node.uuid,
            "address": p.address,
            "pxe_enabled": p.pxe_enabled,
            "extra": extra,
        });
        if !p.local_link_connection.is_empty() {
            body["local_link_connection"] = Value::Object(p.local_link_connection.clone());
        }
        if let Some(net) = &p.physical_network {
            body["physical_network"] = json!(net);
        }
        requests.writes += 1;
        match ironic.create_port_with(&body).await {
            Ok(_) => done.push(format!("port {} created", p.address)),
            // ironic-inspector skips a port that exists already (created meanwhile, or on another node).
            Err(IronicError::Http { status: 409, message, .. }) => {
                warn!(address = %p.address, message = %message, "port already exists; skipped");
            }
            Err(e) => return Err(fail(format!("creating port {}", p.address), e, &done)),
        }
    }
    for (uuid, ops) in plan.port_patches() {
        requests.writes += 1;
        match ironic.patch_port(&uuid, &ops_json(&ops)).await {
            Ok(()) => done.push(format!("port {uuid} patched")),
            // A port patch Ironic refuses as invalid (e.g. local_link_connection) is skipped, as ironic-inspector does.
            Err(IronicError::Http { status: 400, message, .. }) => {
                warn!(port = %uuid, message = %message, "Ironic refused a port change; skipped");
            }
            Err(e) => return Err(fail(format!("patching port {uuid}"), e, &done)),
        }
    }
    for uuid in plan.port_deletes() {
        requests.writes += 1;
        match ironic.delete_port(uuid).await {
            Ok(()) | Err(IronicError::NotFound { .. }) => done.push(format!("port {uuid} deleted")),
            Err(e) => return Err(fail(format!("deleting port {uuid}"), e, &done)),
        }
    }
    for t in &outcome.traits_add {
        requests.writes += 1;
        ironic.add_trait(&node.uuid, t).await.map_err(|e| fail(format!("adding trait {t}"), e, &done))?;
        done.push(format!("trait {t} added"));
    }
    for t in &outcome.traits_remove {
        requests.writes += 1;
        ironic.remove_trait(&node.uuid, t).await.map_err(|e| fail(format!("removing trait {t}"), e, &done))?;
        done.push(format!("trait {t} removed"));
    }
    debug!(writes = requests.writes, "plan written to Ironic");
    info!(node = %node.uuid, changes = done.len(), "Ironic updated from the introspection data");
    Ok(done)
}

/// The processed data as stored: without `logs` (never stored, as in ironic-inspector).
pub fn without_logs(mut data: Value) -> Value {
    if let Some(m) = data.as_object_mut() {
        m.remove("logs");
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_data_round_trips_and_reads_the_old_form() {
        let s = StoredData { processed: json!({"cpus": "4"}), unprocessed: json!({"inventory": {}}) };
        assert_eq!(StoredData::from_value(s.to_value()), s);
        let old = StoredData::from_value(json!({"inventory": {"cpu": {}}}));
        assert_eq!(old.processed, old.unprocessed);
    }

    #[test]
    fn logs_are_not_stored() {
        assert_eq!(without_logs(json!({"logs": "x", "a": 1})), json!({"a": 1}));
    }
}
