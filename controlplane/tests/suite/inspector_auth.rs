//! The ironic-inspector v1 REST API's access control over real HTTP(S), in-process against the fake Ironic and a
//! stand-in Keystone: every operator call refused without credentials, with a wrong password, with an unknown,
//! expired or role-less token — and nothing changed in the filter state or in Ironic; `POST /v1/continue` open but
//! bounded (413), rate-limited (429), accepted only for a waiting node and naming no other; HTTPS with a test CA;
//! and no password, token or bcrypt hash in any log line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use fake_ironic::{FakeIronic, Port};
use ironguard_controlplane::ControlPlaneConfig;
use ironguard_controlplane::http_access::{AuthStrategy, Secret};
use ironguard_inspection::machine::State;
use ironguard_inspection::records::NodeRecord;
use ironguard_proto::v1::inspection_client::InspectionClient;
use ironguard_proto::v1::{NodeRequest, StartRequest};
use serde_json::{Value, json};

const N1: &str = "11111111-1111-1111-1111-111111111111";
const MAC1: &str = "52:54:00:aa:00:01";
const N2: &str = "22222222-2222-2222-2222-222222222222";
const MAC2: &str = "52:54:00:aa:00:02";

const USER: &str = "operator";
const PASSWORD: &str = "correct horse battery staple";
const WRONG_PASSWORD: &str = "Tr0ub4dor&3-wrong";

// ---------------------------------------------------------------------------------------------------------------
// Log capture: every test's log lines (trace level for ironguard) land in one buffer, searched for secrets.

static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("ironguard_controlplane=trace,debug"))
            .with_ansi(false)
            .with_writer(move || LogWriter(w.clone()))
            .try_init();
        buf
    });
}

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.get().unwrap().lock().unwrap()).into_owned()
}

/// No secret, nor its base64 form, in any log line so far.
fn assert_no_secret_logged(secrets: &[&str]) {
    let text = logs();
    assert!(text.contains("ironic-inspector v1 API serving"), "the capture works: {text}");
    for s in secrets {
        assert!(!s.is_empty());
        assert!(!text.contains(s), "{s:?} appears in the log");
        let b64 = base64::engine::general_purpose::STANDARD.encode(s);
        assert!(!text.contains(&b64), "{s:?} appears base64-encoded in the log");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The site: fake Ironic, control plane with the inspector API, a stand-in leader agent.

use crate::site_support;
use site_support::{Site, node};

fn test_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ig-insp-auth-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The site with N1 and N2 (manageable, one port each) in the fake Ironic, logs captured.
async fn site(tag: &str, tweak: impl FnOnce(&mut ControlPlaneConfig, &std::path::Path)) -> Site {
    capture_logs();
    let ironic = FakeIronic::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    ironic.add_node(node(N1, "manageable", "10.0.0.1"));
    ironic.add_port(Port { address: MAC1.into(), node_uuid: N1.into(), ..Default::default() }).unwrap();
    ironic.add_node(node(N2, "manageable", "10.0.0.2"));
    ironic.add_port(Port { address: MAC2.into(), node_uuid: N2.into(), ..Default::default() }).unwrap();
    // The tests below send many wrong credentials from one address on purpose; the per-source budget of failed
    // authentications has its own test, `junk_credentials_spend_a_budget_then_get_429_unchecked`.
    let s = site_support::start(tag, ironic, |c, dir| {
        c.inspector_api.auth_failure_burst = 100_000;
        tweak(c, dir)
    })
    .await;
    // Both machines boot through the filter whenever they are inspected (the evidence their ramdisks' data needs;
    // its refusals have their own test, `inspection.rs::ramdisk_data_needs_evidence_...`).
    s.boot(MAC1).await;
    s.boot(MAC2).await;
    s
}

impl Site {
    fn u(&self, path: &str) -> String {
        format!("{}{path}", self.inspector)
    }

    async fn node_state(&self, node: &str) -> Option<String> {
        InspectionClient::new(self.channel.clone())
            .get(NodeRequest { node: node.into() })
            .await
            .ok()
            .map(|r| r.into_inner().state)
    }

    async fn wait_node_state(&self, node: &str, want: &str) {
        let t = Instant::now();
        while self.node_state(node).await.as_deref() != Some(want) {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "{node} never reached {want}: {:?}",
                self.node_state(node).await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What must not move while calls are refused: the filter revision, both nodes' inspection state, the rules,
    /// the queue, and both nodes in Ironic.
    async fn refused_snapshot(&self) -> Snapshot {
        let rules = self.engine.list_rules().await.unwrap().iter().map(|r| r.uuid.clone()).collect();
        // From the store: the gRPC Get of a node without a record asks Ironic.
        let state = |n: &'static str| async move {
            self.engine.store.get(n).await.unwrap().map(|r| r.state.as_str().to_string())
        };
        Snapshot {
            revision: self.revision().await,
            states: (state(N1).await, state(N2).await),
            rules,
            pending: self.engine.store.pending().await.unwrap().len(),
            nodes: (self.ironic.node(N1).map(|n| format!("{n:?}")), self.ironic.node(N2).map(|n| format!("{n:?}"))),
        }
    }
}

#[derive(Debug, PartialEq)]
struct Snapshot {
    revision: u64,
    states: (Option<String>, Option<String>),
    rules: Vec<String>,
    pending: usize,
    nodes: (Option<String>, Option<String>),
}

/// What ironic-python-agent sends for a one-NIC machine booted from `mac`.
fn data_for(mac: &str, bmc: &str) -> String {
    json!({
        "inventory": {
            "interfaces": [{"name": "eth0", "mac_address": mac, "ipv4_address": "192.0.2.10"}],
            "cpu": {"count": 4, "architecture": "x86_64"},
            "memory": {"physical_mb": 8192, "total": 8_000_000_000u64},
            "disks": [{"name": "/dev/sda", "size": 64_424_509_440u64, "rotational": false}],
            "bmc_address": bmc,
        },
        "root_disk": {"name": "/dev/sda", "size": 64_424_509_440u64, "rotational": false},
        "boot_interface": format!("01-{}", mac.replace(':', "-")),
    })
    .to_string()
}

const RULE: &str =
    r#"{"description": "mark", "actions": [{"action": "set-attribute", "path": "/extra/seen", "value": "yes"}]}"#;

/// Every operator call, with a body where it takes one. `rule` is an existing rule's UUID.
fn operator_calls(rule: &str) -> Vec<(reqwest::Method, String, Option<&'static str>)> {
    use reqwest::Method;
    vec![
        (Method::GET, "/v1/introspection".into(), None),
        (Method::GET, format!("/v1/introspection/{N1}"), None),
        (Method::POST, format!("/v1/introspection/{N1}"), None),
        (Method::POST, format!("/v1/introspection/{N1}?manage_boot=false"), None),
        (Method::POST, format!("/v1/introspection/{N2}/abort"), None),
        (Method::GET, format!("/v1/introspection/{N1}/data"), None),
        (Method::GET, format!("/v1/introspection/{N1}/data/unprocessed"), None),
        (Method::POST, format!("/v1/introspection/{N1}/data/unprocessed"), None),
        (Method::GET, "/v1/rules".into(), None),
        (Method::POST, "/v1/rules".into(), Some(RULE)),
        (Method::DELETE, "/v1/rules".into(), None),
        (Method::GET, format!("/v1/rules/{rule}"), None),
        (Method::DELETE, format!("/v1/rules/{rule}"), None),
        // Not a method of the route: refused before the 405 says anything.
        (Method::PUT, "/v1/rules".into(), Some(RULE)),
    ]
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

/// Sends every operator call with `headers` and expects `status` and an ironic-inspector JSON error for each.
async fn refuse_all(
    s: &Site,
    http: &reqwest::Client,
    rule: &str,
    headers: &[(&str, &str)],
    status: u16,
    challenge: Option<&str>,
) {
    for (method, path, body) in operator_calls(rule) {
        let mut req = http.request(method.clone(), s.u(&path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.header("Content-Type", "application/json").body(b);
        }
        let r = req.send().await.unwrap();
        let what = format!("{method} {path} with {:?}", headers.iter().map(|h| h.0).collect::<Vec<_>>());
        assert_eq!(r.status().as_u16(), status, "{what}");
        if let Some(c) = challenge {
            assert_eq!(r.headers().get("WWW-Authenticate").map(|v| v.to_str().unwrap()), Some(c), "{what}");
        }
        assert!(r.headers().contains_key("X-OpenStack-Ironic-Inspector-API-Maximum-Version"), "{what}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"]["message"].is_string(), "{what}: {e}");
    }
}

/// The open calls answer without credentials.
async fn open_calls_answer(s: &Site, http: &reqwest::Client) {
    for p in ["/", "/v1", "/v1/"] {
        let r = http.get(s.u(p)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{p}");
    }
}

/// Makes N2's inspection waiting (through gRPC), then a rule through the REST API with `auth` headers; clears the
/// fake Ironic's call log. Returns the rule's UUID.
async fn prepare(s: &Site, http: &reqwest::Client, auth: &[(&str, &str)]) -> String {
    InspectionClient::new(s.channel.clone())
        .start(StartRequest { node: N2.into(), manage_boot: false, ..Default::default() })
        .await
        .unwrap();
    s.wait_node_state(N2, "waiting").await;
    let mut req = http.post(s.u("/v1/rules")).header("X-OpenStack-Ironic-Inspector-API-Version", "1.6").body(RULE);
    for (k, v) in auth {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 201);
    let rule: Value = r.json().await.unwrap();
    s.ironic.clear_calls();
    rule["uuid"].as_str().unwrap().to_string()
}

/// The refused calls changed nothing: same filter revision, states, rules and queue; no call reached Ironic.
async fn assert_unchanged(s: &Site, before: &Snapshot) {
    // Anything a refused call had set off would show within this.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(&s.refused_snapshot().await, before);
    assert_eq!(s.ironic.calls(), vec![], "no call reached Ironic (no power, no boot device)");
    assert!(s.allow_reasons(MAC1).await.is_empty(), "N1 was never allowed");
}

/// Accepted with good credentials: the whole flow on N1, through the REST API.
async fn operator_flow(s: &Site, http: &reqwest::Client, auth: &[(&str, &str)], rule: &str) {
    let send = |m: reqwest::Method, p: String| {
        let mut req = http.request(m, s.u(&p));
        for (k, v) in auth {
            req = req.header(*k, *v);
        }
        req.send()
    };
    use reqwest::Method;
    assert_eq!(send(Method::GET, "/v1/rules".into()).await.unwrap().status(), 200);
    assert_eq!(send(Method::GET, format!("/v1/rules/{rule}")).await.unwrap().status(), 200);
    assert_eq!(send(Method::POST, format!("/v1/introspection/{N1}")).await.unwrap().status(), 202);
    s.wait_node_state(N1, "waiting").await;
    assert_eq!(s.ironic.power_state(N1).as_deref(), Some("power on"), "the accepted start powered N1");
    let st: Value = send(Method::GET, format!("/v1/introspection/{N1}")).await.unwrap().json().await.unwrap();
    assert_eq!(st["state"], "waiting");
    // The ramdisk needs no credentials.
    let r = http.post(s.u("/v1/continue")).body(data_for(MAC1, "10.0.0.1")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["uuid"], N1);
    s.wait_node_state(N1, "finished").await;
    assert_eq!(send(Method::GET, format!("/v1/introspection/{N1}/data")).await.unwrap().status(), 200);
    assert_eq!(send(Method::GET, format!("/v1/introspection/{N1}/data/unprocessed")).await.unwrap().status(), 200);
    assert_eq!(send(Method::POST, format!("/v1/introspection/{N1}/data/unprocessed")).await.unwrap().status(), 202);
    let l: Value = send(Method::GET, "/v1/introspection".into()).await.unwrap().json().await.unwrap();
    assert_eq!(l["introspection"].as_array().unwrap().len(), 2);
    assert_eq!(send(Method::POST, format!("/v1/introspection/{N2}/abort")).await.unwrap().status(), 202);
    assert_eq!(send(Method::DELETE, format!("/v1/rules/{rule}")).await.unwrap().status(), 204);
    assert_eq!(send(Method::DELETE, "/v1/rules".into()).await.unwrap().status(), 204);
    assert_eq!(s.ironic.node(N1).unwrap().extra.get("seen"), Some(&json!("yes")), "the rule ran");
}

fn write_htpasswd(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    // Cost 4 keeps the debug build quick; the file is what `htpasswd -B` writes ($2y$).
    let hash = bcrypt::hash(PASSWORD, 4).unwrap().replacen("$2b$", "$2y$", 1);
    let other = bcrypt::hash("another", 4).unwrap();
    let file = dir.join("htpasswd");
    std::fs::write(&file, format!("# ironguard operators\n{USER}:{hash}\nreader:{other}\n")).unwrap();
    (file, hash)
}

// ---------------------------------------------------------------------------------------------------------------

/// `http_basic`: every operator call refused without credentials, with a wrong password, an unknown user or a
/// mangled header, and nothing changes; accepted with the right password. No secret is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_basic_guards_every_operator_call() {
    let mut hash = String::new();
    let s = site("basic", |c, dir| {
        let (file, h) = write_htpasswd(dir);
        hash = h;
        c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
        c.inspector_api.http_basic_auth_user_file = file.display().to_string();
    })
    .await;
    let http = reqwest::Client::new();
    let good = basic(USER, PASSWORD);
    open_calls_answer(&s, &http).await;
    let rule = prepare(&s, &http, &[("Authorization", &good)]).await;
    let before = s.refused_snapshot().await;

    let challenge = Some("Basic realm=\"ironguard\"");
    refuse_all(&s, &http, &rule, &[], 401, challenge).await;
    refuse_all(&s, &http, &rule, &[("Authorization", &basic(USER, WRONG_PASSWORD))], 401, challenge).await;
    refuse_all(&s, &http, &rule, &[("Authorization", &basic("mallory", PASSWORD))], 401, challenge).await;
    refuse_all(&s, &http, &rule, &[("Authorization", &basic(USER, ""))], 401, challenge).await;
    // The hash itself is no password.
    refuse_all(&s, &http, &rule, &[("Authorization", &basic(USER, &hash))], 401, challenge).await;
    // Malformed headers and other schemes: 400, as Ironic answers them.
    refuse_all(&s, &http, &rule, &[("Authorization", "Basic !!notbase64")], 400, None).await;
    refuse_all(&s, &http, &rule, &[("Authorization", "Bearer some-token")], 400, None).await;
    refuse_all(&s, &http, &rule, &[("X-Auth-Token", "some-token")], 401, challenge).await;
    assert_unchanged(&s, &before).await;
    let r = http.get(s.u("/v1/introspection")).send().await.unwrap();
    let e: Value = r.json().await.unwrap();
    assert_eq!(e, json!({"error": {"message": "Authorization required"}}));

    operator_flow(&s, &http, &[("Authorization", &good)], &rule).await;
    assert_no_secret_logged(&[PASSWORD, WRONG_PASSWORD, &hash, &good["Basic ".len()..]]);
    let text = logs();
    assert!(text.contains("HTTP basic authentication failed: wrong password"), "refusals are logged");
}

/// Wrong credentials from one address spend its budget of failed authentications; past it, every operator call
/// from there is answered 429 with `Retry-After` before any bcrypt check (the refusal counters show bcrypt ran
/// only for the budget), right credentials included; another address is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn junk_credentials_spend_a_budget_then_get_429_unchecked() {
    let s = site("auth-budget", |c, dir| {
        let (file, _) = write_htpasswd(dir);
        c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
        c.inspector_api.http_basic_auth_user_file = file.display().to_string();
        c.inspector_api.auth_failure_burst = 3;
        c.inspector_api.auth_failures_per_minute = 1;
    })
    .await;
    let http = reqwest::Client::new();
    let get = |auth: String| {
        let req = http.get(s.u("/v1/introspection")).header("Authorization", auth);
        async move { req.send().await.unwrap() }
    };
    // A right password spends nothing.
    assert_eq!(get(basic(USER, PASSWORD)).await.status(), 200);
    for i in 0..3 {
        assert_eq!(get(basic(USER, &format!("junk-{i}"))).await.status(), 401, "attempt {i}");
    }
    for auth in [basic(USER, "junk-3"), basic("mallory", "x"), basic(USER, PASSWORD)] {
        let r = get(auth).await;
        assert_eq!(r.status(), 429);
        let wait: u64 = r.headers()["Retry-After"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"]["message"].as_str().unwrap().contains("Too many failed authentication attempts"), "{e}");
    }
    let m = s.metrics().await;
    assert!(m.contains("ironguard_controlplane_refusals_total{kind=\"basic-password\"} 3\n"), "{m}");
    assert!(m.contains("ironguard_controlplane_refusals_total{kind=\"auth-failures\"} 3\n"), "{m}");
    // Another address has its own budget (127.0.0.2 is loopback as well).
    let other =
        reqwest::Client::builder().local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let r = other.get(s.u("/v1/introspection")).header("Authorization", basic(USER, PASSWORD)).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// The htpasswd file is read again when it changes: a new user works at once, a removed one is refused, and a
/// broken file refuses everyone (500) until fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_basic_reloads_the_user_file() {
    let mut path = std::path::PathBuf::new();
    let s = site("reload", |c, dir| {
        let (file, _) = write_htpasswd(dir);
        path = file.clone();
        c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
        c.inspector_api.http_basic_auth_user_file = file.display().to_string();
    })
    .await;
    let http = reqwest::Client::new();
    let get = |auth: String| http.get(s.u("/v1/rules")).header("Authorization", auth).send();
    assert_eq!(get(basic(USER, PASSWORD)).await.unwrap().status(), 200);
    std::fs::write(&path, format!("newbie:{}\n", bcrypt::hash("fresh", 4).unwrap())).unwrap();
    assert_eq!(get(basic("newbie", "fresh")).await.unwrap().status(), 200);
    assert_eq!(get(basic(USER, PASSWORD)).await.unwrap().status(), 401, "removed, even though cached before");
    std::fs::write(&path, "newbie:$apr1$notbcrypt$xxxxxxxxxxxxxxxxxxxxxx\n").unwrap();
    let r = get(basic("newbie", "fresh")).await.unwrap();
    assert_eq!(r.status(), 500);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(!msg.contains("apr1"), "{msg}");
    assert!(logs().contains("line 1"), "the log names the bad line");
    assert!(!logs().contains("$apr1$notbcrypt"), "but not its hash");
    std::fs::write(&path, format!("newbie:{}\n", bcrypt::hash("fresh", 4).unwrap())).unwrap();
    assert_eq!(get(basic("newbie", "fresh")).await.unwrap().status(), 200);
}

// ---------------------------------------------------------------------------------------------------------------
// A stand-in Keystone that speaks the two calls ironguard makes.

const SERVICE_USER: &str = "ironguard";
const SERVICE_PASSWORD: &str = "svc-pass-5ecret";
const ADMIN_TOKEN: &str = "gAAAAAB-admin-token-0123456789";
const READER_TOKEN: &str = "gAAAAAB-reader-token-0123456789";
const EXPIRED_TOKEN: &str = "gAAAAAB-expired-token-0123456789";
const UNKNOWN_TOKEN: &str = "gAAAAAB-unknown-token-0123456789";

#[derive(Default)]
struct Keystone {
    /// Service tokens Keystone accepts in `X-Auth-Token`.
    service_tokens: HashSet<String>,
    /// The service user's password no longer works.
    refuse_logins: bool,
    issued: usize,
    validations: usize,
    /// User tokens: token → body of `GET /v3/auth/tokens`.
    tokens: HashMap<String, Value>,
}

fn token_body(user: &str, roles: &[&str], expires_at: &str) -> Value {
    json!({"token": {
        "expires_at": expires_at,
        "issued_at": "2020-01-01T00:00:00.000000Z",
        "methods": ["password"],
        "user": {"id": format!("{user}-id"), "name": user, "domain": {"id": "default", "name": "Default"}},
        "project": {"id": "p1", "name": "baremetal", "domain": {"id": "default", "name": "Default"}},
        "roles": roles.iter().map(|r| json!({"id": format!("{r}-id"), "name": r})).collect::<Vec<_>>(),
    }})
}

async fn keystone() -> (String, Arc<Mutex<Keystone>>) {
    use axum::routing::post;
    let ks = Arc::new(Mutex::new(Keystone::default()));
    {
        let mut k = ks.lock().unwrap();
        k.tokens.insert(ADMIN_TOKEN.into(), token_body("alice", &["member", "Admin"], "2099-01-01T00:00:00.000000Z"));
        k.tokens.insert(READER_TOKEN.into(), token_body("bob", &["reader", "member"], "2099-01-01T00:00:00.000000Z"));
        k.tokens.insert(EXPIRED_TOKEN.into(), token_body("carol", &["admin"], "2001-01-01T00:00:00.000000Z"));
    }
    let login = {
        let ks = ks.clone();
        move |body: axum::Json<Value>| async move {
            let user = &body["auth"]["identity"]["password"]["user"];
            let ok = body["auth"]["identity"]["methods"] == json!(["password"])
                && user["name"] == SERVICE_USER
                && user["password"] == SERVICE_PASSWORD
                && user["domain"]["name"] == "Default"
                && body["auth"]["scope"]["project"]["name"] == "service";
            let mut k = ks.lock().unwrap();
            if !ok || k.refuse_logins {
                return (StatusCode::UNAUTHORIZED, HeaderMap::new(), axum::Json(json!({"error": {"code": 401}})));
            }
            k.issued += 1;
            let token = format!("svc-token-{}", k.issued);
            k.service_tokens.insert(token.clone());
            let mut h = HeaderMap::new();
            h.insert("X-Subject-Token", token.parse().unwrap());
            (StatusCode::CREATED, h, axum::Json(token_body(SERVICE_USER, &["service"], "2099-01-01T00:00:00Z")))
        }
    };
    let validate = {
        let ks = ks.clone();
        move |h: HeaderMap| async move {
            let mut k = ks.lock().unwrap();
            let service = h.get("X-Auth-Token").and_then(|v| v.to_str().ok()).unwrap_or_default();
            if !k.service_tokens.contains(service) {
                return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": {"code": 401}})));
            }
            k.validations += 1;
            let subject = h.get("X-Subject-Token").and_then(|v| v.to_str().ok()).unwrap_or_default();
            match k.tokens.get(subject) {
                Some(body) => (StatusCode::OK, axum::Json(body.clone())),
                None => (StatusCode::NOT_FOUND, axum::Json(json!({"error": {"code": 404}}))),
            }
        }
    };
    let app = axum::Router::new().route("/v3/auth/tokens", post(login).get(validate));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, ks)
}

fn keystone_config(c: &mut ControlPlaneConfig, url: &str) {
    c.inspector_api.auth_strategy = AuthStrategy::Keystone;
    c.inspector_api.keystone_url = url.into();
    c.inspector_api.keystone_username = SERVICE_USER.into();
    c.inspector_api.keystone_password = Secret::new(SERVICE_PASSWORD);
    c.inspector_api.keystone_project_name = "service".into();
    c.inspector_api.keystone_roles = vec!["admin".into(), "baremetal_admin".into()];
}

/// `keystone`: missing, unknown and expired tokens are 401 with Keystone's challenge, a token without a required
/// role 403, for every operator call, and nothing changes; a good token works, validations are cached, a service
/// token Keystone stops accepting is renewed, Keystone down is 503. No token or password is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keystone_guards_every_operator_call() {
    let (ks_url, ks) = keystone().await;
    let s = site("keystone", |c, _| keystone_config(c, &ks_url)).await;
    let http = reqwest::Client::new();
    open_calls_answer(&s, &http).await;
    let rule = prepare(&s, &http, &[("X-Auth-Token", ADMIN_TOKEN)]).await;
    let before = s.refused_snapshot().await;

    let challenge = format!("Keystone uri=\"{ks_url}\"");
    let ch = Some(challenge.as_str());
    refuse_all(&s, &http, &rule, &[], 401, ch).await;
    refuse_all(&s, &http, &rule, &[("X-Auth-Token", UNKNOWN_TOKEN)], 401, ch).await;
    refuse_all(&s, &http, &rule, &[("X-Auth-Token", EXPIRED_TOKEN)], 401, ch).await;
    refuse_all(&s, &http, &rule, &[("X-Auth-Token", READER_TOKEN)], 403, None).await;
    // Basic credentials mean nothing here.
    refuse_all(&s, &http, &rule, &[("Authorization", &basic(USER, PASSWORD))], 401, ch).await;
    assert_unchanged(&s, &before).await;

    // Each token was asked about once: the rest came from the cache.
    let asked = ks.lock().unwrap().validations;
    assert!(asked <= 5, "validations are cached: {asked}");

    operator_flow(&s, &http, &[("X-Auth-Token", ADMIN_TOKEN)], &rule).await;
    assert_eq!(ks.lock().unwrap().issued, 1, "one service token for all of it");

    // Keystone stops accepting the service token: ironguard logs in again and carries on.
    ks.lock().unwrap().service_tokens.clear();
    let fresh = "gAAAAAB-fresh-admin-token";
    ks.lock().unwrap().tokens.insert(fresh.into(), token_body("dave", &["baremetal_admin"], "2099-01-01T00:00:00Z"));
    let r = http.get(s.u("/v1/rules")).header("X-Auth-Token", fresh).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(ks.lock().unwrap().issued, 2);

    // The service user's password stops working: 503, fail closed; nothing cached, so it works again after.
    {
        let mut k = ks.lock().unwrap();
        k.service_tokens.clear();
        k.refuse_logins = true;
        k.tokens.insert("gAAAAAB-other".into(), token_body("erin", &["admin"], "2099-01-01T00:00:00Z"));
    }
    let r = http.get(s.u("/v1/rules")).header("X-Auth-Token", "gAAAAAB-other").send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["message"],
        "The Keystone service is temporarily unavailable."
    );
    ks.lock().unwrap().refuse_logins = false;
    let r = http.get(s.u("/v1/rules")).header("X-Auth-Token", "gAAAAAB-other").send().await.unwrap();
    assert_eq!(r.status(), 200);

    assert_no_secret_logged(&[
        SERVICE_PASSWORD,
        ADMIN_TOKEN,
        READER_TOKEN,
        EXPIRED_TOKEN,
        UNKNOWN_TOKEN,
        fresh,
        "svc-token-1",
        "svc-token-2",
    ]);
}

/// Keystone unreachable: operator calls are refused with 503, never let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keystone_unreachable_fails_closed() {
    // A port nothing listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let s = site("ks-down", |c, _| {
        keystone_config(c, &url);
        c.inspector_api.keystone_timeout_ms = 2000;
    })
    .await;
    let http = reqwest::Client::new();
    let before = s.refused_snapshot().await;
    s.ironic.clear_calls();
    refuse_all(&s, &http, "00000000-0000-0000-0000-000000000000", &[("X-Auth-Token", ADMIN_TOKEN)], 503, None).await;
    assert_unchanged(&s, &before).await;
}

// ---------------------------------------------------------------------------------------------------------------

/// `POST /v1/continue` stays open, but: over the size limit 413 (by Content-Length or chunked), over the rate 429
/// with Retry-After, a node that is not waiting refused without being named — and none of it changes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn continue_is_bounded_rate_limited_and_discreet() {
    let (file_dir, mut file) = (test_dir("continue-htpasswd"), std::path::PathBuf::new());
    let s = site("continue", |c, _| {
        let (f, _) = write_htpasswd(&file_dir);
        file = f;
        c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
        c.inspector_api.http_basic_auth_user_file = file.display().to_string();
        c.inspector_api.continue_max_bytes = 64 << 10;
        c.inspector_api.continue_rate_per_minute = 1;
        c.inspector_api.continue_rate_burst = 4;
    })
    .await;
    let http = reqwest::Client::new();
    InspectionClient::new(s.channel.clone())
        .start(StartRequest { node: N1.into(), manage_boot: true, ..Default::default() })
        .await
        .unwrap();
    s.wait_node_state(N1, "waiting").await;
    // N2's inspection is starting (as if its worker were busy powering it on): not waiting for data.
    let mut rec = NodeRecord::new(N2, ironguard_proto::time::now_ms());
    rec.state = State::Starting;
    rec.macs = vec![MAC2.parse().unwrap()];
    rec.bmc_addresses = vec!["10.0.0.2".into()];
    s.engine.store.save(&mut rec).await.unwrap();
    s.ironic.clear_calls();
    let before = s.refused_snapshot().await;

    // 1: over the limit, by Content-Length.
    let mut big = data_for(MAC1, "10.0.0.1");
    big.insert_str(1, &format!("\"logs\": \"{}\",", "A".repeat(100 << 10)));
    let r = http.post(s.u("/v1/continue")).body(big.clone()).send().await.unwrap();
    assert_eq!(r.status(), 413);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("over 65536 bytes"), "{msg}");
    // 2: over the limit, chunked (no Content-Length): counted as it arrives.
    let (status, _) = raw_chunked_post(&s.inspector, &big).await;
    assert_eq!(status, 413);
    // 3: a node that is starting: refused, neither its UUID nor its BMC address nor its MAC in the reply.
    let r = http.post(s.u("/v1/continue")).body(data_for(MAC2, "10.0.0.2")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("No node is waiting for introspection data"), "{msg}");
    for secret in [N2, N1] {
        assert!(!msg.contains(secret), "{msg}");
    }
    // 4: the burst is spent.
    let r = http.post(s.u("/v1/continue")).body(data_for(MAC1, "10.0.0.1")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // 5: over the rate: 429 with Retry-After, and the data (good data of a waiting node) is not taken.
    let r = http.post(s.u("/v1/continue")).body(data_for(MAC1, "10.0.0.1")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["Retry-After"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("retry in"));
    s.wait_node_state(N1, "finished").await;
    // Only the one accepted submission ran: N2 untouched, N1 processed once.
    assert_eq!(s.node_state(N2).await.as_deref(), Some("starting"));
    // (The request is consumed just after the state is saved.)
    let t = Instant::now();
    while s.engine.store.pending().await.unwrap().len() != before.pending {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", s.engine.store.pending().await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let power_calls = s.ironic.calls().into_iter().filter(|c| c.path.contains("/states/power")).count();
    assert_eq!(power_calls, 1, "one power-off, for the accepted data");
    // Another source has its own bucket (127.0.0.2 is loopback too); a finished node is "not waiting", unnamed.
    let other = reqwest::Client::builder().local_address(std::net::IpAddr::from([127, 0, 0, 2])).build().unwrap();
    let r = other.post(s.u("/v1/continue")).body(data_for(MAC1, "10.0.0.1")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("No node is waiting for introspection data") && !msg.contains(N1), "{msg}");
    // A machine nobody knows: ironic-inspector's message, with the caller's own attributes only.
    let r = other.post(s.u("/v1/continue")).body(data_for("52:54:00:99:99:99", "10.9.9.9")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("Could not find a node for attributes") && msg.contains("52:54:00:99:99:99"), "{msg}");
    for secret in [N1, N2, MAC1, MAC2, "10.0.0.1", "10.0.0.2"] {
        assert!(!msg.contains(secret), "{msg}");
    }
    let _ = std::fs::remove_dir_all(&file_dir);
}

/// `POST /v1/continue` with a chunked body (no Content-Length), over a raw connection. Returns the status and
/// the body.
async fn raw_chunked_post(base: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "POST /v1/continue HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in body.as_bytes().chunks(8192) {
        write!(req, "{:x}\r\n", chunk.len()).unwrap();
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    tcp.write_all(&req).await.unwrap();
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// A hostile machine on the PXE network: bodies over the value bound or naming too many MACs are refused and change
/// nothing; 40 connections that send their headers and then dribble (from 40 addresses, as the measured attack)
/// neither hold a legitimate callback back nor memory: it is answered while all of them are still open, and they
/// are answered 408 at their read deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn continue_holds_out_against_complex_bodies_and_slow_senders() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let s = site("continue-hostile", |c, _| {
        c.inspector_api.insecure = true;
        c.inspector_api.continue_max_bytes = 64 << 10;
        c.inspector_api.continue_memory_mib = 1;
        c.inspector_api.continue_max_values = 5000;
        c.inspector_api.continue_read_timeout_secs = 8;
        c.inspector_api.continue_rate_burst = 1000;
    })
    .await;
    let http = reqwest::Client::new();
    InspectionClient::new(s.channel.clone())
        .start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() })
        .await
        .unwrap();
    s.wait_node_state(N1, "waiting").await;
    // The start request is consumed after its state is saved: the snapshot is taken once it is (T30).
    let t = Instant::now();
    while !s.engine.store.pending().await.unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30), "the start request was never consumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.ironic.clear_calls();
    let before = s.refused_snapshot().await;

    // Over the value bound: 400, whatever the MACs say.
    let mut data: Value = serde_json::from_str(&data_for(MAC1, "10.0.0.1")).unwrap();
    data["padding"] = json!(vec![0; 6000]);
    let r = http.post(s.u("/v1/continue")).body(data.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("more than 5000 JSON values"), "{msg}");
    // Nested deeper than the bound.
    let deep = format!("{{\"a\": {}1{}}}", "[".repeat(40), "]".repeat(40));
    let r = http.post(s.u("/v1/continue")).body(deep).send().await.unwrap();
    assert_eq!(r.status(), 400);
    // 300 MACs, N1's among them: over the caller's MAC bound.
    let mut data: Value = serde_json::from_str(&data_for(MAC1, "10.0.0.1")).unwrap();
    let ifaces = data["inventory"]["interfaces"].as_array_mut().unwrap();
    for i in 0..300u32 {
        ifaces.push(
            json!({"name": format!("x{i}"), "mac_address": format!("52:54:01:00:{:02x}:{:02x}", i >> 8, i & 255)}),
        );
    }
    let r = http.post(s.u("/v1/continue")).body(data.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("at most 256 are looked up"), "{msg}");
    // Nothing moved: N1 still waiting, same filter revision and queue, no call to Ironic.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.refused_snapshot().await, before);
    assert_eq!(s.ironic.calls(), vec![]);

    // 40 slow senders, each from its own address: headers, one byte of a 1000-byte body, then nothing.
    let addr: std::net::SocketAddr = s.inspector.trim_start_matches("http://").parse().unwrap();
    let mut slow = vec![];
    for i in 0..40u8 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(std::net::SocketAddr::from(([127, 0, 1, 10 + i], 0))).unwrap();
        let mut tcp = sock.connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/continue HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        slow.push(tcp);
    }
    // The legitimate callback is answered while every slow sender still waits for its answer.
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        http.post(s.u("/v1/continue")).body(data_for(MAC1, "10.0.0.1")).send(),
    )
    .await
    .expect("the legitimate callback is answered")
    .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let mut buf = [0u8; 256];
    for (i, tcp) in slow.iter_mut().enumerate() {
        // Nothing to read yet: no answer came before the legitimate one's.
        match tcp.try_read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("slow sender {i} was answered before the legitimate callback: {other:?}"),
        }
    }
    s.wait_node_state(N1, "finished").await;
    // Each slow sender is answered 408 at its read deadline.
    for (i, mut tcp) in slow.into_iter().enumerate() {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut out)).await.expect("answered");
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 408"), "slow sender {i}: {text}");
    }
}

/// The default limit leaves room for ironic-python-agent's logs: a 3 MiB report is accepted, one past 16 MiB is
/// 413 (the client reads the 413, not a reset connection) and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn continue_default_limit_fits_ramdisk_logs() {
    let s = site("continue-default", |_, _| {}).await;
    let http = reqwest::Client::new();
    InspectionClient::new(s.channel.clone())
        .start(StartRequest { node: N1.into(), manage_boot: false, ..Default::default() })
        .await
        .unwrap();
    s.wait_node_state(N1, "waiting").await;
    let limit = ironguard_controlplane::http_access::config::DEFAULT_CONTINUE_MAX_BYTES;
    let mut over = data_for(MAC1, "10.0.0.1");
    over.insert_str(1, &format!("\"logs\": \"{}\",", "A".repeat(limit)));
    let r = http.post(s.u("/v1/continue")).body(over).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(s.node_state(N1).await.as_deref(), Some("waiting"));
    // Over the gRPC Continue limit (2 MiB), well under this one.
    let mut fits = data_for(MAC1, "10.0.0.1");
    fits.insert_str(1, &format!("\"logs\": \"{}\",", "A".repeat(3 << 20)));
    let r = http.post(s.u("/v1/continue")).body(fits).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["uuid"], N1);
    // (Processing that much data takes seconds in a debug build: accepted is what this test is about.)
}

// ---------------------------------------------------------------------------------------------------------------

/// A CA and a server certificate for 127.0.0.1 and localhost, as PEM: (ca, cert, key).
fn test_pki() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// TLS: the listener serves HTTPS with the configured certificate (trusted through the test CA, refused without
/// it), plain HTTP to the same port gets no answer, and authentication works over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn https_with_a_test_ca() {
    ironguard_ironic::crypto_provider();
    let (ca, cert, key) = test_pki();
    let s = site("tls", |c, dir| {
        std::fs::write(dir.join("cert.pem"), &cert).unwrap();
        std::fs::write(dir.join("key.pem"), &key).unwrap();
        let (file, _) = write_htpasswd(dir);
        c.inspector_api.tls_cert_file = dir.join("cert.pem").display().to_string();
        c.inspector_api.tls_key_file = dir.join("key.pem").display().to_string();
        c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
        c.inspector_api.http_basic_auth_user_file = file.display().to_string();
    })
    .await;
    assert!(s.inspector.starts_with("https://"));
    let trusted = reqwest::Client::builder()
        .tls_certs_only(vec![reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let r = trusted.get(s.u("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = trusted.get(s.u("/v1/rules")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = trusted.get(s.u("/v1/rules")).header("Authorization", basic(USER, PASSWORD)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = trusted.post(s.u("/v1/continue")).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 400, "the ramdisk's call over HTTPS");
    // By name too (the certificate has localhost).
    let by_name = s.u("/").replace("127.0.0.1", "localhost");
    assert_eq!(trusted.get(by_name).send().await.unwrap().status(), 200);

    // Without the CA: the certificate is refused.
    let (other_ca, _, _) = test_pki();
    let untrusting = reqwest::Client::builder()
        .tls_certs_only(vec![reqwest::Certificate::from_pem(other_ca.as_bytes()).unwrap()])
        .build()
        .unwrap();
    assert!(untrusting.get(s.u("/")).send().await.is_err());
    // Plain HTTP to the HTTPS port: no HTTP answer.
    let plain = s.inspector.replace("https://", "http://");
    let r = reqwest::Client::new().get(format!("{plain}/")).timeout(Duration::from_secs(15)).send().await;
    assert!(r.is_err(), "plain HTTP must not be answered: {r:?}");
    // TLS 1.2 is accepted too (older clients, e.g. ironic-python-agent on an old ramdisk).
    let tls12 = reqwest::Client::builder()
        .tls_certs_only(vec![reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .tls_version_max(reqwest::tls::Version::TLS_1_2)
        .build()
        .unwrap();
    assert_eq!(tls12.get(s.u("/")).send().await.unwrap().status(), 200);
    assert_no_secret_logged(&[PASSWORD, key.lines().nth(1).unwrap()]);
}

// ---------------------------------------------------------------------------------------------------------------

/// Configurations that cannot work are refused at start with a message that says why — naming the htpasswd line,
/// never its hash.
#[tokio::test]
async fn bad_configurations_are_refused_at_start() {
    capture_logs();
    let dir = test_dir("badcfg");
    let base = |c: &mut ControlPlaneConfig| {
        c.server.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
        c.grpc.insecure = true;
        c.server.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.server.inspector_listen = Some("127.0.0.1:0".parse().unwrap());
        c.store.data_dir = dir.join("store");
    };
    let refused = |tweak: &dyn Fn(&mut ControlPlaneConfig)| {
        let mut c = ControlPlaneConfig::default();
        base(&mut c);
        tweak(&mut c);
        c.validate().unwrap_err().to_string()
    };
    let md5 = "$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/";
    let file = dir.join("htpasswd");
    std::fs::write(&file, format!("ok:{}\nold:{md5}\n", bcrypt::hash("x", 4).unwrap())).unwrap();
    let path = file.display().to_string();
    let e = refused(&|c| {
        c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
        c.inspector_api.http_basic_auth_user_file = path.clone();
    });
    assert!(e.contains("line 2") && e.contains("bcrypt") && !e.contains("HqJZim"), "{e}");
    let e = refused(&|c| {
        c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
        c.inspector_api.http_basic_auth_user_file = "/nonexistent/htpasswd".into();
    });
    assert!(e.contains("/nonexistent/htpasswd"), "{e}");
    let e = refused(&|c| c.inspector_api.auth_strategy = AuthStrategy::Keystone);
    assert!(e.contains("keystone_url"), "{e}");
    let e = refused(&|c| {
        c.inspector_api.auth_strategy = AuthStrategy::Keystone;
        c.inspector_api.keystone_url = "http://127.0.0.1:5000".into();
    });
    assert!(e.contains("service identity"), "{e}");
    let e = refused(&|c| c.inspector_api.tls_cert_file = "/etc/cert.pem".into());
    assert!(e.contains("tls_key_file"), "{e}");
    let e = refused(&|c| c.inspector_api.continue_max_bytes = 0);
    assert!(e.contains("continue_max_bytes"), "{e}");
    // noauth on a network address is refused, unless the operator wrote insecure = true (loopback, as in `base`,
    // is not refused); http_basic there is fine.
    let e = refused(&|c| c.server.inspector_listen = Some("0.0.0.0:0".parse().unwrap()));
    assert!(e.contains("without authentication") && e.contains("insecure = true"), "{e}");
    let e = refused(&|c| c.server.inspector_listen = Some("[::]:0".parse().unwrap()));
    assert!(e.contains("without authentication"), "{e}");
    let mut c = ControlPlaneConfig::default();
    base(&mut c);
    c.server.inspector_listen = Some("0.0.0.0:0".parse().unwrap());
    c.inspector_api.insecure = true;
    c.validate().unwrap();
    c.inspector_api.insecure = false;
    let good = dir.join("good-htpasswd");
    std::fs::write(&good, format!("ok:{}\n", bcrypt::hash("x", 4).unwrap())).unwrap();
    c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
    c.inspector_api.http_basic_auth_user_file = good.display().to_string();
    c.validate().unwrap();
    // serve() refuses it too, before binding anything.
    let mut c = ControlPlaneConfig::default();
    base(&mut c);
    c.store.data_dir = dir.join("store-noauth");
    c.server.inspector_listen = Some("0.0.0.0:0".parse().unwrap());
    let e = format!("{:#}", ironguard_controlplane::serve(&c).await.unwrap_err());
    assert!(e.contains("without authentication"), "{e}");
    // Without the inspector API, its section is not read.
    let mut c = ControlPlaneConfig::default();
    base(&mut c);
    c.server.inspector_listen = None;
    c.inspector_api.tls_cert_file = "/etc/cert.pem".into();
    c.validate().unwrap();
    // serve() refuses the same.
    let mut c = ControlPlaneConfig::default();
    base(&mut c);
    c.inspector_api.auth_strategy = AuthStrategy::HttpBasic;
    c.inspector_api.http_basic_auth_user_file = path.clone();
    let e = format!("{:#}", ironguard_controlplane::serve(&c).await.unwrap_err());
    assert!(e.contains("line 2") && !e.contains("HqJZim"), "{e}");
    // A certificate file that holds no certificate.
    std::fs::write(dir.join("cert.pem"), "not a certificate\n").unwrap();
    std::fs::write(dir.join("key.pem"), "not a key\n").unwrap();
    let mut c = ControlPlaneConfig::default();
    base(&mut c);
    c.store.data_dir = dir.join("store2");
    c.inspector_api.tls_cert_file = dir.join("cert.pem").display().to_string();
    c.inspector_api.tls_key_file = dir.join("key.pem").display().to_string();
    let e = format!("{:#}", ironguard_controlplane::serve(&c).await.unwrap_err());
    assert!(e.contains("no PEM certificate"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--print-config` shows that a password is set, never the password: Keystone's, etcd's and Ironic's.
#[test]
fn print_config_redacts_every_password() {
    let exe = env!("CARGO_BIN_EXE_ironguard-controlplane");
    let dir = test_dir("printcfg");
    let cfg = dir.join("c.toml");
    let mut f = std::fs::File::create(&cfg).unwrap();
    write!(
        f,
        "[grpc]\ninsecure = true\n[inspector_api]\nauth_strategy = \"keystone\"\nkeystone_url = \"http://127.0.0.1:5000\"\n\
         keystone_username = \"{SERVICE_USER}\"\nkeystone_password = \"{SERVICE_PASSWORD}\"\n\
         keystone_project_name = \"service\"\n\
         [etcd]\nusername = \"ironguard\"\npassword = \"etcd-pass-0123456789\"\n\
         [ironic]\nurl = \"http://127.0.0.1:6385\"\nauth_type = \"http_basic\"\nusername = \"ironic\"\n\
         password = \"ironic-pass-0123456789\"\n"
    )
    .unwrap();
    drop(f);
    let out = std::process::Command::new(exe).arg("--print-config").arg("--config").arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for secret in [SERVICE_PASSWORD, "etcd-pass-0123456789", "ironic-pass-0123456789"] {
        assert!(!text.contains(secret), "{text}");
    }
    assert_eq!(text.matches("password = \"<redacted>\"").count(), 3, "{text}");
    assert!(text.contains("keystone_password = \"<redacted>\""), "{text}");
    let parsed: ControlPlaneConfig = toml::from_str(&text).unwrap();
    assert_eq!(parsed.inspector_api.auth_strategy, AuthStrategy::Keystone);
    assert_eq!(parsed.inspector_api.keystone_username, SERVICE_USER);
    std::fs::remove_dir_all(&dir).unwrap();
}
