//! `ironguardctl inspect wait` (and `inspect start --wait`): ask for each node's inspection until all are finished,
//! one call fails, or time is up. The loop takes its `Get` as a function and sleeps on tokio's clock, so tests run
//! it against scripted answers with time paused.

use std::fmt::Write as _;
use std::time::Duration;

use ironguard_proto::v1::InspectionStatus;
use tokio::time::Instant;

use super::InspectionReport;
use crate::controlplane::ControlPlaneError;

/// How long to wait, and how often to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitBounds {
    pub timeout: Duration,
    pub interval: Duration,
}

/// A node whose inspection was not seen finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub node: String,
    /// Its last state seen; `None` if no answer was had for it.
    pub state: Option<String>,
}

/// How a wait ended.
#[derive(Debug)]
pub enum WaitEnd {
    /// Every inspection is finished (some may have ended in error).
    AllFinished,
    TimedOut {
        after: Duration,
        running: Vec<Running>,
    },
    /// Asking about `node` failed; the wait stopped there.
    Failed {
        node: String,
        error: ControlPlaneError,
        running: Vec<Running>,
    },
}

/// What a wait saw: the inspections that finished, in the order they did, and how it ended.
#[derive(Debug)]
pub struct WaitReport {
    pub finished: Vec<InspectionReport>,
    pub end: WaitEnd,
}

impl WaitReport {
    /// 0: all finished without error; 1: all finished, some in error; 2: time ran out or a call failed.
    pub fn exit_code(&self) -> u8 {
        match self.end {
            WaitEnd::AllFinished if self.finished.iter().any(InspectionReport::failed) => 1,
            WaitEnd::AllFinished => 0,
            WaitEnd::TimedOut { .. } | WaitEnd::Failed { .. } => 2,
        }
    }

    /// Why the wait stopped before every inspection finished, for standard error; empty when all finished.
    pub fn render_end(&self) -> String {
        let mut out = String::new();
        match &self.end {
            WaitEnd::AllFinished => {}
            WaitEnd::TimedOut { after, running } => {
                let _ = writeln!(out, "timed out after {after:?}; still running: {}", running_list(running));
            }
            WaitEnd::Failed { node, error, running } => {
                let _ = writeln!(out, "{node}: {error}");
                let _ = writeln!(out, "stopped waiting; still running: {}", running_list(running));
            }
        }
        out
    }
}

/// `node-c (waiting), node-d (state unknown)`.
fn running_list(running: &[Running]) -> String {
    let each = running.iter().map(|r| match &r.state {
        Some(state) => format!("{} ({state})", r.node),
        None => format!("{} (state unknown)", r.node),
    });
    each.collect::<Vec<_>>().join(", ")
}

/// `node-a: finished`, or `node-b: error: inspection timed out after 3600 s`: printed as each one finishes.
pub fn finished_line(report: &InspectionReport) -> String {
    match &report.error {
        Some(e) => format!("{}: {}: {e}", report.node, report.state),
        None => format!("{}: {}", report.node, report.state),
    }
}

/// Asks `get` about every node not yet finished, then again every `bounds.interval`, until all are finished (each
/// handed to `on_finished` when seen so), a call fails, or `bounds.timeout` has passed (the last round of calls is
/// at the deadline). A node named twice is waited for once.
pub async fn wait_for<G, F>(
    nodes: &[String],
    bounds: WaitBounds,
    mut get: G,
    mut on_finished: impl FnMut(&InspectionReport),
) -> WaitReport
where
    G: FnMut(String) -> F,
    F: Future<Output = Result<InspectionStatus, ControlPlaneError>>,
{
    let deadline = Instant::now() + bounds.timeout;
    let mut running: Vec<Running> = Vec::with_capacity(nodes.len());
    for node in nodes {
        if !running.iter().any(|r| &r.node == node) {
            running.push(Running { node: node.clone(), state: None });
        }
    }
    let mut finished = Vec::new();
    loop {
        let mut i = 0;
        while i < running.len() {
            match get(running[i].node.clone()).await {
                Ok(status) => {
                    let mut report = InspectionReport::from(status);
                    if report.finished {
                        // Report it under the name it was asked for (the service may answer with its UUID).
                        report.node = running.remove(i).node;
                        on_finished(&report);
                        finished.push(report);
                    } else {
                        running[i].state = Some(report.state);
                        i += 1;
                    }
                }
                Err(error) => {
                    let node = running[i].node.clone();
                    return WaitReport { finished, end: WaitEnd::Failed { node, error, running } };
                }
            }
        }
        if running.is_empty() {
            return WaitReport { finished, end: WaitEnd::AllFinished };
        }
        let now = Instant::now();
        if now >= deadline {
            return WaitReport { finished, end: WaitEnd::TimedOut { after: bounds.timeout, running } };
        }
        tokio::time::sleep_until((now + bounds.interval).min(deadline)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Each node's scripted answers to `Get`: a status, or the message of a NOT_FOUND.
    type Answers = HashMap<String, Vec<Result<InspectionStatus, String>>>;

    /// Answers `Get` from a script per node: each call takes the next answer, the last one repeats. Counts calls.
    #[derive(Debug, Clone, Default)]
    struct Script {
        answers: Arc<Mutex<Answers>>,
        calls: Arc<Mutex<Vec<(String, Instant)>>>,
    }

    impl Script {
        fn node(self, node: &str, states: &[(&str, &str)]) -> Self {
            let answers = states
                .iter()
                .map(|(state, error)| {
                    Ok(InspectionStatus {
                        node: node.into(),
                        state: (*state).into(),
                        finished: matches!(*state, "finished" | "error"),
                        error: (*error).into(),
                        ..Default::default()
                    })
                })
                .collect();
            self.answers.lock().unwrap().insert(node.into(), answers);
            self
        }

        fn unknown(self, node: &str) -> Self {
            self.answers
                .lock()
                .unwrap()
                .insert(node.into(), vec![Err(format!("node {node} has never been inspected"))]);
            self
        }

        fn get(&self) -> impl FnMut(String) -> std::future::Ready<Result<InspectionStatus, ControlPlaneError>> {
            let script = self.clone();
            move |node: String| {
                script.calls.lock().unwrap().push((node.clone(), Instant::now()));
                let mut answers = script.answers.lock().unwrap();
                let queue = answers.get_mut(&node).unwrap();
                let answer = if queue.len() > 1 { queue.remove(0) } else { queue[0].clone() };
                std::future::ready(answer.map_err(|message| ControlPlaneError::NotFound {
                    url: "http://cp:9100".into(),
                    rpc: "Get",
                    message,
                }))
            }
        }

        fn calls(&self, node: &str) -> usize {
            self.calls.lock().unwrap().iter().filter(|(n, _)| n == node).count()
        }
    }

    fn nodes(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    const BOUNDS: WaitBounds = WaitBounds { timeout: Duration::from_secs(60), interval: Duration::from_secs(1) };

    #[tokio::test(start_paused = true)]
    async fn waits_until_every_node_is_finished() {
        let script = Script::default()
            .node("node-a", &[("waiting", ""), ("processing", ""), ("finished", "")])
            .node("node-b", &[("finished", "")]);
        let started = Instant::now();
        let mut seen = Vec::new();
        let report =
            wait_for(&nodes(&["node-a", "node-b", "node-a"]), BOUNDS, script.get(), |r| seen.push(finished_line(r)))
                .await;
        assert!(matches!(report.end, WaitEnd::AllFinished), "{report:?}");
        assert_eq!(report.exit_code(), 0);
        assert_eq!(seen, ["node-b: finished", "node-a: finished"]);
        assert_eq!(report.render_end(), "");
        // node-a asked three times, one interval apart; node-b once, as it was finished the first time.
        assert_eq!((script.calls("node-a"), script.calls("node-b")), (3, 1));
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_state_makes_exit_code_1() {
        let script = Script::default()
            .node("node-a", &[("finished", "")])
            .node("node-b", &[("processing", ""), ("error", "inspection timed out after 3600 s")]);
        let mut seen = Vec::new();
        let report =
            wait_for(&nodes(&["node-a", "node-b"]), BOUNDS, script.get(), |r| seen.push(finished_line(r))).await;
        assert!(matches!(report.end, WaitEnd::AllFinished), "{report:?}");
        assert_eq!(report.exit_code(), 1);
        assert_eq!(seen, ["node-a: finished", "node-b: error: inspection timed out after 3600 s"]);
    }

    #[tokio::test(start_paused = true)]
    async fn time_up_names_the_nodes_still_running() {
        let script = Script::default()
            .node("node-a", &[("finished", "")])
            .node("node-b", &[("waiting", "")])
            .node("node-c", &[("starting", ""), ("processing", "")]);
        let bounds = WaitBounds { timeout: Duration::from_millis(2500), interval: Duration::from_secs(1) };
        let started = Instant::now();
        let report = wait_for(&nodes(&["node-a", "node-b", "node-c"]), bounds, script.get(), |_| {}).await;
        assert_eq!(report.exit_code(), 2);
        assert_eq!(started.elapsed(), Duration::from_millis(2500));
        // Asked at 0 s, 1 s, 2 s and at the deadline.
        assert_eq!(script.calls("node-b"), 4);
        assert_eq!(report.finished.len(), 1);
        assert_eq!(report.render_end(), "timed out after 2.5s; still running: node-b (waiting), node-c (processing)\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_stops_the_wait_naming_the_node() {
        let script =
            Script::default().node("node-a", &[("waiting", "")]).unknown("node-x").node("node-c", &[("finished", "")]);
        let report = wait_for(&nodes(&["node-a", "node-x", "node-c"]), BOUNDS, script.get(), |_| {}).await;
        assert_eq!(report.exit_code(), 2);
        assert_eq!(script.calls("node-c"), 0);
        assert_eq!(
            report.render_end(),
            "node-x: the control plane at http://cp:9100 found nothing for Get: node node-x has never been inspected\n\
             stopped waiting; still running: node-a (waiting), node-x (state unknown), node-c (state unknown)\n"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_node_is_reported_under_the_name_asked_for() {
        let script = Script::default().node("rack1-u12", &[("finished", "")]);
        let get = {
            let mut inner = script.get();
            move |node: String| {
                let answer = inner(node).into_inner().map(|s| InspectionStatus { node: "1be26c0b".into(), ..s });
                std::future::ready(answer)
            }
        };
        let report = wait_for(&nodes(&["rack1-u12"]), BOUNDS, get, |_| {}).await;
        assert_eq!(report.finished[0].node, "rack1-u12");
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_timeout_asks_once() {
        let script = Script::default().node("node-a", &[("waiting", "")]);
        let bounds = WaitBounds { timeout: Duration::ZERO, interval: Duration::from_secs(1) };
        let report = wait_for(&nodes(&["node-a"]), bounds, script.get(), |_| {}).await;
        assert_eq!(report.exit_code(), 2);
        assert_eq!(script.calls("node-a"), 1);
    }
}
