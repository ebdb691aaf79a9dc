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
