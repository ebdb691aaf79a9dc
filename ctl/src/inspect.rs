//! `ironguardctl inspect`: what it sends to the control plane's `Inspection` service and how the answers read, as
//! text or JSON. Waiting for inspections to finish is [`wait`].

pub mod wait;

use std::fmt::{self, Write as _};
use std::io::Read as _;
use std::path::Path;

use ironguard_proto::v1::{
    ContinueResponse, InspectionStatus, ListQuarantinedResponse, ListResponse, QuarantinedRequest, StartResponse,
};
use serde::{Serialize, Serializer};

use crate::table::Table;

/// A time from the `Inspection` service (milliseconds since the Unix epoch), shown as RFC 3339 in UTC with
/// milliseconds: `2023-11-14T22:13:20.123Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(u64);

impl Timestamp {
    /// `None` for 0, which the service sends for "not yet".
    pub fn from_ms(ms: u64) -> Option<Self> {
        (ms != 0).then_some(Self(ms))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = ironguard_proto::time::utc_fields(self.0);
        let (year, month, day, hour, minute, second) = (t.year, t.month, t.day, t.hour, t.minute, t.second);
        write!(f, "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{:03}Z", t.millis)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One node's inspection: the JSON document of `inspect status --json`, and a row of `inspect list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InspectionReport {
    pub node: String,
    /// starting, waiting, processing, finished, error, reapplying, aborting or enrolling.
    pub state: String,
    /// In `finished` or `error`: nothing more will happen until a new request.
    pub finished: bool,
    /// `None` when the inspection has not failed.
    pub error: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub updated_at: Option<Timestamp>,
    pub macs: Vec<String>,
    /// The control plane sets PXE boot and powers the node on and off.
    pub manage_boot: bool,
}

impl From<InspectionStatus> for InspectionReport {
    fn from(status: InspectionStatus) -> Self {
        Self {
            // `finished` is what the service says; the state names agree with it, in case an older one does not.
            finished: status.finished || is_final_state(&status.state),
            node: status.node,
            state: status.state,
            error: Some(status.error).filter(|e| !e.is_empty()),
            started_at: Timestamp::from_ms(status.started_at_ms),
            finished_at: Timestamp::from_ms(status.finished_at_ms),
            updated_at: Timestamp::from_ms(status.updated_at_ms),
            macs: status.macs,
            manage_boot: status.manage_boot,
        }
    }
}

/// `finished` and `error` end an inspection; every other state is on the way to one of them.
fn is_final_state(state: &str) -> bool {
    matches!(state, "finished" | "error")
}

impl InspectionReport {
    /// Finished, and badly: in state `error`, or carrying an error message.
    pub fn failed(&self) -> bool {
        self.finished && (self.state == "error" || self.error.is_some())
    }

    /// `inspect status`: one `key: value` line per field; the error line only when there is one.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "node: {}", self.node);
        let _ = writeln!(out, "state: {}", self.state);
        let _ = writeln!(out, "finished: {}", yes_no(self.finished));
        if let Some(e) = &self.error {
            let _ = writeln!(out, "error: {e}");
        }
        let _ = writeln!(out, "started at: {}", or_dash(self.started_at));
        let _ = writeln!(out, "finished at: {}", or_dash(self.finished_at));
        let _ = writeln!(out, "updated at: {}", or_dash(self.updated_at));
        let macs = if self.macs.is_empty() { "-".to_string() } else { self.macs.join(", ") };
        let _ = writeln!(out, "MACs: {macs}");
        let _ = writeln!(out, "manage boot: {}", yes_no(self.manage_boot));
        out
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn or_dash(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "-".to_string(), |t| t.to_string())
}

/// The JSON document printed by `inspect list --json`: the inspections of one page, or of every page (`--all`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ListReport {
    pub inspections: Vec<InspectionReport>,
    /// Where the next page starts; `None` after the last page.
    pub next_page_token: Option<String>,
    /// Queued requests in quarantine (`inspect quarantine` lists them), as of the last page.
    pub quarantined: u64,
}

impl ListReport {
    /// Adds `page` (the answer to a `List` whose token was the previous page's), keeping its next token.
    pub fn add_page(&mut self, page: ListResponse) {
        self.inspections.extend(page.inspections.into_iter().map(InspectionReport::from));
        self.next_page_token = Some(page.next_page_token).filter(|t| !t.is_empty());
        self.quarantined = page.quarantined;
    }

    /// A table of the inspections, then `more: --page-token TOKEN` if the list goes on, then a line naming the
    /// quarantined requests if there are any.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.inspections.is_empty() {
            out.push_str("no inspection\n");
        } else {
            let mut table = Table::new(&["NODE", "STATE", "ERROR", "STARTED", "FINISHED"]);
            for i in &self.inspections {
                table.row(vec![
                    i.node.clone(),
                    i.state.clone(),
                    i.error.clone().unwrap_or_else(|| "-".to_string()),
                    or_dash(i.started_at),
                    or_dash(i.finished_at),
                ]);
            }
            out.push_str(&table.render());
        }
        if let Some(token) = &self.next_page_token {
            let _ = writeln!(out, "more: --page-token {token}");
        }
        if self.quarantined > 0 {
            let _ = writeln!(
                out,
                "quarantined: {} queued request(s) could not be read and were set aside; see `ironguardctl inspect \
                 quarantine`",
                self.quarantined
            );
        }
        out
    }
}

/// One queued request in quarantine: a row of `inspect quarantine`, an item of its JSON document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuarantinedReport {
    /// The request id (what `--drop` takes).
    pub id: u64,
    /// `None` when the request's node could not be read.
    pub node: Option<String>,
    /// Where it was found (an etcd key, or `inspection_queue/<id>` in the embedded store).
    pub key: String,
    pub error: String,
    pub quarantined_at: Option<Timestamp>,
    /// Its bytes as text, cut after 4096 characters.
    pub raw: String,
    /// The length of the whole text, in bytes.
    pub raw_bytes: u64,
}

impl From<QuarantinedRequest> for QuarantinedReport {
    fn from(q: QuarantinedRequest) -> Self {
        Self {
            id: q.id,
            node: Some(q.node).filter(|n| !n.is_empty()),
            key: q.key,
            error: q.error,
            quarantined_at: Timestamp::from_ms(q.quarantined_at_ms),
            raw: q.raw,
            raw_bytes: q.raw_bytes,
        }
    }
}

/// The JSON document printed by `inspect quarantine --json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QuarantineReport {
    /// Oldest first.
    pub quarantined: Vec<QuarantinedReport>,
}

impl From<ListQuarantinedResponse> for QuarantineReport {
    fn from(answer: ListQuarantinedResponse) -> Self {
        Self { quarantined: answer.requests.into_iter().map(QuarantinedReport::from).collect() }
    }
}

impl QuarantineReport {
    /// A table (the bytes are in `--json` only), then what to do.
    pub fn render(&self) -> String {
        if self.quarantined.is_empty() {
            return "no quarantined request\n".to_string();
        }
        let mut table = Table::new(&["ID", "NODE", "QUARANTINED", "ERROR", "KEY"]);
        for q in &self.quarantined {
            table.row(vec![
                q.id.to_string(),
                q.node.clone().unwrap_or_else(|| "-".to_string()),
                or_dash(q.quarantined_at),
                q.error.replace('\n', " "),
                q.key.clone(),
            ]);
        }
        let mut out = table.render();
        out.push_str(
            "what to do: read the bytes with --json, start the node's inspection again if it still needs one \
             (ironguardctl inspect start NODE), then forget the record: ironguardctl inspect quarantine --drop ID\n",
        );
        out
    }
}

/// `request ID: quarantine record dropped`.
pub fn dropped_line(id: u64) -> String {
    format!("request {id}: quarantine record dropped")
}

/// `NODE: inspection started (request N)` for the node as it was named; when the control plane names it otherwise
/// (a name resolved to its UUID), that name follows the request id.
pub fn started_line(node: &str, answer: &StartResponse) -> String {
    if answer.node.is_empty() || answer.node == node {
        format!("{node}: inspection started (request {})", answer.request_id)
    } else {
        format!("{node}: inspection started (request {}, node {})", answer.request_id, answer.node)
    }
}

/// What `inspect abort` and `inspect reapply` ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAction {
    Abort,
    Reapply,
}

impl fmt::Display for NodeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Abort => "abort",
            Self::Reapply => "reapply",
        })
    }
}

/// `NODE: abort requested (request N)`.
pub fn accepted_line(node: &str, action: NodeAction, request_id: u64) -> String {
    format!("{node}: {action} requested (request {request_id})")
}

/// `introspection data accepted for node NODE`, the node the control plane matched the data to.
pub fn continued_line(answer: &ContinueResponse) -> String {
    format!("introspection data accepted for node {}", answer.node)
}

/// The stored introspection data, indented, ending with a newline.
pub fn pretty_data(data_json: &str) -> Result<String, serde_json::Error> {
    let value: serde_json::Value = serde_json::from_str(data_json)?;
    Ok(serde_json::to_string_pretty(&value)? + "\n")
}

/// Why the document of `inspect continue --file` was not sent.
#[derive(Debug, thiserror::Error)]
pub enum DataFileError {
    #[error("cannot read {origin}")]
    Read {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin} is not JSON")]
    NotJson {
        origin: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{origin} holds a JSON {kind}, not the JSON object of ironic-python-agent's introspection data")]
    NotAnObject { origin: String, kind: &'static str },
}

/// The text of `file` (`-`: standard input), once it is known to be a JSON object. Sent as it was read.
pub fn read_introspection_data(file: &Path) -> Result<String, DataFileError> {
    let (origin, read) = if file == Path::new("-") {
        let mut text = String::new();
        ("standard input".to_string(), std::io::stdin().read_to_string(&mut text).map(|_| text))
    } else {
        (file.display().to_string(), std::fs::read_to_string(file))
    };
    let text = read.map_err(|source| DataFileError::Read { origin: origin.clone(), source })?;
    check_introspection_data(&origin, &text)?;
    Ok(text)
}

/// `text` must be a JSON object; `origin` names where it came from, for the error.
pub fn check_introspection_data(origin: &str, text: &str) -> Result<(), DataFileError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|source| DataFileError::NotJson { origin: origin.to_string(), source })?;
    let kind = match value {
        serde_json::Value::Object(_) => return Ok(()),
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
    };
    Err(DataFileError::NotAnObject { origin: origin.to_string(), kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2023-11-14T22:13:20.123Z
    const T1: u64 = 1_700_000_000_123;
    /// 2023-11-14T22:20:00.000Z
    const T2: u64 = 1_700_000_400_000;

    fn status(node: &str, state: &str, error: &str) -> InspectionStatus {
        InspectionStatus {
            node: node.into(),
            state: state.into(),
            finished: is_final_state(state),
            error: error.into(),
            started_at_ms: T1,
            finished_at_ms: if is_final_state(state) { T2 } else { 0 },
            macs: vec!["52:54:00:12:34:56".into(), "52:54:00:ab:cd:ef".into()],
            manage_boot: true,
            updated_at_ms: T2,
        }
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(Timestamp::from_ms(0), None);
        let t = |ms| Timestamp::from_ms(ms).unwrap().to_string();
        assert_eq!(t(1), "1970-01-01T00:00:00.001Z");
        assert_eq!(t(T1), "2023-11-14T22:13:20.123Z");
        assert_eq!(t(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(t(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(t(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(t(1_704_067_199_000), "2023-12-31T23:59:59.000Z");
        assert_eq!(t(253_402_300_799_000), "9999-12-31T23:59:59.000Z");
    }

    #[test]
    fn status_renders_every_field() {
        let report = InspectionReport::from(status("node-a", "finished", ""));
        assert_eq!(
            report.render(),
            "node: node-a\n\
             state: finished\n\
             finished: yes\n\
             started at: 2023-11-14T22:13:20.123Z\n\
             finished at: 2023-11-14T22:20:00.000Z\n\
             updated at: 2023-11-14T22:20:00.000Z\n\
             MACs: 52:54:00:12:34:56, 52:54:00:ab:cd:ef\n\
             manage boot: yes\n"
        );
        assert!(!report.failed());
    }

    #[test]
    fn status_shows_the_error_and_dashes_for_what_is_unset() {
        let report = InspectionReport::from(InspectionStatus {
            node: "node-b".into(),
            state: "error".into(),
            finished: true,
            error: "inspection timed out after 3600 s".into(),
            ..Default::default()
        });
        assert_eq!(
            report.render(),
            "node: node-b\n\
             state: error\n\
             finished: yes\n\
             error: inspection timed out after 3600 s\n\
             started at: -\n\
             finished at: -\n\
             updated at: -\n\
             MACs: -\n\
             manage boot: no\n"
        );
        assert!(report.failed());
    }

    #[test]
    fn status_json_has_rfc3339_times_and_null_for_unset() {
        let json = serde_json::to_value(InspectionReport::from(status("node-c", "waiting", ""))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "node": "node-c",
                "state": "waiting",
                "finished": false,
                "error": null,
                "started_at": "2023-11-14T22:13:20.123Z",
                "finished_at": null,
                "updated_at": "2023-11-14T22:20:00.000Z",
                "macs": ["52:54:00:12:34:56", "52:54:00:ab:cd:ef"],
                "manage_boot": true
            })
        );
    }

    #[test]
    fn a_final_state_is_finished_even_without_the_flag() {
        let report =
            InspectionReport::from(InspectionStatus { state: "error".into(), finished: false, ..Default::default() });
        assert!(report.finished && report.failed());
        let report = InspectionReport::from(InspectionStatus { state: "processing".into(), ..Default::default() });
        assert!(!report.finished && !report.failed());
    }

    #[test]
    fn list_renders_a_table_and_the_next_token() {
        let mut report = ListReport::default();
        report.add_page(ListResponse {
            inspections: vec![
                status("node-a", "finished", ""),
                status("node-b", "error", "inspection aborted"),
                status("node-c", "waiting", ""),
            ],
            next_page_token: "node-c".into(),
            quarantined: 0,
        });
        assert_eq!(
            report.render(),
            "NODE    STATE     ERROR               STARTED                   FINISHED\n\
             node-a  finished  -                   2023-11-14T22:13:20.123Z  2023-11-14T22:20:00.000Z\n\
             node-b  error     inspection aborted  2023-11-14T22:13:20.123Z  2023-11-14T22:20:00.000Z\n\
             node-c  waiting   -                   2023-11-14T22:13:20.123Z  -\n\
             more: --page-token node-c\n"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["next_page_token"], "node-c");
        assert_eq!(json["inspections"][1]["error"], "inspection aborted");
        assert_eq!(json["inspections"][2]["finished_at"], serde_json::Value::Null);

        // The last page clears the token.
        report.add_page(ListResponse { inspections: vec![status("node-d", "starting", "")], ..Default::default() });
        assert_eq!(report.inspections.len(), 4);
        assert_eq!(report.next_page_token, None);
        assert!(!report.render().contains("more:"));
        assert_eq!(serde_json::to_value(&report).unwrap()["next_page_token"], serde_json::Value::Null);
    }

    #[test]
    fn an_empty_list_says_so() {
        assert_eq!(ListReport::default().render(), "no inspection\n");
    }

    #[test]
    fn list_names_the_quarantined_requests_when_there_are_some() {
        let mut report = ListReport::default();
        report.add_page(ListResponse { inspections: vec![status("node-a", "waiting", "")], ..Default::default() });
        assert!(!report.render().contains("quarantine"), "{}", report.render());
        report.add_page(ListResponse { quarantined: 2, ..Default::default() });
        assert!(
            report.render().ends_with(
                "quarantined: 2 queued request(s) could not be read and were set aside; see `ironguardctl inspect \
                 quarantine`\n"
            ),
            "{}",
            report.render()
        );
        assert_eq!(serde_json::to_value(&report).unwrap()["quarantined"], 2);
    }

    #[test]
    fn quarantine_renders_a_table_without_the_bytes_and_json_with_them() {
        let report = QuarantineReport::from(ListQuarantinedResponse {
            requests: vec![
                QuarantinedRequest {
                    id: 42,
                    node: "node-a".into(),
                    key: "/ig/inspect/queue/00000000000000000042".into(),
                    error: "its arguments: EOF while parsing".into(),
                    quarantined_at_ms: T1,
                    raw: "{\"x\":".into(),
                    raw_bytes: 5,
                },
                QuarantinedRequest {
                    id: 7,
                    key: "inspection_queue/7".into(),
                    error: "expected value\nat line 1".into(),
                    raw: "garbage".into(),
                    raw_bytes: 7,
                    ..Default::default()
                },
            ],
        });
        assert_eq!(
            report.render(),
            "ID  NODE    QUARANTINED               ERROR                             KEY\n\
             42  node-a  2023-11-14T22:13:20.123Z  its arguments: EOF while parsing  /ig/inspect/queue/00000000000000000042\n\
             7   -       -                         expected value at line 1          inspection_queue/7\n\
             what to do: read the bytes with --json, start the node's inspection again if it still needs one \
             (ironguardctl inspect start NODE), then forget the record: ironguardctl inspect quarantine --drop ID\n"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["quarantined"][0]["quarantined_at"], "2023-11-14T22:13:20.123Z");
        assert_eq!(json["quarantined"][1]["node"], serde_json::Value::Null);
        assert_eq!(json["quarantined"][1]["raw"], "garbage");
        assert_eq!(QuarantineReport::default().render(), "no quarantined request\n");
        assert_eq!(dropped_line(42), "request 42: quarantine record dropped");
    }

    #[test]
    fn one_line_answers() {
        let answer = StartResponse { node: "node-a".into(), request_id: 7 };
        assert_eq!(started_line("node-a", &answer), "node-a: inspection started (request 7)");
        let answer = StartResponse { node: "1be26c0b-03f2-4d2e-ae87-c02d7f33c123".into(), request_id: 8 };
        assert_eq!(
            started_line("rack1-u12", &answer),
            "rack1-u12: inspection started (request 8, node 1be26c0b-03f2-4d2e-ae87-c02d7f33c123)"
        );
        assert_eq!(accepted_line("node-a", NodeAction::Abort, 9), "node-a: abort requested (request 9)");
        assert_eq!(accepted_line("node-a", NodeAction::Reapply, 10), "node-a: reapply requested (request 10)");
        assert_eq!(
            continued_line(&ContinueResponse { node: "node-a".into() }),
            "introspection data accepted for node node-a"
        );
    }

    #[test]
    fn data_is_printed_indented() {
        assert_eq!(
            pretty_data(r#"{"inventory":{"interfaces":[{"mac_address":"52:54:00:12:34:56"}]}}"#).unwrap(),
            r#"{
  "inventory": {
    "interfaces": [
      {
        "mac_address": "52:54:00:12:34:56"
      }
    ]
  }
}
"#
        );
        assert!(pretty_data("{").is_err());
    }

    #[test]
    fn continue_accepts_only_a_json_object() {
        assert!(check_introspection_data("x.json", r#"{"inventory": {}}"#).is_ok());
        let err = check_introspection_data("x.json", "[1, 2]").unwrap_err();
        assert_eq!(
            err.to_string(),
            "x.json holds a JSON array, not the JSON object of ironic-python-agent's introspection data"
        );
        let err = check_introspection_data("x.json", "null").unwrap_err();
        assert!(err.to_string().starts_with("x.json holds a JSON null, "), "{err}");
        let err = check_introspection_data("standard input", "{\"inventory\": ").unwrap_err();
        assert!(matches!(err, DataFileError::NotJson { .. }), "{err:?}");
        assert_eq!(err.to_string(), "standard input is not JSON");
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("line 1 column 14"), "{cause}");
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let err = read_introspection_data(Path::new("/nonexistent/ironguard/data.json")).unwrap_err();
        assert!(matches!(err, DataFileError::Read { .. }), "{err:?}");
        assert_eq!(err.to_string(), "cannot read /nonexistent/ironguard/data.json");
    }
}
