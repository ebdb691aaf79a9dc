//! Property tests of the control plane's two front doors on hostile input, in-process against the fake Ironic
//! (two enrolled nodes, one inspectable and inspected once, one deployed; one rule stored), so that real
//! identifiers turn up among the generated ones:
//!
//! - the ironic-inspector v1 REST API (`POST /v1/continue`, `POST /v1/rules`, `GET|DELETE /v1/rules/{id}`,
//!   `GET /v1/introspection`, `GET|POST /v1/introspection/{id}`, `POST .../abort`, `GET .../data`,
//!   `GET|POST .../data/unprocessed`) with arbitrary identifiers, percent-encoded as a client sends them or as raw
//!   path pieces (`..`, `a/b`, `%ff`, empty segments); query strings with repeated, empty and invalid `limit`,
//!   `marker`, `state`, `manage_boot` and `node_uuid`; damaged JSON and arbitrary bytes as bodies; odd API
//!   version headers;
//! - every call of the gRPC `Inspection` service with arbitrary strings (up to 1000 characters, and in a test of
//!   their own up to 20000), and `UpdatePxeFilters` with arbitrary MACs and reasons.
//!
//! Each case is a short sequence of calls, from N1 inspected or waiting for its data. Never a hang, a panic, a
//! 5xx, or a gRPC code but INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION and ALREADY_EXISTS: the fake Ironic is
//! up and the store is local. Every REST refusal is ironic-inspector's JSON `{"error": {"message": "..."}}`
//! (checked apart for raw path pieces). A refused call changes nothing: the filter state (GetFilterState), the
//! inspections (records, stored data, queue), the rules and the fake Ironic's nodes and ports are as before —
//! including data whose pre-processing fails for a node that is waiting (ironic-inspector would end that
//! inspection; anyone on the PXE network can post such data, so ironguard leaves the node waiting).
//! `UpdatePxeFilters` is accepted exactly when the request is valid, and then changes only the MACs it names.
//!
//! Case count: `IRONGUARD_PROPTEST_NET_CASES` (default below; every call runs between two snapshots of the whole
//! site); `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::site_support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fake_ironic::{FakeIronic, Node, Port};
use ironguard_controlplane::filter::MAX_MACS_PER_REQUEST;
use ironguard_dataplane::MacAddr;
use ironguard_inspection::machine::State;
use ironguard_inspection::records::{NodeRecord, Request};
use ironguard_proto::v1::{
    ContinueRequest, DataRequest, FilterState, GetFilterStateRequest, ListRequest, ListRulesRequest, NodeRequest, Rule,
    RuleRequest, StartRequest, UpdatePxeFiltersRequest,
};
use ironguard_testkit::hostile::{json, json_object, mutate, mutated_fixture, mutation, text};
use ironguard_testkit::prop::check;
use proptest::prelude::*;
use serde_json::{Value, json};
use tonic::Code;

const DEFAULT_CASES: u32 = 128;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/suite/proptest-regressions/prop_api.txt");
/// Longer than any call may take: a call that does not answer within this hangs.
const CALL_BOUND: Duration = Duration::from_secs(15);

/// Inspectable, with a port; inspected once when the site starts (finished, data stored).
const N1: &str = "11111111-1111-1111-1111-111111111111";
const MAC1: &str = "52:54:00:aa:00:01";
/// Deployed (`active`): never inspectable.
const N2: &str = "22222222-2222-2222-2222-222222222222";
const MAC2: &str = "52:54:00:aa:00:02";
/// Known to nobody.
const UNKNOWN: &str = "99999999-9999-9999-9999-999999999999";
/// The rule every case starts with.
const R1: &str = "0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d";

fn cases() -> u32 {
    ironguard_testkit::prop::cases("IRONGUARD_PROPTEST_NET_CASES", DEFAULT_CASES)
}

// --- panics anywhere in the process -----------------------------------------------------------------------------

/// The names of the threads that panicked, in order.
static PANICKED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records every panic of the process (the servers' tasks included) with its thread's name, after printing it as
/// usual. Each test's runtime names its threads after the test ([`runtime`]), so that a test counts its own.
fn record_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or_default().to_owned();
            PANICKED.lock().unwrap_or_else(|e| e.into_inner()).push(name);
            previous(info);
        }));
    });
}

/// How many threads of the runtime `tag` have panicked.
fn panics(tag: &str) -> usize {
    let name = thread_name(tag);
    PANICKED.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|n| **n == name).count()
}

fn thread_name(tag: &str) -> String {
    format!("prop-api-{tag}")
}

/// A runtime for one test's site (threads named after `tag`).
fn runtime(tag: &str) -> tokio::runtime::Runtime {
    record_panics();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(thread_name(tag))
        .enable_all()
        .build()
        .unwrap()
}

// --- the site ---------------------------------------------------------------------------------------------------

use site_support::Site;

fn node(uuid: &str, name: &str, state: &str, ip: &str) -> Node {
    let mut n = site_support::node(uuid, state, ip);
    n.name = Some(name.into());
    n
}

/// What ironic-python-agent sends for a one-NIC machine booted from `mac`.
fn data_for(mac: &str, bmc: &str) -> Value {
    json!({
        "inventory": {
            "interfaces": [{"name": "eth0", "mac_address": mac, "ipv4_address": "192.0.2.10"}],
            "cpu": {"count": 4, "architecture": "x86_64", "flags": ["vmx"]},
            "memory": {"physical_mb": 8192, "total": 8_000_000_000u64},
            "disks": [{"name": "/dev/sda", "size": 64_424_509_440u64, "rotational": false}],
            "bmc_address": bmc,
        },
        "root_disk": {"name": "/dev/sda", "size": 64_424_509_440u64, "rotational": false},
        "boot_interface": format!("01-{}", mac.replace(':', "-")),
    })
}

fn r1() -> Value {
    json!({
        "uuid": R1,
        "description": "marks what it saw",
        "conditions": [{"op": "ge", "field": "memory_mb", "value": 1}],
        "actions": [{"action": "set-attribute", "path": "/extra/prop_api", "value": "seen"}],
    })
}

/// The control plane on loopback ports (gRPC without TLS, the REST API without authentication) over the fake
/// Ironic, with a stand-in leader agent that reports every revision applied; N1 inspected once, rule R1 stored.
async fn site(tag: &str) -> Site {
    let ironic = FakeIronic::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    ironic.add_node(node(N1, "node-1", "manageable", "10.0.0.1"));
    ironic.add_port(Port { address: MAC1.into(), node_uuid: N1.into(), ..Default::default() }).unwrap();
    ironic.add_node(node(N2, "node-2", "active", "10.0.0.2"));
    ironic.add_port(Port { address: MAC2.into(), node_uuid: N2.into(), ..Default::default() }).unwrap();
    let s = site_support::start(tag, ironic, |c, _| {
        // Every case posts to /v1/continue from 127.0.0.1: no rate limit in the way of the properties.
        c.inspector_api.continue_rate_per_minute = 1_000_000;
        c.inspector_api.continue_rate_burst = 1_000_000;
    })
    .await;
    // Both machines boot through the filter: data naming them as its boot interface has its evidence, so that a
    // case's answer never depends on a report's timing (no 503 "retry").
    s.boot(MAC1).await;
    s.boot(MAC2).await;
    s.insp().start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() }).await.unwrap();
    s.settle().await;
    let data = data_for(MAC1, "10.0.0.1").to_string();
    s.insp().r#continue(ContinueRequest { data_json: data, node_uuid: String::new() }).await.unwrap();
    s.settle().await;
    let rec = s.engine.store.get(N1).await.unwrap().unwrap();
    assert_eq!(rec.state, State::Finished, "{rec:?}");
    s.engine.create_rule(&r1()).await.unwrap();
    s
}

/// Everything a refused call must leave as it was.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    filters: FilterState,
    inspections: Vec<NodeRecord>,
    /// Each inspected node's stored data.
    data: Vec<(String, Option<Value>)>,
    queue: Vec<Request>,
    rules: Vec<String>,
    nodes: Vec<Node>,
    ports: Vec<Port>,
}

impl Snapshot {
    /// The parts that differ, by name, each before and after.
    fn differences(&self, other: &Snapshot) -> Vec<String> {
        let mut d = Vec::new();
        let mut part = |name: &str, differ: bool, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
            if differ {
                d.push(format!("{name}: before {} after {}", brief(&a), brief(&b)));
            }
        };
        part("filter state", self.filters != other.filters, &self.filters, &other.filters);
        part("inspections", self.inspections != other.inspections, &self.inspections, &other.inspections);
        part("stored data", self.data != other.data, &self.data, &other.data);
        part("request queue", self.queue != other.queue, &self.queue, &other.queue);
        part("rules", self.rules != other.rules, &self.rules, &other.rules);
        part("Ironic nodes", self.nodes != other.nodes, &self.nodes, &other.nodes);
        part("Ironic ports", self.ports != other.ports, &self.ports, &other.ports);
        d
    }
}

impl Site {
    /// How many panics the site's threads have had.
    fn panics(&self) -> usize {
        panics(&self.tag)
    }

    async fn snapshot(&self) -> Snapshot {
        let filters = self.filters().get_filter_state(GetFilterStateRequest::default()).await.unwrap().into_inner();
        let mut inspections = self.engine.store.list().await.unwrap();
        inspections.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        let mut data = Vec::new();
        for r in &inspections {
            data.push((r.uuid.clone(), self.engine.store.get_data(&r.uuid).await.unwrap()));
        }
        let queue = self.engine.store.pending().await.unwrap();
        let rules = self.insp().list_rules(ListRulesRequest {}).await.unwrap().into_inner().rules;
        let rules = rules.into_iter().map(|r| r.rule_json).collect();
        Snapshot { filters, inspections, data, queue, rules, nodes: self.ironic.nodes(), ports: self.ironic.ports() }
    }

    /// Waits until the workers are done with every request an accepted call queued.
    async fn settle(&self) {
        let t = Instant::now();
        loop {
            let pending = self.engine.store.pending().await.unwrap();
            let records = self.engine.store.list().await.unwrap();
            if pending.is_empty() && records.iter().all(|r| r.state.is_stable()) {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "the site never settled: {pending:?} {records:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Where a case starts: one rule, R1 (accepted calls may have created, deleted or replaced rules), so that
    /// later cases find R1 to name and processing applies a known rule set; and, as `setup` says, N1 waiting for its
    /// ramdisk's data (so that data for it is processed, or fails pre-processing, and aborts are legal).
    async fn prepare(&self, setup: Setup) {
        for r in self.engine.list_rules().await.unwrap() {
            if r.uuid != R1 {
                self.engine.delete_rule(&r.uuid).await.unwrap();
            }
        }
        if self.engine.get_rule(R1).await.is_err() {
            self.engine.create_rule(&r1()).await.unwrap();
        }
        let waiting = self.engine.store.get(N1).await.unwrap().is_some_and(|r| r.state == State::Waiting);
        if setup.n1_waiting && !waiting {
            // Refused only if an earlier case changed N1 in Ironic beyond inspection; the case then runs as it is.
            let _ = self.engine.start(N1, setup.manage_boot, true).await;
            self.settle().await;
        }
    }
}

/// How a case finds the site.
#[derive(Debug, Clone, Copy)]
struct Setup {
    n1_waiting: bool,
    manage_boot: bool,
}

fn setup() -> BoxedStrategy<Setup> {
    (any::<bool>(), any::<bool>()).prop_map(|(n1_waiting, manage_boot)| Setup { n1_waiting, manage_boot }).boxed()
}

/// What one call did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Accepted,
    /// Refused: nothing may change.
    Refused,
}

/// After a call: a refusal left the site as it was; an acceptance may change anything, and its work is let finish.
async fn after_call(site: &Site, what: &str, before: &Snapshot, outcome: &Outcome) -> Result<(), TestCaseError> {
    match outcome {
        Outcome::Accepted => {
            site.settle().await;
            Ok(())
        }
        Outcome::Refused => {
            // Let anything a refusal might have queued run before looking.
            site.settle().await;
            let after = site.snapshot().await;
            let d = before.differences(&after);
            prop_assert!(d.is_empty(), "{what} was refused but changed\n{}", d.join("\n"));
            Ok(())
        }
    }
}

/// `v`'s `Debug` for a failure message: runs of one character (the long strings) shortened, at most 2000
/// characters.
fn brief(v: &impl std::fmt::Debug) -> String {
    let full = format!("{v:?}");
    let mut out = String::new();
    let mut chars = full.chars().peekable();
    while let Some(c) = chars.next() {
        let mut run = 1;
        while chars.peek() == Some(&c) {
            chars.next();
            run += 1;
        }
        if run > 16 {
            let _ = write!(out, "{c}…(×{run})");
        } else {
            out.extend(std::iter::repeat_n(c, run));
        }
    }
    if out.chars().count() > 2000 {
        out = out.chars().take(2000).chain("…".chars()).collect();
    }
    out
}

/// Runs one call, failing the case if it hangs.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> Result<T, TestCaseError> {
    tokio::time::timeout(CALL_BOUND, f).await.map_err(|_| TestCaseError::fail(format!("{what} hung")))
}

// --- strategies shared by both APIs ------------------------------------------------------------------------------

/// Long strings: `reps` times one character (ASCII, two or four bytes of UTF-8, a control character).
fn long_text(reps: std::ops::Range<usize>) -> BoxedStrategy<String> {
    (prop::sample::select(vec!["x", "é", "🦀", "1", "/", "%", "\u{7f}"]), reps).prop_map(|(s, n)| s.repeat(n)).boxed()
}

/// Identifiers: real ones (UUIDs, names, the rule), look-alikes, path tricks, arbitrary and long strings (up to
/// 3000 characters: percent-encoded, a URL of under 64 KiB, the longest `http::Uri` takes).
fn ident() -> BoxedStrategy<String> {
    ident_with(200..3000)
}

/// [`ident`] with long strings of `long` characters.
fn ident_with(long: std::ops::Range<usize>) -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::sample::select(vec![N1, N2, "node-1", "node-2", UNKNOWN, R1, MAC1]).prop_map(str::to_owned),
        2 => prop::sample::select(vec![
            "", " ", ".", "..", "...", "%2e", "%2e%2e", "%2E.", "a/b", "a%2Fb", "../11111111-1111-1111-1111-111111111111",
            "11111111-1111-1111-1111-111111111111/..", "node-1/", "11111111-1111-1111-1111-11111111111", "\u{0}",
            "é", "🦀", "\u{202e}node-1", "a\r\nb", "*", "%", "%ff", "?", "#", "a?b=c", "~", "NODE-1",
            "11111111111111111111111111111111", "{11111111-1111-1111-1111-111111111111}", "0F4C1A547D0A4A4E9D4C0A4F8A1C2B3D",
            "urn:uuid:0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d", "inspection:11111111-1111-1111-1111-111111111111",
        ])
        .prop_map(str::to_owned),
        3 => text(),
        1 => long_text(long),
        1 => prop::sample::select(vec![N1, R1]).prop_map(|u| format!(" {u}")),
        1 => prop::sample::select(vec![N1, R1]).prop_map(|u| u.to_uppercase()),
    ]
    .boxed()
}

/// Introspection data: what the ramdisk sends for the real nodes, damaged; the fixtures damaged; anything.
fn data() -> BoxedStrategy<Value> {
    // Mostly N1's, as N1 is often waiting for it.
    let real = prop::sample::select(vec![
        (MAC1, "10.0.0.1"),
        (MAC1, "10.0.0.1"),
        (MAC1, "10.0.0.99"),
        (MAC2, "10.0.0.2"),
        ("52:54:00:99:99:99", "10.9.9.9"),
        ("52:54:00:99:99:99", "10.0.0.1"),
    ])
    .prop_map(|(m, b)| data_for(m, b));
    prop_oneof![
        2 => real.clone(),
        3 => (real, prop::collection::vec(mutation(), 1..4)).prop_map(|(mut d, ms)| {
            for m in &ms {
                mutate(&mut d, m);
            }
            d
        }),
        2 => mutated_fixture(),
        1 => json_object(),
        1 => json(),
    ]
    .boxed()
}

/// Rule bodies: R1 and other valid rules, damaged ones, anything.
fn rule() -> BoxedStrategy<Value> {
    let uuid = prop_oneof![
        Just(json!(R1)),
        Just(json!("3a0b5c7d-1e2f-4a5b-8c9d-0e1f2a3b4c5d")),
        Just(json!("")),
        Just(json!("0F4C1A547D0A4A4E9D4C0A4F8A1C2B3D")),
        // Up to 1000 characters, the bound of the gRPC test that shares this strategy.
        ident_with(200..1000).prop_map(Value::String),
    ];
    let valid = (prop::option::of(uuid), prop::option::of(text())).prop_map(|(uuid, description)| {
        let mut r = r1();
        match uuid {
            Some(u) => r["uuid"] = u,
            None => {
                if let Some(o) = r.as_object_mut() {
                    o.remove("uuid");
                }
            }
        }
        if let Some(d) = description {
            r["description"] = json!(d);
        }
        r
    });
    prop_oneof![
        3 => valid.clone(),
        3 => (valid, prop::collection::vec(mutation(), 1..4)).prop_map(|(mut r, ms)| {
            for m in &ms {
                mutate(&mut r, m);
            }
            r
        }),
        1 => json_object(),
        1 => json(),
    ]
    .boxed()
}

/// A body as bytes, with a readable `Debug` (what a failing case prints).
#[derive(Clone)]
struct Body(Vec<u8>);

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.0);
        let shown: String = text.chars().take(600).collect();
        write!(f, "Body({} bytes: {shown:?}{})", self.0.len(), if text.chars().count() > 600 { "..." } else { "" })
    }
}

/// A JSON document as sent, cut short, with junk around it, or any bytes at all.
fn body_of(doc: BoxedStrategy<Value>) -> BoxedStrategy<Body> {
    prop_oneof![
        6 => doc.clone().prop_map(|v| v.to_string().into_bytes()),
        1 => (doc.clone(), any::<prop::sample::Index>()).prop_map(|(v, i)| {
            let s = v.to_string().into_bytes();
            let cut = i.index(s.len() + 1);
            s[..cut].to_vec()
        }),
        1 => doc.prop_map(|v| format!("{v} trailing").into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => prop::sample::select(vec![
            "", "null", "[]", "{}", "\"x\"", "0", "{\"inventory\": null}", "\u{feff}{}", "{\"a\":1,\"a\":2}",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => (1usize..20_000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes()),
    ]
    .prop_map(Body)
    .boxed()
}

// --- REST --------------------------------------------------------------------------------------------------------

/// `s` percent-encoded as one path segment or query component (everything but RFC 3986's unreserved characters).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Path pieces sent as they are (valid in an HTTP request target): dot segments, slashes, bad or surprising
/// percent-encodings, empty segments.
#[rustfmt::skip]
const RAW_PIECES: &[&str] = &[
    "", ".", "..", "%2e", "%2E%2e", ".%2e", "a/b", "a%2Fb", "%2F", "%2f..%2f", "%ff", "%c3%28", "%ed%a0%80", "%",
    "%zz", "%0", "%00", "a%00b", "%20", "+", "a;b", "a:b", "@", "!$&'()*+,;=", "%25", "%3F", "%23", "//", "/",
];

/// A raw path piece alone, or around a real identifier.
fn raw_segment() -> BoxedStrategy<String> {
    let piece = prop::sample::select(RAW_PIECES);
    let id = prop::sample::select(vec![N1, N2, "node-1", R1, UNKNOWN]);
    prop_oneof![
        3 => piece.clone().prop_map(str::to_owned),
        1 => (id.clone(), piece.clone()).prop_map(|(i, p)| format!("{i}/{p}")),
        1 => (piece.clone(), id.clone()).prop_map(|(p, i)| format!("{p}/{i}")),
        1 => (id, piece).prop_map(|(i, p)| format!("{i}{p}")),
    ]
    .boxed()
}

/// A query string (without `?`): `limit`, `marker`, `state`, `manage_boot`, `node_uuid` and others, repeated,
/// empty, without `=`, with arbitrary and badly encoded values.
fn query() -> BoxedStrategy<String> {
    let key = prop_oneof![
        6 => prop::sample::select(vec!["limit", "marker", "state", "manage_boot", "node_uuid"]).prop_map(str::to_owned),
        1 => prop::sample::select(vec!["", "LIMIT", "fields", "%6Cimit", "limit%00", "a+b"]).prop_map(str::to_owned),
        1 => text().prop_map(|t| encode(&t)),
    ];
    let value = prop_oneof![
        4 => prop::sample::select(vec![
            "", "0", "1", "2", "-1", "1000", "1001", "18446744073709551616", "1.5", "0x10", "+1", "%201", "abc",
            "true", "false", "True", "yes", "no", "1", "maybe", "waiting", "finished", "error", "starting", "bogus",
            "WAITING", N1, N2, "node-1", UNKNOWN, R1,
        ])
        .prop_map(str::to_owned),
        2 => ident().prop_map(|i| encode(&i)),
        1 => prop::sample::select(vec!["%", "%zz", "%ff", "%00", "+", "%2B", "=", "a=b", ";", "%26"]).prop_map(str::to_owned),
    ];
    let pair = prop_oneof![
        6 => (key.clone(), value).prop_map(|(k, v)| format!("{k}={v}")),
        1 => key.prop_map(|k| k.to_string()),
        1 => Just(String::new()),
    ];
    prop::collection::vec(pair, 0..5).prop_map(|v| v.join("&")).boxed()
}

/// `X-OpenStack-Ironic-Inspector-API-Version` values: supported, unsupported, malformed.
#[rustfmt::skip]
const API_VERSIONS: &[&str] = &[
    "1.0", "1.5", "1.6", "1.18", "latest", "LATEST", "1.19", "2.0", "0.9", "1", "1.", ".1", "one", "", "1.-1",
    "99999999999.1", "1.99999999999",
];

/// An API version header, or none.
fn api_version() -> BoxedStrategy<Option<&'static str>> {
    prop::option::of(prop::sample::select(API_VERSIONS)).boxed()
}

/// One REST call; `id` is the path piece as sent.
#[derive(Debug, Clone)]
enum Rest {
    Continue { query: String, body: Body },
    CreateRule { version: Option<&'static str>, body: Body },
    Start { id: String, query: String, body: Body },
    Status { id: String, query: String },
    List { query: String },
    Abort { id: String, query: String, body: Body },
    Data { id: String, query: String },
    Unprocessed { id: String, query: String },
    Reapply { id: String, query: String, body: Body },
    GetRule { id: String, query: String },
    DeleteRule { id: String, query: String },
}

/// A REST call as it goes on the wire.
struct Wire<'a> {
    method: &'static str,
    /// Path and query, exactly as sent.
    target: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Option<&'a [u8]>,
}

impl Rest {
    fn wire(&self) -> Wire<'_> {
        let q = |query: &str| if query.is_empty() { String::new() } else { format!("?{query}") };
        fn w<'a>(method: &'static str, target: String, body: Option<&'a Body>) -> Wire<'a> {
            Wire { method, target, headers: vec![], body: body.map(|b| &b.0[..]) }
        }
        match self {
            Rest::Continue { query, body } => {
                let mut wire = w("POST", format!("/v1/continue{}", q(query)), Some(body));
                wire.headers.push(("Content-Type", "application/json"));
                wire
            }
            Rest::CreateRule { version, body } => {
                let mut wire = w("POST", "/v1/rules".into(), Some(body));
                wire.headers.push(("Content-Type", "application/json"));
                if let Some(v) = version {
                    wire.headers.push(("X-OpenStack-Ironic-Inspector-API-Version", v));
                }
                wire
            }
            Rest::Start { id, query, body } => w("POST", format!("/v1/introspection/{id}{}", q(query)), Some(body)),
            Rest::Status { id, query } => w("GET", format!("/v1/introspection/{id}{}", q(query)), None),
            Rest::List { query } => w("GET", format!("/v1/introspection{}", q(query)), None),
            Rest::Abort { id, query, body } => {
                w("POST", format!("/v1/introspection/{id}/abort{}", q(query)), Some(body))
            }
            Rest::Data { id, query } => w("GET", format!("/v1/introspection/{id}/data{}", q(query)), None),
            Rest::Unprocessed { id, query } => {
                w("GET", format!("/v1/introspection/{id}/data/unprocessed{}", q(query)), None)
            }
            Rest::Reapply { id, query, body } => {
                w("POST", format!("/v1/introspection/{id}/data/unprocessed{}", q(query)), Some(body))
            }
            Rest::GetRule { id, query } => w("GET", format!("/v1/rules/{id}{}", q(query)), None),
            Rest::DeleteRule { id, query } => w("DELETE", format!("/v1/rules/{id}{}", q(query)), None),
        }
    }
}

/// REST calls whose identifiers are `segment`s.
fn rest_call(segment: BoxedStrategy<String>) -> BoxedStrategy<Rest> {
    let id = segment;
    let small = prop_oneof![
        4 => Just(Body(vec![])),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Body),
        1 => json().prop_map(|v| Body(v.to_string().into_bytes())),
    ];
    prop_oneof![
        4 => (query(), body_of(data())).prop_map(|(query, body)| Rest::Continue { query, body }),
        3 => (api_version(), body_of(rule())).prop_map(|(version, body)| Rest::CreateRule { version, body }),
        1 => (api_version(), (1usize..=3).prop_map(|extra| {
            // Over the 1 MiB limit.
            Body(vec![b' '; ironguard_controlplane::inspector_api::MAX_RULE_BYTES + extra])
        }))
        .prop_map(|(version, body)| Rest::CreateRule { version, body }),
        3 => (id.clone(), query(), small.clone()).prop_map(|(id, query, body)| Rest::Start { id, query, body }),
        3 => (id.clone(), query()).prop_map(|(id, query)| Rest::Status { id, query }),
        3 => query().prop_map(|query| Rest::List { query }),
        3 => (id.clone(), query(), small.clone()).prop_map(|(id, query, body)| Rest::Abort { id, query, body }),
        2 => (id.clone(), query()).prop_map(|(id, query)| Rest::Data { id, query }),
        2 => (id.clone(), query()).prop_map(|(id, query)| Rest::Unprocessed { id, query }),
        2 => (id.clone(), query(), small).prop_map(|(id, query, body)| Rest::Reapply { id, query, body }),
        2 => (id.clone(), query()).prop_map(|(id, query)| Rest::GetRule { id, query }),
        2 => (id, query()).prop_map(|(id, query)| Rest::DeleteRule { id, query }),
    ]
    .boxed()
}

/// What a REST reply must be, whatever the request: an answer, never a 5xx; with `json_errors`, a refusal is a
/// JSON error.
fn rest_outcome(call: &Rest, r: &fake_ironic::client::Response, json_errors: bool) -> Result<Outcome, TestCaseError> {
    let what = brief(call);
    prop_assert!(r.status < 500, "{what} answered {}: {}", r.status, r.text());
    if (200..300).contains(&r.status) {
        return Ok(Outcome::Accepted);
    }
    let message = serde_json::from_slice::<Value>(&r.body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_default();
    if json_errors {
        prop_assert!(
            !message.is_empty(),
            "{what} answered {} ({:?}) without a JSON error message: {:?}",
            r.status,
            r.header("content-type"),
            r.text()
        );
        prop_assert!(
            r.header("content-type").is_some_and(|c| c.starts_with("application/json")),
            "{what} answered {} as {:?}",
            r.status,
            r.header("content-type")
        );
    }
    Ok(Outcome::Refused)
}

async fn send_rest(site: &Site, call: &Rest) -> Result<fake_ironic::client::Response, TestCaseError> {
    let what = brief(call);
    let wire = call.wire();
    let url = format!("{}{}", site.inspector, wire.target);
    bounded(&what, fake_ironic::client::send(wire.method, &url, &wire.headers, wire.body))
        .await?
        .map_err(|e| TestCaseError::fail(format!("{what} got no HTTP answer: {e}")))
}

/// Which properties of the replies a REST test checks.
#[derive(Debug, Clone, Copy)]
struct Checks {
    /// Every refusal is a JSON error.
    json_errors: bool,
    /// A refusal changes nothing.
    unchanged: bool,
}

/// Runs `calls` one after another: never a hang, a panic or a 5xx, and the `checks`.
async fn run_rest(site: &Site, setup: Setup, calls: &[Rest], checks: Checks) -> Result<(), TestCaseError> {
    site.prepare(setup).await;
    let panics = site.panics();
    for call in calls {
        let what = brief(call);
        let before = if checks.unchanged { Some(site.snapshot().await) } else { None };
        let r = send_rest(site, call).await?;
        let outcome = rest_outcome(call, &r, checks.json_errors)?;
        match before {
            Some(before) => after_call(site, &what, &before, &outcome).await?,
            None if outcome == Outcome::Accepted => site.settle().await,
            None => {}
        }
        prop_assert_eq!(site.panics(), panics, "something panicked during {}", what);
    }
    Ok(())
}

#[test]
fn rest_calls_on_hostile_input_answer_json_errors_and_refusals_change_nothing() {
    let rt = runtime("rest");
    let s = rt.block_on(site("rest"));
    // An empty identifier leaves an empty path segment: a raw path piece, the raw tests' business.
    let id = ident().prop_filter("empty segment", |i| !i.is_empty()).prop_map(|i| encode(&i)).boxed();
    let strategy = (setup(), prop::collection::vec(rest_call(id), 1..4));
    let checks = Checks { json_errors: true, unchanged: true };
    check(REGRESSIONS, "rest_hostile_input", cases(), strategy, |(setup, calls)| {
        rt.block_on(run_rest(&s, setup, &calls, checks))
    });
}

/// What a client that does not encode sends (`..`, `a/b`, `%ff`, empty segments): two properties, so that one
/// failing does not hide the other.
#[test]
fn rest_calls_with_raw_path_pieces_never_fail_and_refusals_change_nothing() {
    let rt = runtime("raw");
    let s = rt.block_on(site("raw"));
    let strategy = (setup(), prop::collection::vec(rest_call(raw_segment()), 1..4));
    let checks = Checks { json_errors: false, unchanged: true };
    check(REGRESSIONS, "rest_raw_paths_unchanged", cases(), strategy, |(setup, calls)| {
        rt.block_on(run_rest(&s, setup, &calls, checks))
    });
}

#[test]
fn rest_refusals_of_raw_path_pieces_are_json_errors() {
    let rt = runtime("raw-json");
    let s = rt.block_on(site("raw-json"));
    let strategy = (setup(), prop::collection::vec(rest_call(raw_segment()), 1..4));
    let checks = Checks { json_errors: true, unchanged: false };
    check(REGRESSIONS, "rest_raw_paths_json", cases(), strategy, |(setup, calls)| {
        rt.block_on(run_rest(&s, setup, &calls, checks))
    });
}

// --- gRPC --------------------------------------------------------------------------------------------------------

/// One call of the `Inspection` service.
#[derive(Debug, Clone)]
enum Rpc {
    Start { node: String, manage_boot: bool, maintenance_ok: bool },
    Get(String),
    Abort(String),
    Reapply(String),
    GetData { node: String, unprocessed: bool },
    List { page_size: u32, page_token: String, states: Vec<String> },
    Continue { data_json: String, node_uuid: String },
    CreateRule(String),
    GetRule(String),
    DeleteRule(String),
    ListRules,
    DeleteAllRules,
}

fn state_name() -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::sample::select(State::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>()).prop_map(str::to_owned),
        1 => prop::sample::select(vec!["", "WAITING", "bogus", " waiting", "finished,error"]).prop_map(str::to_owned),
        1 => text(),
    ]
    .boxed()
}

fn json_text(doc: BoxedStrategy<Value>) -> BoxedStrategy<String> {
    body_of(doc).prop_map(|b| String::from_utf8_lossy(&b.0).into_owned()).boxed()
}

/// `Inspection` calls whose identifiers and strings are `ident`s.
fn rpc(ident: BoxedStrategy<String>) -> BoxedStrategy<Rpc> {
    let ident = || ident.clone();
    let page_size = prop_oneof![Just(0u32), 1u32..4, Just(1000), Just(1001), any::<u32>()];
    let token = prop_oneof![Just(String::new()), ident()];
    prop_oneof![
        3 => (ident(), any::<bool>(), any::<bool>())
            .prop_map(|(node, manage_boot, maintenance_ok)| Rpc::Start { node, manage_boot, maintenance_ok }),
        2 => ident().prop_map(Rpc::Get),
        2 => ident().prop_map(Rpc::Abort),
        2 => ident().prop_map(Rpc::Reapply),
        2 => (ident(), any::<bool>()).prop_map(|(node, unprocessed)| Rpc::GetData { node, unprocessed }),
        2 => (page_size, token, prop::collection::vec(prop_oneof![4 => state_name(), 1 => ident()], 0..3))
            .prop_map(|(page_size, page_token, states)| Rpc::List { page_size, page_token, states }),
        4 => (json_text(data()), prop_oneof![3 => Just(String::new()), 1 => ident()])
            .prop_map(|(data_json, node_uuid)| Rpc::Continue { data_json, node_uuid }),
        3 => json_text(rule()).prop_map(Rpc::CreateRule),
        1 => ident().prop_map(|uuid| {
            let mut r = r1();
            r["uuid"] = json!(uuid);
            Rpc::CreateRule(r.to_string())
        }),
        2 => ident().prop_map(Rpc::GetRule),
        2 => ident().prop_map(Rpc::DeleteRule),
        1 => Just(Rpc::ListRules),
        1 => Just(Rpc::DeleteAllRules),
    ]
    .boxed()
}

/// Calls `rpc`; a successful reply is checked against its contract here.
async fn call_rpc(site: &Site, rpc: &Rpc) -> Result<Result<(), tonic::Status>, TestCaseError> {
    let what = brief(rpc);
    let mut c = site.insp();
    let node = |n: &str| NodeRequest { node: n.to_owned() };
    let r = match rpc.clone() {
        Rpc::Start { node, manage_boot, maintenance_ok } => {
            c.start(StartRequest { node, manage_boot, maintenance_ok }).await.map(|_| ())
        }
        Rpc::Get(n) => match c.get(node(&n)).await {
            Ok(s) => {
                let s = s.into_inner();
                prop_assert!(s.state.parse::<State>().is_ok(), "{what}: state {:?}", s.state);
                Ok(())
            }
            Err(e) => Err(e),
        },
        Rpc::Abort(n) => c.abort(node(&n)).await.map(|_| ()),
        Rpc::Reapply(n) => c.reapply(node(&n)).await.map(|_| ()),
        Rpc::GetData { node, unprocessed } => match c.get_data(DataRequest { node, unprocessed }).await {
            Ok(d) => {
                let d = d.into_inner();
                prop_assert!(serde_json::from_str::<Value>(&d.data_json).is_ok(), "{what}: {:?}", d.data_json);
                Ok(())
            }
            Err(e) => Err(e),
        },
        Rpc::List { page_size, page_token, states } => {
            let req = ListRequest { page_size, page_token: page_token.clone(), states: states.clone() };
            match c.list(req).await {
                Ok(l) => {
                    let l = l.into_inner();
                    let size = if page_size == 0 { 100 } else { page_size.min(1000) as usize };
                    prop_assert!(l.inspections.len() <= size, "{what}: {} listed", l.inspections.len());
                    prop_assert!(l.inspections.windows(2).all(|w| w[0].node < w[1].node), "{what}: not in order");
                    for i in &l.inspections {
                        prop_assert!(states.is_empty() || states.contains(&i.state), "{what}: listed {i:?}");
                        prop_assert!(page_token.is_empty() || i.node > page_token, "{what}: listed {i:?}");
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
        Rpc::Continue { data_json, node_uuid } => {
            c.r#continue(ContinueRequest { data_json, node_uuid }).await.map(|_| ())
        }
        Rpc::CreateRule(rule_json) => match c.create_rule(Rule { rule_json }).await {
            Ok(r) => {
                let r: Value = serde_json::from_str(&r.into_inner().rule_json).unwrap();
                let uuid = r["uuid"].as_str().unwrap_or_default().to_owned();
                prop_assert!(!uuid.is_empty(), "{what} made {r}");
                let got = c.get_rule(RuleRequest { uuid }).await;
                prop_assert!(got.is_ok(), "{what}: the rule made cannot be read back: {got:?}");
                Ok(())
            }
            Err(e) => Err(e),
        },
        Rpc::GetRule(uuid) => c.get_rule(RuleRequest { uuid }).await.map(|_| ()),
        Rpc::DeleteRule(uuid) => c.delete_rule(RuleRequest { uuid }).await.map(|_| ()),
        Rpc::ListRules => c.list_rules(ListRulesRequest {}).await.map(|_| ()),
        Rpc::DeleteAllRules => c.delete_all_rules(ListRulesRequest {}).await.map(|_| ()),
    };
    Ok(r)
}

/// Runs `rpcs` one after another: never a hang or a panic, every error one of the four codes a bad request may get,
/// and a refusal changes nothing.
async fn run_rpcs(site: &Site, setup: Setup, rpcs: &[Rpc]) -> Result<(), TestCaseError> {
    site.prepare(setup).await;
    let panics = site.panics();
    for rpc in rpcs {
        let what = brief(rpc);
        let before = site.snapshot().await;
        let r = bounded(&what, call_rpc(site, rpc)).await??;
        let outcome = match r {
            Ok(()) => Outcome::Accepted,
            Err(e) => {
                prop_assert!(
                    matches!(
                        e.code(),
                        Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition | Code::AlreadyExists
                    ),
                    "{what} failed with {:?}: {}",
                    e.code(),
                    e.message()
                );
                prop_assert!(!e.message().is_empty(), "{what} failed without a message");
                Outcome::Refused
            }
        };
        after_call(site, &what, &before, &outcome).await?;
        prop_assert_eq!(site.panics(), panics, "something panicked during {}", what);
    }
    Ok(())
}

#[test]
fn grpc_inspection_calls_on_hostile_input_fail_cleanly_and_refusals_change_nothing() {
    let rt = runtime("grpc");
    let s = rt.block_on(site("grpc"));
    // Strings up to 1000 characters here; longer ones are the next test's.
    let strategy = (setup(), prop::collection::vec(rpc(ident_with(200..1000)), 1..5));
    check(REGRESSIONS, "grpc_inspection_hostile_input", cases(), strategy, |(setup, rpcs)| {
        rt.block_on(run_rpcs(&s, setup, &rpcs))
    });
}

/// An identifier or a state of 1000 to 20000 characters (still far under gRPC's 4 MiB message limit) is refused
/// like any other: the client reads the error (a status message is a header, and HTTP/2 peers bound their header
/// lists: an error that quotes the input whole is a protocol error, not a refusal).
#[test]
fn grpc_inspection_calls_with_very_long_strings_fail_cleanly() {
    let rt = runtime("grpc-long");
    let s = rt.block_on(site("grpc-long"));
    let strategy = (setup(), prop::collection::vec(rpc(long_text(1000..20_000)), 1..3));
    check(REGRESSIONS, "grpc_inspection_long_strings", cases(), strategy, |(setup, rpcs)| {
        rt.block_on(run_rpcs(&s, setup, &rpcs))
    });
}

/// MAC-ish strings: a small pool of valid ones (the nodes' included, so lists overlap), other notations, junk.
fn mac_text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => (1u8..5).prop_map(|i| format!("52:54:00:00:00:0{i}")),
        1 => prop::sample::select(vec![MAC1, MAC2]).prop_map(str::to_owned),
        2 => (1u8..5).prop_map(|i| format!("52-54-00-00-00-0{i}")),
        1 => (1u8..5).prop_map(|i| format!("52:54:00:00:00:0{i}").to_uppercase()),
        2 => text(),
        1 => prop::sample::select(vec![
            "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "00:00:00:00:00:00", " 52:54:00:00:00:01", "52:54:00:00:00:01 ",
            "525400000001", "52:54:00:00:00:1", "52:54:00:00:00:001", "52:54:00-00:00:01", "", "é",
        ])
        .prop_map(str::to_owned),
    ]
    .boxed()
}

fn reason() -> BoxedStrategy<String> {
    prop_oneof![
        4 => Just(String::new()),
        2 => Just("api".to_owned()),
        2 => prop_oneof![Just(format!("inspection:{N1}")), Just("ironic".to_owned()), "inspection:[0-9a-f-]{1,36}"],
        2 => text(),
        1 => prop::sample::select(vec!["x".repeat(128), "x".repeat(129), "a b".into(), "\u{7f}".into()]),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
struct Update {
    allow: Vec<String>,
    deny: Vec<String>,
    remove: Vec<String>,
    remove_reason: String,
    /// Over the per-request limit: this many more copies of a valid MAC in `allow` (not printed).
    flood: usize,
}

fn update() -> BoxedStrategy<Update> {
    let list = || prop::collection::vec(mac_text(), 0..4);
    (list(), list(), list(), reason(), prop_oneof![40 => Just(0usize), 1 => Just(MAX_MACS_PER_REQUEST + 1)])
        .prop_map(|(allow, deny, remove, remove_reason, flood)| Update { allow, deny, remove, remove_reason, flood })
        .boxed()
}

/// The rule, written independently of the server: every MAC parses, no MAC in two lists, at most
/// `MAX_MACS_PER_REQUEST`, a reason to remove (default `api`) of 1 to 128 printable ASCII characters that comes
/// with MACs to remove.
fn acceptable(u: &Update, allow: &[String]) -> bool {
    let reason = if u.remove_reason.is_empty() { "api" } else { u.remove_reason.as_str() };
    if reason != "api" && u.remove.is_empty() {
        return false;
    }
    let reason_ok = reason.len() <= 128 && reason.bytes().all(|b| b.is_ascii_graphic());
    let count_ok = allow.len() + u.deny.len() + u.remove.len() <= MAX_MACS_PER_REQUEST;
    let parse = |v: &[String]| v.iter().map(|s| s.parse::<MacAddr>().ok()).collect::<Option<BTreeSet<MacAddr>>>();
    let (Some(a), Some(d), Some(r)) = (parse(allow), parse(&u.deny), parse(&u.remove)) else { return false };
    reason_ok && count_ok && a.is_disjoint(&d) && a.is_disjoint(&r) && d.is_disjoint(&r)
}

type Entries = BTreeMap<String, (Vec<String>, Vec<String>)>;

fn entries(s: &FilterState) -> Entries {
    s.entries.iter().map(|e| (e.mac.clone(), (e.allow_reasons.clone(), e.deny_reasons.clone()))).collect()
}

#[test]
fn update_pxe_filters_through_the_server_is_accepted_exactly_when_valid_and_changes_only_what_it_names() {
    let rt = runtime("filters");
    let s = rt.block_on(site("filters"));
    let check_cases = cases() * 3;
    check(REGRESSIONS, "grpc_update_pxe_filters", check_cases, update(), |u| {
        rt.block_on(async {
            let panics = s.panics();
            let before = s.snapshot().await;
            let mut allow = u.allow.clone();
            allow.extend(std::iter::repeat_n("52:54:00:00:00:09".to_owned(), u.flood));
            let valid = acceptable(&u, &allow);
            let req = UpdatePxeFiltersRequest {
                allow,
                deny: u.deny.clone(),
                remove: u.remove.clone(),
                remove_reason: u.remove_reason.clone(),
            };
            let r = bounded("UpdatePxeFilters", s.filters().update_pxe_filters(req)).await?;
            let after = s.snapshot().await;
            prop_assert_eq!(s.panics(), panics, "something panicked");
            match r {
                Err(e) => {
                    prop_assert!(!valid, "a valid request was refused: {:?} {}", e.code(), e.message());
                    prop_assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
                    let d = before.differences(&after);
                    prop_assert!(d.is_empty(), "a refused update changed\n{}", d.join("\n"));
                }
                Ok(reply) => {
                    let reply = reply.into_inner();
                    prop_assert!(valid, "an invalid request was accepted: {reply:?}");
                    let canonical = |v: &[String]| -> BTreeSet<String> {
                        v.iter().map(|m| m.parse::<MacAddr>().unwrap().to_string()).collect()
                    };
                    let (a, d, r) = (canonical(&u.allow), canonical(&u.deny), canonical(&u.remove));
                    let reason = if u.remove_reason.is_empty() { "api" } else { u.remove_reason.as_str() };
                    let (old, new) = (entries(&before.filters), entries(&after.filters));
                    let empty = (vec![], vec![]);
                    for (mac, (allows, denies)) in &new {
                        if !(a.contains(mac) || d.contains(mac) || r.contains(mac)) {
                            prop_assert_eq!(Some(&(allows.clone(), denies.clone())), old.get(mac), "{} changed", mac);
                        }
                    }
                    for (mac, e) in &old {
                        if !(a.contains(mac) || d.contains(mac) || r.contains(mac)) {
                            prop_assert_eq!(Some(e), new.get(mac), "{} changed", mac);
                        }
                    }
                    for mac in &a {
                        let (allows, denies) = new.get(mac).unwrap_or(&empty);
                        prop_assert!(allows.iter().any(|x| x == "api") && !denies.iter().any(|x| x == "api"), "{mac}");
                    }
                    for mac in &d {
                        let (allows, denies) = new.get(mac).unwrap_or(&empty);
                        prop_assert!(denies.iter().any(|x| x == "api") && !allows.iter().any(|x| x == "api"), "{mac}");
                    }
                    for mac in &r {
                        let (allows, denies) = new.get(mac).unwrap_or(&empty);
                        prop_assert!(!allows.iter().chain(denies).any(|x| x == reason), "{mac} kept {reason}");
                    }
                    let bumped = u64::from(reply.changed > 0);
                    prop_assert_eq!(after.filters.revision, before.filters.revision + bumped, "{:?}", reply);
                    prop_assert_eq!(reply.revision, after.filters.revision);
                    prop_assert_eq!(&before.inspections, &after.inspections);
                    prop_assert_eq!(&before.rules, &after.rules);
                }
            }
            Ok(())
        })
    });
}
