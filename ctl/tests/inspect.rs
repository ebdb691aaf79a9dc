//! `ironguardctl inspect`, the binary itself, against a fake `Inspection` server on `127.0.0.1:0`: what it sends,
//! what it prints, and its exit codes.
// A test crate: the fake server's helpers panic on setup failures, which fails the test that called them.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};

use ironguard_proto::v1::inspection_server::{Inspection, InspectionServer};
use ironguard_proto::v1::{
    ContinueRequest, ContinueResponse, DataRequest, DataResponse, DeleteRulesResponse, DropQuarantinedRequest,
    DropQuarantinedResponse, InspectionStatus, ListQuarantinedRequest, ListQuarantinedResponse, ListRequest,
    ListResponse, ListRulesRequest, ListRulesResponse, NodeRequest, QuarantinedRequest, RequestAccepted, Rule,
    RuleRequest, StartRequest, StartResponse,
};
use tokio::io::AsyncWriteExt as _;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// 2023-11-14T22:13:20.123Z
const STARTED_MS: u64 = 1_700_000_000_123;
/// 2023-11-14T22:20:00.000Z
const FINISHED_MS: u64 = 1_700_000_400_000;

fn status(node: &str, state: &str, error: &str) -> InspectionStatus {
    let finished = matches!(state, "finished" | "error");
    InspectionStatus {
        node: node.into(),
        state: state.into(),
        finished,
        error: error.into(),
        started_at_ms: STARTED_MS,
        finished_at_ms: if finished { FINISHED_MS } else { 0 },
        macs: vec!["52:54:00:12:34:56".into()],
        manage_boot: true,
        updated_at_ms: FINISHED_MS,
    }
}

/// Records the requests it receives (shared with the test) and answers from scripts:
/// - `Start`: NOT_FOUND for `ghost`, FAILED_PRECONDITION for `deployed`; `rack1-u12` resolves to `uuid-rack1-u12`.
/// - `Get`: the node's scripted answers in turn, the last one repeating; NOT_FOUND for a node without a script.
/// - `List`: [`FakeInspection::records`], paged as the control plane does (by node, the token the last one sent).
#[derive(Debug, Clone, Default)]
struct FakeInspection {
    starts: Arc<Mutex<Vec<StartRequest>>>,
    gets: Arc<Mutex<Vec<String>>>,
    lists: Arc<Mutex<Vec<ListRequest>>>,
    continues: Arc<Mutex<Vec<String>>>,
    scripts: Arc<Mutex<HashMap<String, Vec<InspectionStatus>>>>,
    records: Arc<Mutex<Vec<InspectionStatus>>>,
    /// Rules as stored (JSON); a rule without `actions` is refused as the control plane refuses it.
    rules: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Quarantined requests; `List` counts them, `DropQuarantined` of an id not here is NOT_FOUND.
    quarantine: Arc<Mutex<Vec<QuarantinedRequest>>>,
}

impl FakeInspection {
    fn script(&self, node: &str, states: &[(&str, &str)]) {
        let answers = states.iter().map(|(state, error)| status(node, state, error)).collect();
        self.scripts.lock().unwrap().insert(node.into(), answers);
    }

    fn gets_of(&self, node: &str) -> usize {
        self.gets.lock().unwrap().iter().filter(|n| *n == node).count()
    }
}

#[tonic::async_trait]
impl Inspection for FakeInspection {
    async fn start(&self, request: Request<StartRequest>) -> Result<Response<StartResponse>, Status> {
        let request = request.into_inner();
        let mut starts = self.starts.lock().unwrap();
        starts.push(request.clone());
        match request.node.as_str() {
            "ghost" => Err(Status::not_found("node ghost is not known to Ironic")),
            "deployed" => Err(Status::failed_precondition(
                r#"node deployed is in provision state "active"; inspection needs one of manageable, inspect failed"#,
            )),
            node => {
                let node = if node == "rack1-u12" { "uuid-rack1-u12".to_string() } else { node.to_string() };
                Ok(Response::new(StartResponse { node, request_id: 100 + starts.len() as u64 }))
            }
        }
    }

    async fn get(&self, request: Request<NodeRequest>) -> Result<Response<InspectionStatus>, Status> {
        let node = request.into_inner().node;
        self.gets.lock().unwrap().push(node.clone());
        let mut scripts = self.scripts.lock().unwrap();
        let answers =
            scripts.get_mut(&node).ok_or_else(|| Status::not_found(format!("node {node} has never been inspected")))?;
        let answer = if answers.len() > 1 { answers.remove(0) } else { answers[0].clone() };
        Ok(Response::new(answer))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let request = request.into_inner();
        self.lists.lock().unwrap().push(request.clone());
        let size = if request.page_size == 0 { 100 } else { request.page_size as usize };
        let mut records = self.records.lock().unwrap().clone();
        records.sort_by(|a, b| a.node.cmp(&b.node));
        let items: Vec<InspectionStatus> = records
            .into_iter()
            .filter(|r| request.states.is_empty() || request.states.contains(&r.state))
            .filter(|r| request.page_token.is_empty() || r.node > request.page_token)
            .take(size + 1)
            .collect();
        let more = items.len() > size;
        let page: Vec<InspectionStatus> = items.into_iter().take(size).collect();
        let next_page_token = if more { page.last().unwrap().node.clone() } else { String::new() };
        let quarantined = self.quarantine.lock().unwrap().len() as u64;
        Ok(Response::new(ListResponse { inspections: page, next_page_token, quarantined }))
    }

    async fn abort(&self, _request: Request<NodeRequest>) -> Result<Response<RequestAccepted>, Status> {
        Ok(Response::new(RequestAccepted { request_id: 7 }))
    }

    async fn r#continue(&self, request: Request<ContinueRequest>) -> Result<Response<ContinueResponse>, Status> {
        self.continues.lock().unwrap().push(request.into_inner().data_json);
        Ok(Response::new(ContinueResponse { node: "node-a".into() }))
    }

    async fn reapply(&self, _request: Request<NodeRequest>) -> Result<Response<RequestAccepted>, Status> {
        Ok(Response::new(RequestAccepted { request_id: 8 }))
    }

    async fn get_data(&self, request: Request<DataRequest>) -> Result<Response<DataResponse>, Status> {
        let r = request.into_inner();
        let data_json = if r.unprocessed {
            r#"{"inventory":{"cpu":{"count":4}},"logs":"x"}"#
        } else {
            r#"{"inventory":{"cpu":{"count":4}}}"#
        };
        Ok(Response::new(DataResponse { node: r.node, data_json: data_json.into() }))
    }

    async fn create_rule(&self, request: Request<Rule>) -> Result<Response<Rule>, Status> {
        let mut rule: serde_json::Value = serde_json::from_str(&request.into_inner().rule_json).unwrap();
        if rule["actions"].as_array().is_none_or(Vec::is_empty) {
            return Err(Status::invalid_argument("invalid introspection rule: actions: at least one action is needed"));
        }
        let mut rules = self.rules.lock().unwrap();
        if rule["uuid"].is_null() {
            rule["uuid"] = format!("rule-{}", rules.len() + 1).into();
        }
        rules.push(rule.clone());
        Ok(Response::new(Rule { rule_json: rule.to_string() }))
    }

    async fn list_rules(&self, _request: Request<ListRulesRequest>) -> Result<Response<ListRulesResponse>, Status> {
        let rules = self.rules.lock().unwrap().iter().map(|r| Rule { rule_json: r.to_string() }).collect();
        Ok(Response::new(ListRulesResponse { rules }))
    }

    async fn get_rule(&self, request: Request<RuleRequest>) -> Result<Response<Rule>, Status> {
        let uuid = request.into_inner().uuid;
        let rules = self.rules.lock().unwrap();
        let rule = rules.iter().find(|r| r["uuid"] == uuid.as_str());
        let rule = rule.ok_or_else(|| Status::not_found(format!("rule {uuid} was not found")))?;
        Ok(Response::new(Rule { rule_json: rule.to_string() }))
    }

    async fn delete_rule(&self, request: Request<RuleRequest>) -> Result<Response<DeleteRulesResponse>, Status> {
        let uuid = request.into_inner().uuid;
        let mut rules = self.rules.lock().unwrap();
        let before = rules.len();
        rules.retain(|r| r["uuid"] != uuid.as_str());
        if rules.len() == before {
            return Err(Status::not_found(format!("rule {uuid} was not found")));
        }
        Ok(Response::new(DeleteRulesResponse { deleted: 1 }))
    }

    async fn delete_all_rules(
        &self,
        _request: Request<ListRulesRequest>,
    ) -> Result<Response<DeleteRulesResponse>, Status> {
        let mut rules = self.rules.lock().unwrap();
        let deleted = rules.len() as u32;
        rules.clear();
        Ok(Response::new(DeleteRulesResponse { deleted }))
    }

    async fn list_quarantined(
        &self,
        _request: Request<ListQuarantinedRequest>,
    ) -> Result<Response<ListQuarantinedResponse>, Status> {
        Ok(Response::new(ListQuarantinedResponse { requests: self.quarantine.lock().unwrap().clone() }))
    }

    async fn drop_quarantined(
        &self,
        request: Request<DropQuarantinedRequest>,
    ) -> Result<Response<DropQuarantinedResponse>, Status> {
        let id = request.into_inner().id;
        let mut quarantine = self.quarantine.lock().unwrap();
        let before = quarantine.len();
        quarantine.retain(|q| q.id != id);
        if quarantine.len() == before {
            return Err(Status::not_found(format!("no quarantined request {id}")));
        }
        Ok(Response::new(DropQuarantinedResponse {}))
    }
}

async fn start_fake() -> (FakeInspection, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let fake = FakeInspection::default();
    let server = tonic::transport::Server::builder().add_service(InspectionServer::new(fake.clone()));
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));
    (fake, format!("http://{addr}"))
}

fn command(url: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ironguardctl"));
    command.arg("--controlplane").arg(url).arg("inspect").args(args).env_remove("IRONGUARD_CONTROLPLANE");
    command
}

async fn ironguardctl(url: &str, args: &[&str]) -> Output {
    command(url, args).output().await.unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A file under cargo's scratch directory for integration tests, holding `text`.
fn scratch_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn start_goes_on_after_an_unknown_node_and_exits_2() {
    let (fake, url) = start_fake().await;
    let out = ironguardctl(&url, &["start", "ghost", "node-a"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout(&out), "node-a: inspection started (request 102)\n");
    assert_eq!(
        stderr(&out),
        format!(
            "ironguardctl: ghost: the control plane at {url} found nothing for Start: node ghost is not known to \
             Ironic\n"
        )
    );
    let starts = fake.starts.lock().unwrap();
    assert_eq!(
        *starts,
        [
            StartRequest { node: "ghost".into(), manage_boot: true, ..Default::default() },
            StartRequest { node: "node-a".into(), manage_boot: true, ..Default::default() }
        ]
    );
}

#[tokio::test]
async fn start_reports_a_refused_state_and_passes_no_manage_boot() {
    let (fake, url) = start_fake().await;
    let out = ironguardctl(&url, &["start", "node-a", "deployed", "--no-manage-boot"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout(&out), "node-a: inspection started (request 101)\n");
    let err = stderr(&out);
    assert!(err.starts_with("ironguardctl: deployed: "), "{err}");
    assert!(
        err.contains(r#"refused Start (failed precondition): node deployed is in provision state "active""#),
        "{err}"
    );
    assert!(fake.starts.lock().unwrap().iter().all(|s| !s.manage_boot));
}

#[tokio::test]
async fn start_then_wait_follows_the_node_the_control_plane_named() {
    let (fake, url) = start_fake().await;
    fake.script("uuid-rack1-u12", &[("starting", ""), ("waiting", ""), ("finished", "")]);
    let out = ironguardctl(&url, &["start", "rack1-u12", "--wait", "--interval", "20"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "rack1-u12: inspection started (request 101, node uuid-rack1-u12)\nuuid-rack1-u12: finished\n"
    );
    assert_eq!(fake.gets_of("uuid-rack1-u12"), 3);
    assert_eq!(fake.gets_of("rack1-u12"), 0);
}

#[tokio::test]
async fn status_prints_text_or_json() {
    let (fake, url) = start_fake().await;
    fake.script("node-a", &[("error", "inspection aborted")]);
    let out = ironguardctl(&url, &["status", "node-a"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "node: node-a\nstate: error\nfinished: yes\nerror: inspection aborted\n\
         started at: 2023-11-14T22:13:20.123Z\nfinished at: 2023-11-14T22:20:00.000Z\n\
         updated at: 2023-11-14T22:20:00.000Z\nMACs: 52:54:00:12:34:56\nmanage boot: yes\n"
    );

    let out = ironguardctl(&url, &["status", "node-a", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["state"], "error");
    assert_eq!(json["error"], "inspection aborted");
    assert_eq!(json["started_at"], "2023-11-14T22:13:20.123Z");

    let out = ironguardctl(&url, &["status", "node-z"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "ironguardctl: the control plane at {url} found nothing for Get: node node-z has never been inspected\n"
        )
    );
}

#[tokio::test]
async fn list_prints_one_page_with_its_token_or_follows_every_page() {
    let (fake, url) = start_fake().await;
    *fake.records.lock().unwrap() = vec![
        status("n1", "finished", ""),
        status("n2", "waiting", ""),
        status("n3", "error", "inspection timed out after 3600 s"),
        status("n4", "processing", ""),
        status("n5", "finished", ""),
    ];

    let out = ironguardctl(&url, &["list", "--page-size", "2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "NODE  STATE     ERROR  STARTED                   FINISHED\n\
         n1    finished  -      2023-11-14T22:13:20.123Z  2023-11-14T22:20:00.000Z\n\
         n2    waiting   -      2023-11-14T22:13:20.123Z  -\n\
         more: --page-token n2\n"
    );
    let out = ironguardctl(&url, &["list", "--page-size", "2", "--page-token", "n2"]).await;
    assert!(stdout(&out).starts_with("NODE  STATE       ERROR"), "{}", stdout(&out));
    assert!(stdout(&out).ends_with("more: --page-token n4\n"), "{}", stdout(&out));

    fake.lists.lock().unwrap().clear();
    let out = ironguardctl(&url, &["list", "--page-size", "2", "--all", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes: Vec<&str> =
        json["inspections"].as_array().unwrap().iter().map(|i| i["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["n1", "n2", "n3", "n4", "n5"]);
    assert_eq!(json["next_page_token"], serde_json::Value::Null);
    let tokens: Vec<String> = fake.lists.lock().unwrap().iter().map(|l| l.page_token.clone()).collect();
    assert_eq!(tokens, ["", "n2", "n4"]);

    let out = ironguardctl(&url, &["list", "--all", "--state", "finished", "--state", "error"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 4, "{}", stdout(&out));
    assert_eq!(fake.lists.lock().unwrap().last().unwrap().states, ["finished", "error"]);
}

#[tokio::test]
async fn wait_exits_0_when_every_inspection_finished() {
    let (fake, url) = start_fake().await;
    fake.script("node-a", &[("waiting", ""), ("processing", ""), ("finished", "")]);
    fake.script("node-b", &[("finished", "")]);
    let out = ironguardctl(&url, &["wait", "node-a", "node-b", "--interval", "20"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "node-b: finished\nnode-a: finished\n");
    assert_eq!(stderr(&out), "");
}

#[tokio::test]
async fn wait_exits_1_when_an_inspection_ended_in_error() {
    let (fake, url) = start_fake().await;
    fake.script("node-a", &[("finished", "")]);
    fake.script("node-b", &[("processing", ""), ("error", "inspection timed out after 3600 s")]);
    let out = ironguardctl(&url, &["wait", "node-a", "node-b", "--interval", "20"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stdout(&out), "node-a: finished\nnode-b: error: inspection timed out after 3600 s\n");
}

#[tokio::test]
async fn wait_exits_2_on_timeout_naming_the_nodes_still_running() {
    let (fake, url) = start_fake().await;
    fake.script("node-a", &[("finished", "")]);
    fake.script("node-b", &[("waiting", "")]);
    let started = std::time::Instant::now();
    let out = ironguardctl(&url, &["wait", "node-a", "node-b", "--timeout", "1", "--interval", "100"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(stdout(&out), "node-a: finished\n");
    assert_eq!(stderr(&out), "ironguardctl: timed out after 1s; still running: node-b (waiting)\n");
    assert!(fake.gets_of("node-b") >= 5, "{}", fake.gets_of("node-b"));
}

#[tokio::test]
async fn wait_exits_2_when_a_node_is_unknown() {
    let (fake, url) = start_fake().await;
    fake.script("node-a", &[("waiting", "")]);
    let out = ironguardctl(&url, &["wait", "node-a", "node-z"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "ironguardctl: node-z: the control plane at {url} found nothing for Get: node node-z has never been \
             inspected\nironguardctl: stopped waiting; still running: node-a (waiting), node-z (state unknown)\n"
        )
    );
}

#[tokio::test]
async fn continue_refuses_a_document_that_is_not_a_json_object_without_any_call() {
    let (fake, url) = start_fake().await;
    let not_json = scratch_file("continue-not-json.json", "{\"inventory\": ");
    let out = ironguardctl(&url, &["continue", "--file", not_json.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.starts_with(&format!("ironguardctl: {} is not JSON: ", not_json.display())), "{err}");

    let array = scratch_file("continue-array.json", "[{\"inventory\": {}}]");
    let out = ironguardctl(&url, &["continue", "--file", array.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("holds a JSON array, not the JSON object of"), "{}", stderr(&out));

    let out = ironguardctl(&url, &["continue", "--file", "/nonexistent/ironguard/data.json"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("ironguardctl: cannot read /nonexistent/ironguard/data.json: "),
        "{}",
        stderr(&out)
    );

    assert!(fake.continues.lock().unwrap().is_empty());

    // The document is checked before connecting: with no control plane at all, the error is still the file's.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = ironguardctl(&format!("http://127.0.0.1:{port}"), &["continue", "--file", array.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("holds a JSON array"), "{}", stderr(&out));
}

#[tokio::test]
async fn continue_sends_the_document_from_a_file_or_stdin() {
    let (fake, url) = start_fake().await;
    let document = r#"{"inventory": {"interfaces": [{"mac_address": "52:54:00:12:34:56"}]}}"#;
    let file = scratch_file("continue-ok.json", document);
    let out = ironguardctl(&url, &["continue", "--file", file.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "introspection data accepted for node node-a\n");

    let mut child = command(&url, &["continue", "--file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(document.as_bytes()).await.unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(*fake.continues.lock().unwrap(), [document, document]);
}

#[tokio::test]
async fn abort_reapply_and_data() {
    let (_fake, url) = start_fake().await;
    let out = ironguardctl(&url, &["abort", "node-a"]).await;
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), "node-a: abort requested (request 7)\n".into()));
    let out = ironguardctl(&url, &["reapply", "node-a"]).await;
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), "node-a: reapply requested (request 8)\n".into()));

    let pretty = "{\n  \"inventory\": {\n    \"cpu\": {\n      \"count\": 4\n    }\n  }\n}\n";
    let out = ironguardctl(&url, &["data", "node-a"]).await;
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), pretty.into()));
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("data-node-a.json");
    let out = ironguardctl(&url, &["data", "node-a", "--output", file.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("node-a: introspection data written to {} ({} bytes)\n", file.display(), pretty.len())
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), pretty);
    let out = ironguardctl(&url, &["data", "node-a", "--unprocessed"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("\"logs\": \"x\""), "the unprocessed data was asked for: {}", stdout(&out));
}

#[tokio::test]
async fn quarantine_lists_drops_and_says_when_an_id_is_not_there() {
    let (fake, url) = start_fake().await;
    let out = ironguardctl(&url, &["quarantine"]).await;
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), "no quarantined request\n".into()), "{}", stderr(&out));
    *fake.records.lock().unwrap() = vec![status("n1", "waiting", "")];
    let out = ironguardctl(&url, &["list"]).await;
    assert!(!stdout(&out).contains("quarantine"), "{}", stdout(&out));

    *fake.quarantine.lock().unwrap() = vec![QuarantinedRequest {
        id: 42,
        node: "n1".into(),
        key: "/ironguard/inspect/queue/00000000000000000042".into(),
        error: "expected value at line 1 column 13".into(),
        quarantined_at_ms: STARTED_MS,
        raw: "{\"request\": garbage".into(),
        raw_bytes: 19,
    }];
    let out = ironguardctl(&url, &["list"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).ends_with(
            "quarantined: 1 queued request(s) could not be read and were set aside; see `ironguardctl inspect \
             quarantine`\n"
        ),
        "{}",
        stdout(&out)
    );
    let out = ironguardctl(&url, &["quarantine"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(
        lines.next().map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["ID", "NODE", "QUARANTINED", "ERROR", "KEY"])
    );
    let row = lines.next().unwrap();
    assert!(row.starts_with("42  n1    2023-11-14T22:13:20.123Z  expected value at line 1 column 13  "), "{row}");
    assert!(row.ends_with("/ironguard/inspect/queue/00000000000000000042"), "{row}");
    assert!(lines.next().unwrap().starts_with("what to do: "), "{text}");
    assert!(!text.contains("garbage"), "the bytes are in --json only: {text}");
    let out = ironguardctl(&url, &["quarantine", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["quarantined"][0]["raw"], "{\"request\": garbage");
    assert_eq!(json["quarantined"][0]["id"], 42);

    // An id not in quarantine: exit 2, the control plane's word, nothing dropped.
    let out = ironguardctl(&url, &["quarantine", "--drop", "41"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "ironguardctl: the control plane at {url} found nothing for DropQuarantined: no quarantined request 41\n"
        )
    );
    assert_eq!(fake.quarantine.lock().unwrap().len(), 1);
    let out = ironguardctl(&url, &["quarantine", "--drop", "42"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "request 42: quarantine record dropped\n");
    assert!(fake.quarantine.lock().unwrap().is_empty());
    let out = ironguardctl(&url, &["quarantine", "--drop", "nope"]).await;
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(stderr(&out).contains("invalid value 'nope'"), "{}", stderr(&out));
}

async fn rules_command(url: &str, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ironguardctl"));
    command.arg("--controlplane").arg(url).arg("rules").args(args).env_remove("IRONGUARD_CONTROLPLANE");
    command.output().await.unwrap()
}

#[tokio::test]
async fn rules_import_list_show_delete() {
    let (fake, url) = start_fake().await;
    let file = scratch_file(
        "rules-two.json",
        r#"[{"description": "gpu", "actions": [{"action": "set-capability", "name": "gpu", "value": "true"}]},
            {"uuid": "fixed", "scope": "rack1", "conditions": [{"op": "eq", "field": "cpus", "value": 4}],
             "actions": [{"action": "fail", "message": "no"}]}]"#,
    );
    let out = rules_command(&url, &["import", file.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "rule-1: created (gpu)\nfixed: created\n");

    let out = rules_command(&url, &["list"]).await;
    assert_eq!(
        stdout(&out),
        "UUID    DESCRIPTION  SCOPE  CONDITIONS  ACTIONS\nrule-1  gpu          -      0           1\nfixed   -            rack1  1           1\n"
    );
    let out = rules_command(&url, &["list", "--json"]).await;
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2));
    let out = rules_command(&url, &["show", "fixed"]).await;
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["scope"], "rack1");
    let out = rules_command(&url, &["show", "ghost"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("rule ghost was not found"), "{}", stderr(&out));

    let out = rules_command(&url, &["delete", "fixed"]).await;
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), "fixed: deleted\n".into()));
    let out = rules_command(&url, &["delete", "--all"]).await;
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), "1 rule(s) deleted\n".into()));
    assert!(fake.rules.lock().unwrap().is_empty());
}

#[tokio::test]
async fn rules_import_stops_at_the_first_refused_rule_and_checks_the_file_first() {
    let (fake, url) = start_fake().await;
    let file = scratch_file(
        "rules-bad-second.json",
        r#"[{"actions": [{"action": "fail", "message": "x"}]}, {"description": "no actions"}, {"actions": [{}]}]"#,
    );
    let out = rules_command(&url, &["import", file.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stdout(&out), "rule-1: created\n");
    let err = stderr(&out);
    assert!(err.contains("rule 2 of 3 in") && err.contains("(1 stored before it)"), "{err}");
    assert!(err.contains("at least one action"), "{err}");
    assert_eq!(fake.rules.lock().unwrap().len(), 1, "the third rule was not sent");

    let file = scratch_file("rules-not-rules.json", "[1, 2]");
    let out = rules_command(&url, &["import", file.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("expected a rule (a JSON object) or a list of rules, found a number as item 1"));
    assert_eq!(fake.rules.lock().unwrap().len(), 1, "nothing sent");
}
