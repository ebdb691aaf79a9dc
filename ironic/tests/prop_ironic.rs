//! Property tests of the Ironic client on hostile replies: a local HTTP server answers every request with a
//! scripted status and body — arbitrary JSON, Ironic-shaped nodes, ports, list pages and error bodies damaged,
//! text that is not JSON, version documents that make no sense — and every client call returns a value or an
//! `IronicError`, never a panic or a hang. What it returns honours its contract on any reply: a list never holds
//! nodes in other provision states or ports of other nodes than asked for, a 404 is `NotFound`, and a node
//! identifier never leaves its path segment of the URL.
//!
//! Case count: `IRONGUARD_PROPTEST_NET_CASES` (default below; each case is a few dozen HTTP exchanges);
//! `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ironguard_ironic::{Ironic, IronicConfig, IronicError};
use ironguard_testkit::hostile::{json, mutate, mutation, text};
use ironguard_testkit::prop::check;
use proptest::prelude::*;
use serde_json::{Value, json};

const DEFAULT_CASES: u32 = 200;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proptest-regressions/prop_ironic.txt");
/// Longer than any call may take with `retries = 0` and a 2 s request timeout.
const CALL_BOUND: Duration = Duration::from_secs(10);

fn cases() -> u32 {
    ironguard_testkit::prop::cases("IRONGUARD_PROPTEST_NET_CASES", DEFAULT_CASES)
}

/// One scripted answer.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    body: String,
}

/// What the server answers: `root` to `GET /`, then `replies` in order to everything else (the last one again
/// once they run out). It records the paths asked for.
#[derive(Debug, Default)]
struct Script {
    root: Option<Reply>,
    replies: Vec<Reply>,
    next: usize,
    paths: Vec<String>,
}

type Shared = Arc<Mutex<Script>>;

async fn answer(State(script): State<Shared>, req: Request) -> Response {
    let reply = {
        let mut s = script.lock().unwrap();
        s.paths.push(req.uri().path().to_owned());
        if req.uri().path() == "/" {
            s.root.clone()
        } else {
            let i = s.next.min(s.replies.len().saturating_sub(1));
            s.next += 1;
            s.replies.get(i).cloned()
        }
    };
    let Some(reply) = reply else { return StatusCode::NOT_FOUND.into_response() };
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    (status, [("content-type", "application/json")], reply.body).into_response()
}

const VERSIONS: &str = r#"{"name": "OpenStack Ironic API", "default_version": {"id": "v1", "version": "1.81", "min_version": "1.1", "status": "CURRENT"}, "versions": [{"id": "v1", "version": "1.81", "min_version": "1.1"}]}"#;

fn node_json() -> Value {
    json!({
        "uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
        "name": "node-1",
        "provision_state": "manageable",
        "power_state": "power off",
        "inspect_interface": "agent",
        "driver_info": {"ipmi_address": "192.0.2.200", "redfish_address": "https://10.0.0.1"},
        "maintenance": false,
        "properties": {"cpus": 4},
    })
}

fn port_json() -> Value {
    json!({"uuid": "7d3c0f5e-1a2b-4c3d-8e9f-0a1b2c3d4e5f", "address": "52:54:00:12:34:56",
           "node_uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123", "pxe_enabled": true})
}

fn damaged(v: Value) -> BoxedStrategy<Value> {
    prop::collection::vec(mutation(), 0..4)
        .prop_map(move |ms| {
            let mut v = v.clone();
            for m in &ms {
                mutate(&mut v, m);
            }
            v
        })
        .boxed()
}

/// Bodies Ironic could send, damaged, and bodies it never would.
fn body() -> BoxedStrategy<String> {
    let page = |key: &'static str, item: Value| {
        (
            prop::collection::vec(damaged(item), 0..4),
            prop::option::of(prop_oneof![Just("http://x/v1?marker=m".to_owned()), text()]),
        )
            .prop_map(move |(items, next)| {
                let mut p = json!({key: items});
                if let Some(n) = next {
                    p["next"] = json!(n);
                }
                p
            })
    };
    let error_body = text().prop_map(|fault| {
        json!({"error_message": json!({"faultstring": fault, "debuginfo": null, "faultcode": "Client"}).to_string()})
    });
    let json_body = prop_oneof![
        damaged(node_json()),
        page("nodes", node_json()).prop_flat_map(damaged),
        page("ports", port_json()).prop_flat_map(damaged),
        error_body.prop_flat_map(damaged),
        damaged(json!({"power": {"result": true, "reason": null}, "boot": {"result": false, "reason": "x"}})),
        json(),
    ];
    prop_oneof![
        6 => json_body.prop_map(|v| v.to_string()),
        1 => text(),
        1 => Just(String::new()),
        1 => Just(r#"{"error_message": "{\"faultstring\": \"Node is locked by host x\"}"}"#.to_owned()),
        1 => Just("{\"nodes\": [".to_owned()),
    ]
    .boxed()
}

fn status() -> BoxedStrategy<u16> {
    prop_oneof![
        6 => Just(200u16),
        1 => prop::sample::select(vec![201u16, 202, 204, 300, 302, 400, 401, 403, 404, 406, 409, 413, 500, 502, 503]),
        1 => 200u16..600,
    ]
    .boxed()
}

fn reply() -> BoxedStrategy<Reply> {
    (status(), body()).prop_map(|(status, body)| Reply { status, body }).boxed()
}

fn root_reply() -> BoxedStrategy<Reply> {
    let versions: Value = serde_json::from_str(VERSIONS).unwrap();
    let body = prop_oneof![
        4 => Just(VERSIONS.to_owned()),
        2 => prop::sample::select(vec!["1.7", "1.8", "2.0", "1.99", "x.y", "1", "1.", ".1", "99999999999.1", "1.-1", ""])
            .prop_map(|v| json!({"default_version": {"version": v}}).to_string()),
        2 => damaged(versions).prop_map(|v| v.to_string()),
        1 => body(),
    ];
    (prop_oneof![8 => Just(200u16), 1 => status()], body).prop_map(|(status, body)| Reply { status, body }).boxed()
}

/// Node identifiers as they reach the client from the APIs: UUIDs, names, and hostile strings.
fn ident() -> BoxedStrategy<String> {
    prop_oneof![
        3 => Just("1be26c0b-03f2-4d2e-ae87-c02d7f33c123".to_owned()),
        2 => prop::sample::select(vec![
            "node-1", "x/../1be26c0b-03f2-4d2e-ae87-c02d7f33c123", "..", ".", "a?b=c", "a#b", "%2e%2e", "a b",
            "a%2Fb", "\u{0}", "é", "a\r\nHost: evil", "/", "//", "a\\..\\b",
        ])
        .prop_map(str::to_owned),
        2 => text(),
    ]
    .boxed()
}

/// Every client call, with its contract on any reply.
async fn exercise(ironic: &Ironic, id: &str, script: &Shared) -> Result<(), TestCaseError> {
    let reset = || {
        let mut s = script.lock().unwrap();
        s.next = 0;
        s.paths.clear();
    };
    macro_rules! bounded {
        ($call:expr) => {
            tokio::time::timeout(CALL_BOUND, $call)
                .await
                .map_err(|_| TestCaseError::fail(format!("{} hung", stringify!($call))))?
        };
    }
    let not_found_is_404 = |r: &Result<_, IronicError>, script: &Shared| -> Result<(), TestCaseError> {
        if let Err(IronicError::NotFound { .. }) = r {
            if matches!(id, "" | "." | "..") {
                // Refused before any request: such a path segment names nothing (a URL parser resolves it away).
                return Ok(());
            }
            let s = script.lock().unwrap();
            prop_assert!(s.root.as_ref().is_some_and(|r| r.status == 404) || s.replies.iter().any(|r| r.status == 404));
        }
        Ok(())
    };

    let _ = bounded!(ironic.microversion());

    reset();
    let r = bounded!(ironic.get_node(id));
    not_found_is_404(&r, script)?;
    // The identifier stays inside its one path segment, whatever it holds.
    for p in script.lock().unwrap().paths.iter().filter(|p| *p != "/") {
        let rest = p.strip_prefix("/v1/nodes/");
        prop_assert!(rest.is_some_and(|r| !r.is_empty() && !r.contains('/')), "{:?} asked for {:?}", id, p);
    }

    reset();
    if let Ok(nodes) = bounded!(ironic.list_nodes(&["manageable", "inspect wait"], "uuid,name,driver_info")) {
        prop_assert!(
            nodes.iter().all(|n| matches!(n.provision_state.as_deref(), Some("manageable" | "inspect wait"))),
            "listed nodes in other states: {nodes:?}"
        );
        for n in &nodes {
            let _ = n.bmc_addresses();
        }
    }
    reset();
    let _ = bounded!(ironic.list_nodes(&[], ""));
    reset();
    if let Ok(ports) = bounded!(ironic.list_ports(Some(id))) {
        prop_assert!(ports.iter().all(|p| p.node_uuid == id), "ports of other nodes: {ports:?}");
    }
    reset();
    let _ = bounded!(ironic.list_ports(None));
    reset();
    if let Ok(ports) = bounded!(ironic.list_ports_detail(id)) {
        prop_assert!(ports.iter().all(|p| p["node_uuid"] == id));
    }
    reset();
    if let Ok(ports) = bounded!(ironic.ports_by_address("52:54:00:12:34:56")) {
        prop_assert!(ports.iter().all(|p| p.address.eq_ignore_ascii_case("52:54:00:12:34:56")));
    }
    reset();
    let _ = bounded!(ironic.nodes_with_driver_info());
    reset();
    let _ = bounded!(ironic.validate(id, "power"));
    reset();
    let _ = bounded!(ironic.get_node_full(id));
    reset();
    let _ = bounded!(ironic.create_node(&json!({"driver": "fake-hardware"})));
    reset();
    let _ = bounded!(ironic.create_port_with(&json!({"node_uuid": id, "address": "52:54:00:12:34:56"})));
    reset();
    let _ = bounded!(ironic.create_port(id, "52:54:00:12:34:56"));
    reset();
    let _ = bounded!(ironic.patch_node_with(id, &json!([{"op": "add", "path": "/extra/x", "value": 1}]), Some(true)));
    reset();
    let _ = bounded!(ironic.set_power(id, "power off"));
    reset();
    let _ = bounded!(ironic.set_boot_device(id, "pxe", false));
    reset();
    let _ = bounded!(ironic.add_trait(id, "CUSTOM_X"));
    reset();
    let _ = bounded!(ironic.remove_trait(id, "CUSTOM_X"));
    reset();
    let _ = bounded!(ironic.patch_port(id, &json!([])));
    reset();
    let _ = bounded!(ironic.delete_port(id));
    Ok(())
}

#[test]
fn every_call_on_hostile_replies_returns_a_value_or_an_error() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let script: Shared = Arc::default();
    let url = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(answer).with_state(script.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    });
    let strategy = (root_reply(), prop::collection::vec(reply(), 1..4), ident(), 1u32..4);
    check(REGRESSIONS, "ironic_client_on_hostile_replies", cases(), strategy, |(root, replies, id, page_size)| {
        {
            let mut s = script.lock().unwrap();
            *s = Script { root: Some(root), replies, next: 0, paths: vec![] };
        }
        let cfg = IronicConfig { url: url.clone(), retries: 0, timeout_ms: 2000, page_size, ..IronicConfig::default() };
        let ironic = Ironic::new(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
        rt.block_on(exercise(&ironic, &id, &script))
    });
}

#[test]
fn error_bodies_of_any_shape_become_messages() {
    // A 4xx answer's body is read for Ironic's message: any body gives an `Http` error with that status (or
    // `NotFound` for a 404), never a panic.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let script: Shared = Arc::default();
    let url = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(answer).with_state(script.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    });
    let strategy = (prop::sample::select(vec![400u16, 403, 404, 406, 409, 422]), body());
    check(REGRESSIONS, "ironic_error_bodies", cases() * 2, strategy, |(status, body)| {
        *script.lock().unwrap() = Script {
            root: Some(Reply { status: 200, body: VERSIONS.into() }),
            replies: vec![Reply { status, body }],
            next: 0,
            paths: vec![],
        };
        let cfg = IronicConfig { url: url.clone(), retries: 0, timeout_ms: 2000, ..IronicConfig::default() };
        let ironic = Ironic::new(cfg).unwrap();
        let r = rt.block_on(async { tokio::time::timeout(CALL_BOUND, ironic.set_power("n1", "power on")).await });
        let r = r.map_err(|_| TestCaseError::fail("hung"))?;
        match r {
            Err(IronicError::NotFound { .. }) => prop_assert_eq!(status, 404),
            Err(IronicError::Http { status: s, .. }) => prop_assert_eq!(s, status),
            // A 409 that says the node is locked is retried (here: no retries left).
            Err(IronicError::Exhausted { .. }) => prop_assert_eq!(status, 409),
            other => prop_assert!(false, "{status} gave {other:?}"),
        }
        Ok(())
    });
}
