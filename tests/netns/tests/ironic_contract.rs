//! The contract between ironguard and Ironic: the same calls, through ironguard's own Ironic client and as raw
//! HTTP, against the real Ironic 39 and against the fake Ironic the fast tests use. Where the two answer
//! differently, the fake is wrong: pagination (`next` drops filters), error bodies, 404s, 409 on a locked node
//! and on a duplicate port, microversion headers and the refusal of an unsupported version.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ironguard_ironic::{Ironic, IronicConfig, IronicError};
use ironguard_netns_tests::*;
use serde_json::{Value, json};

const REAL_PORT: u16 = 6385;
const FAKE_PORT: u16 = 6386;

/// Both Ironics in one namespace, with the same content: 4 manageable nodes interleaved with 3 enrolled ones,
/// one port each. Returns (uuids on the real one, uuids on the fake one), in creation (= list) order.
struct Both {
    real: RealIronic,
    fake: FakeIronicProc,
    ns: Netns,
    _dir: TempDir,
    real_nodes: Vec<String>,
    fake_nodes: Vec<String>,
}

const STATES: [&str; 7] = ["manageable", "enroll", "manageable", "enroll", "manageable", "enroll", "manageable"];

impl Both {
    fn new() -> Self {
        let dir = TempDir::new("contract");
        let ns = Netns::new("contract");
        // The real one holds a node's lock for about 2 s during a power action, as a slow BMC would.
        let real = RealIronic::start_with(&ns, &dir, "127.0.0.1", REAL_PORT, "[fake]\npower_delay = 2\n");
        let fake = FakeIronicProc::start(&ns, &dir, FAKE_PORT);
        let mut real_nodes = vec![];
        let mut fake_nodes = vec![];
        for (i, state) in STATES.iter().enumerate() {
            let m = mac(&format!("52:54:00:c0:00:{i:02x}"));
            let uuid = real.enroll(&format!("n{i}"), &[m], &format!("10.2.0.{i}"), "agent");
            real.drive_to(&uuid, state);
            real_nodes.push(uuid);
            let fu = format!("00000000-0000-4000-8000-{i:012}");
            fake.add_node(&fu, state, &[m]);
            fake_nodes.push(fu);
        }
        Self { real, fake, ns, _dir: dir, real_nodes, fake_nodes }
    }

    /// Runs `f` with a client of each Ironic, inside the namespace; returns (real result, fake result).
    fn both<T: Send + 'static>(
        &self,
        cfg: IronicConfig,
        f: impl Fn(Ironic, Vec<String>) -> BoxFut<T> + Send + Sync + 'static,
    ) -> (T, T) {
        let (real_nodes, fake_nodes) = (self.real_nodes.clone(), self.fake_nodes.clone());
        let f = std::sync::Arc::new(f);
        in_netns(&self.ns, move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let client = |port: u16| {
                    Ironic::new(IronicConfig { url: format!("http://127.0.0.1:{port}"), ..cfg.clone() }).unwrap()
                };
                let r = f(client(REAL_PORT), real_nodes).await;
                let k = f(client(FAKE_PORT), fake_nodes).await;
                (r, k)
            })
        })
    }

    /// The same raw request to both: [(status, headers, body) of the real one, of the fake one].
    fn raw_both(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        version: Option<&str>,
    ) -> [(u16, String, String); 2] {
        [self.real.raw(method, path, body, version), self.fake.rest().raw(method, path, body, version)]
    }
}

type BoxFut<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

fn header<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
    headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// `next` with the base URL and the marker replaced, so the two servers' links compare.
fn next_shape(body: &str, base: &str, marker: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap();
    v["next"].as_str().unwrap_or("-").replace(base, "BASE").replace(marker, "MARKER")
}

#[test]
fn the_fake_answers_as_the_real_ironic_does() {
    let b = Both::new();

    // Microversion headers on every answer; an unsupported version is refused with 406.
    for (status, headers, _) in b.raw_both("GET", "/v1/nodes?limit=1", None, Some("1.8")) {
        assert_eq!(status, 200);
        assert_eq!(header(&headers, "x-openstack-ironic-api-version"), Some("1.8"), "{headers}");
        assert!(header(&headers, "x-openstack-ironic-api-minimum-version").is_some(), "{headers}");
        assert!(header(&headers, "x-openstack-ironic-api-maximum-version").is_some(), "{headers}");
    }
    let [real, fake] = b.raw_both("GET", "/v1/nodes", None, Some("1.999"));
    assert_eq!((real.0, fake.0), (406, 406), "an unsupported microversion: real {real:?} fake {fake:?}");

    // Pagination: `next` keeps sort, fields, limit and marker only; provision_state is dropped by both.
    let q = "/v1/nodes?provision_state=manageable&fields=uuid&limit=2";
    let [real, fake] = b.raw_both("GET", q, None, Some("1.81"));
    let real_next = next_shape(&real.2, &b.real.url, &b.real_nodes[2]);
    let fake_next = next_shape(&fake.2, "http://127.0.0.1:6386", &b.fake_nodes[2]);
    assert_eq!(real_next, "BASE/v1/nodes?sort_key=id&sort_dir=asc&fields=uuid&limit=2&marker=MARKER");
    assert_eq!(fake_next, real_next, "the fake builds next as Ironic 39 does");

    // Error bodies: Ironic's JSON-in-a-string, with the same faultstring.
    let [real, fake] = b.raw_both("GET", "/v1/nodes/no-such-node", None, Some("1.81"));
    assert_eq!((real.0, fake.0), (404, 404));
    let fault = |body: &str| -> Value {
        let outer: Value = serde_json::from_str(body).unwrap();
        serde_json::from_str(outer["error_message"].as_str().expect("error_message is a string")).unwrap()
    };
    assert_eq!(fault(&real.2)["faultstring"], fault(&fake.2)["faultstring"]);
    assert_eq!(fault(&real.2)["faultcode"], "Client");

    // ironguard's client reads both the same way.
    let cfg = IronicConfig { page_size: 2, retries: 0, ..Default::default() };
    let (real, fake) = b.both(cfg.clone(), |c, nodes| {
        Box::pin(async move {
            let listed: Vec<String> =
                c.list_nodes(&["manageable"], "uuid").await.unwrap().into_iter().map(|n| n.uuid).collect();
            let want: Vec<String> = nodes.iter().step_by(2).cloned().collect();
            let missing = c.get_node("no-such-node").await.unwrap_err();
            let ports = c.list_ports(Some(&nodes[3])).await.unwrap();
            let dup = c.create_port(&nodes[0], "52:54:00:c0:00:00").await.unwrap_err();
            let validate = c.validate(&nodes[0], "power").await.unwrap();
            (
                listed == want,
                missing.to_string(),
                ports.len(),
                ports[0].node_uuid == nodes[3],
                dup.to_string(),
                validate.result,
            )
        })
    });
    assert!(real.0 && fake.0, "only the manageable nodes, across pages");
    assert_eq!(real.1, fake.1, "the same 404 message");
    assert!(real.1.contains("no-such-node could not be found"), "{}", real.1);
    assert_eq!((real.2, real.3), (fake.2, fake.3), "one port of that node");
    assert!(real.4.contains("409") && fake.4.contains("409"), "a duplicate port is 409: {} / {}", real.4, fake.4);
    assert!(real.4.contains("already exists") && fake.4.contains("already exists"), "{} / {}", real.4, fake.4);
    assert_eq!((real.5, fake.5), (Some(true), Some(true)));

    // A node locked by a running power action (real: [fake] power_delay; fake: its 409 fault) is 409 "locked",
    // which the client retries; without retries it reports the lock.
    b.fake.add_fault("PATCH", "/v1/nodes/", 409, 1);
    let (real, fake) = b.both(cfg.clone(), |c, nodes| {
        Box::pin(async move {
            c.set_power(&nodes[0], "power on").await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let op = serde_json::json!([{"op": "add", "path": "/extra/contract", "value": "1"}]);
            match c.patch_node(&nodes[0], &op).await {
                Err(IronicError::Exhausted { last, .. }) => last,
                other => format!("not a retryable lock: {other:?}"),
            }
        })
    });
    assert!(real.starts_with("409") && real.contains("locked"), "real: {real}");
    assert!(fake.starts_with("409") && fake.contains("locked"), "fake: {fake}");
    b.fake.add_fault("PATCH", "/v1/nodes/", 409, 1);
    let retrying = IronicConfig { retries: 8, retry_backoff_ms: 300, ..cfg };
    let (real, fake) = b.both(retrying, |c, nodes| {
        Box::pin(async move {
            c.set_power(&nodes[2], "power on").await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let op = serde_json::json!([{"op": "add", "path": "/extra/contract", "value": "2"}]);
            c.patch_node(&nodes[2], &op).await.map_err(|e| e.to_string())
        })
    });
    assert_eq!((real.clone(), fake.clone()), (Ok(()), Ok(())), "retried until the lock is gone");
    assert_eq!(b.real.node(&b.real_nodes[2])["extra"]["contract"], "2");

    // JSON Patch on a path that does not exist: 400 from both.
    let op = json!([{"op": "remove", "path": "/extra/not-there"}]);
    let real = b.real.raw("PATCH", &format!("/v1/nodes/{}", b.real_nodes[0]), Some(&op), Some("1.81"));
    let fake = b.fake.rest().raw("PATCH", &format!("/v1/nodes/{}", b.fake_nodes[0]), Some(&op), Some("1.81"));
    assert_eq!((real.0, fake.0), (400, 400), "real {real:?}\nfake {fake:?}");
}

/// What processing writes (node patch with properties and capabilities, ports with their fields, port patches,
/// traits, a discovered node), through ironguard's client, against both: the same outcomes and refusals.
#[test]
fn the_fake_takes_processing_writes_as_the_real_ironic_does() {
    let b = Both::new();
    let cfg = IronicConfig { retries: 0, ..Default::default() };
    let (real, fake) = b.both(cfg, |c, nodes| {
        Box::pin(async move {
            let n = &nodes[0];
            let mut out: Vec<String> = vec![];
            let mut note = |what: &str, r: Result<String, IronicError>| {
                out.push(match r {
                    Ok(v) => format!("{what}: ok {v}"),
                    Err(IronicError::Http { status, .. }) => format!("{what}: {status}"),
                    Err(e) => format!("{what}: {}", e.to_string().split(':').next().unwrap_or_default()),
                })
            };
            let props = json!([{"op": "add", "path": "/properties/cpus", "value": "4"},
                               {"op": "add", "path": "/properties/capabilities", "value": "cpu_vt:true,boot_mode:bios"}]);
            note("patch properties", c.patch_node_with(n, &props, None).await.map(|_| String::new()));
            let reset = json!([{"op": "add", "path": "/extra/x", "value": "1"}]);
            note("reset_interfaces without a driver change", c.patch_node_with(n, &reset, Some(true)).await.map(|_| String::new()));
            let full = c.get_node_full(n).await.unwrap();
            note("properties read back", Ok(format!("{} {}", full["properties"]["cpus"], full["properties"]["capabilities"])));
            note("traits listed", Ok(full["traits"].to_string()));
            let port = json!({"node_uuid": n, "address": "52:54:00:c0:01:01", "pxe_enabled": false,
                              "extra": {"client-id": "ff:00:00:00:00:00:02:00:00:02:c9:00"},
                              "local_link_connection": {"switch_id": "aa:bb:cc:dd:ee:ff", "port_id": "Eth1/1"}});
            let created = c.create_port_with(&port).await;
            let port_uuid = created.as_ref().ok().and_then(|p| p["uuid"].as_str().map(String::from)).unwrap_or_default();
            note("create port", created.map(|p| format!("{} {} {}", p["pxe_enabled"], p["extra"], p["local_link_connection"])));
            note("create the same port again", c.create_port_with(&port).await.map(|_| String::new()));
            let bad_mac = json!({"node_uuid": n, "address": "not-a-mac"});
            note("create a port with a bad MAC", c.create_port_with(&bad_mac).await.map(|_| String::new()));
            let ops = json!([{"op": "replace", "path": "/pxe_enabled", "value": true},
                             {"op": "add", "path": "/local_link_connection/port_id", "value": "Eth1/2"},
                             {"op": "add", "path": "/physical_network", "value": "physnet1"}]);
            note("patch port", c.patch_port(&port_uuid, &ops).await.map(|_| String::new()));
            let bad = json!([{"op": "add", "path": "/local_link_connection/colour", "value": "blue"}]);
            note("patch port with an unknown local_link_connection key", c.patch_port(&port_uuid, &bad).await.map(|_| String::new()));
            let detail = c.list_ports_detail(n).await.unwrap();
            let p = detail.iter().find(|p| p["uuid"] == port_uuid.as_str()).cloned().unwrap_or_default();
            note("port read back", Ok(format!("{} {} {}", p["pxe_enabled"], p["local_link_connection"], p["physical_network"])));
            note("port by address", c.ports_by_address("52:54:00:c0:01:01").await.map(|v| v.len().to_string()));
            note("add trait", c.add_trait(n, "CUSTOM_CONTRACT").await.map(|_| String::new()));
            note("add a bad trait", c.add_trait(n, "lower").await.map(|_| String::new()));
            note("remove a trait the node lacks", c.remove_trait(n, "CUSTOM_ABSENT").await.map(|_| String::new()));
            note("traits after", c.get_node_full(n).await.map(|v| v["traits"].to_string()));
            let node = json!({"driver": "fake-hardware", "driver_info": {"ipmi_address": "10.2.9.9"}, "resource_class": "discovered"});
            let created = c.create_node(&node).await;
            note("enroll a node", created.as_ref().map(|_| String::new()).map_err(|e| IronicError::Protocol { op: String::new(), detail: e.to_string() }));
            if let Ok(uuid) = created {
                let v = c.get_node_full(&uuid).await.unwrap();
                note("enrolled node", Ok(format!("{} {} {}", v["provision_state"], v["driver_info"]["ipmi_address"], v["resource_class"])));
            }
            let unknown = json!({"driver": "fake-hardware", "colour": "blue"});
            note("enroll a node with an unknown field", c.create_node(&unknown).await.map(|_| String::new()));
            let bmcs = c.nodes_with_driver_info().await.unwrap();
            note("BMC addresses listed", Ok(bmcs.iter().any(|n| n.bmc_addresses().contains(&"10.2.9.9".to_string())).to_string()));
            out
        })
    });
    for (r, f) in real.iter().zip(&fake) {
        assert_eq!(r, f, "real Ironic vs the fake");
    }
    eprintln!("{}", real.join("\n"));
    assert_eq!(real.len(), fake.len());
    assert!(real.iter().any(|l| l == "create the same port again: 409"), "{real:?}");
    assert!(real.iter().any(|l| l == "add a bad trait: 400"), "{real:?}");
}
