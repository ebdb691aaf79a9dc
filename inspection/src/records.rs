//! What is stored about inspections: one record per node, the data a ramdisk sent, and the work queue.

use ironguard_dataplane::MacAddr;
use serde::{Deserialize, Serialize};

use crate::machine::{Event, State};

/// The inspection state of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Ironic node UUID.
    pub uuid: String,
    pub state: State,
    /// Incremented on every save (compare-and-swap).
    pub version: u64,
    pub started_at: Option<u64>,
    pub finished_at: Option<u64>,
    pub error: Option<String>,
    /// Set PXE boot and power the node on (and off at the end) — false when something else boots it.
    pub manage_boot: bool,
    /// The node's port MACs allowed during this inspection.
    pub macs: Vec<MacAddr>,
    /// BMC addresses, for looking the node up when a ramdisk posts data.
    pub bmc_addresses: Vec<String>,
    /// The request whose strict transition was saved last: meeting it again is the déjà vu.
    pub strict_request: Option<u64>,
    pub updated_at: u64,
}

impl NodeRecord {
    /// A node never inspected (`finished`), the record written at `now_ms` (milliseconds since the Unix epoch).
    pub fn new(uuid: &str, now_ms: u64) -> Self {
        Self {
            uuid: uuid.to_string(),
            state: State::Finished,
            version: 0,
            started_at: None,
            finished_at: None,
            error: None,
            manage_boot: true,
            macs: vec![],
            bmc_addresses: vec![],
            strict_request: None,
            updated_at: now_ms,
        }
    }
}

/// A node's inspection as an operator sees it, from its record and the requests not consumed yet: `starting` while
/// a start waits for a worker (ironic-inspector answers `starting` right after its 202), instead of "never
/// inspected" or the end of the previous inspection. A record in progress, or written after the start was queued
/// (the worker's own answer to it, an error say), is shown as it is. `None`: never inspected, and no start waiting.
pub fn as_seen(rec: Option<NodeRecord>, node: &str, pending: &[Request]) -> Option<NodeRecord> {
    if rec.as_ref().is_some_and(|r| !matches!(r.state, State::Finished | State::Error)) {
        return rec;
    }
    let queued = pending.iter().rev().find(|r| r.node == node && r.kind == Kind::Start);
    match (rec, queued) {
        (rec, None) => rec,
        (Some(r), Some(q)) if r.updated_at > q.enqueued_at => Some(r),
        (rec, Some(q)) => {
            let mut r = rec.unwrap_or_else(|| NodeRecord::new(node, q.enqueued_at));
            r.state = State::Starting;
            r.started_at = Some(q.enqueued_at);
            r.finished_at = None;
            r.error = None;
            r.manage_boot = q.args.get("manage_boot").and_then(serde_json::Value::as_bool).unwrap_or(true);
            Some(r)
        }
    }
}

/// What a queued request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Begin (or restart) an inspection: event `start`, then `wait` after the task.
    Start,
    /// The ramdisk's data arrived: event `process`, then `finish`.
    Process,
    /// Event `abort`, then `abort_end`.
    Abort,
    /// Re-run processing on stored data: event `reapply`, then `finish`.
    Reapply,
    /// The inspection took too long: event `timeout`.
    Timeout,
    /// The node is gone from Ironic: remove it.
    Delete,
}

impl Kind {
    /// The event applied before the task (None: not a state transition).
    pub fn event(self) -> Option<Event> {
        match self {
            Kind::Start => Some(Event::Start),
            Kind::Process => Some(Event::Process),
            Kind::Abort => Some(Event::Abort),
            Kind::Reapply => Some(Event::Reapply),
            Kind::Timeout => Some(Event::Timeout),
            Kind::Delete => None,
        }
    }

    /// The event applied after a successful task.
    pub fn completion(self) -> Option<Event> {
        match self {
            Kind::Start => Some(Event::Wait),
            Kind::Process | Kind::Reapply => Some(Event::Finish),
            Kind::Abort => Some(Event::AbortEnd),
            Kind::Timeout | Kind::Delete => None,
        }
    }
}

/// A transition request in the work queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub node: String,
    pub kind: Kind,
    /// Task arguments: `manage_boot` for start, the ramdisk data for process.
    #[serde(default)]
    pub args: serde_json::Value,
    pub enqueued_at: u64,
}

/// A request taken by a worker, until it is consumed or its lease expires (then it is delivered again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taken {
    pub request: Request,
    /// How many times it has been taken (1 = first delivery).
    pub attempt: u32,
    pub worker: String,
    pub lease_until: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(node: &str, at: u64, manage_boot: bool) -> Request {
        Request {
            id: at,
            node: node.into(),
            kind: Kind::Start,
            args: serde_json::json!({"manage_boot": manage_boot}),
            enqueued_at: at,
        }
    }

    fn rec(state: State, updated_at: u64) -> NodeRecord {
        let mut r = NodeRecord::new("n1", updated_at);
        r.state = state;
        r.error = (state == State::Error).then(|| "boom".to_string());
        r.finished_at = Some(updated_at);
        r
    }

    #[test]
    fn a_queued_start_reads_as_starting() {
        // never inspected, nothing queued: nothing to show
        assert_eq!(as_seen(None, "n1", &[]), None);
        // another node's start says nothing of n1
        assert_eq!(as_seen(None, "n1", &[start("n2", 10, true)]), None);
        // never inspected, its start queued: starting, since the start was queued
        let r = as_seen(None, "n1", &[start("n1", 10, false)]).unwrap();
        assert_eq!((r.state, r.started_at, r.manage_boot, r.version), (State::Starting, Some(10), false, 0));
        // the end of an earlier inspection, then a start: starting, the earlier error and end cleared
        let r = as_seen(Some(rec(State::Error, 5)), "n1", &[start("n1", 10, true)]).unwrap();
        assert_eq!((r.state, r.error, r.finished_at), (State::Starting, None, None));
        // a process request is not a start
        let process = Request { kind: Kind::Process, ..start("n1", 10, true) };
        assert_eq!(as_seen(Some(rec(State::Finished, 5)), "n1", &[process]).unwrap().state, State::Finished);
    }

    #[test]
    fn the_record_wins_once_the_worker_wrote_it() {
        // the worker took the start and failed it: its error is shown, not the queued start
        let r = as_seen(Some(rec(State::Error, 20)), "n1", &[start("n1", 10, true)]).unwrap();
        assert_eq!((r.state, r.error.as_deref()), (State::Error, Some("boom")));
        // an inspection in progress is shown as it is, whatever waits behind it
        for s in [State::Starting, State::Waiting, State::Processing, State::Aborting] {
            assert_eq!(as_seen(Some(rec(s, 5)), "n1", &[start("n1", 10, true)]).unwrap().state, s);
        }
    }
}
