//! The fake's Ironic API and admin API over real HTTP on 127.0.0.1:0, driven by the crate's minimal client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use fake_ironic::client::{self, Response};
use fake_ironic::{FakeIronic, FakeIronicConfig, Fault, Node, Port};
use serde_json::{Value, json};

async fn start() -> FakeIronic {
    FakeIronic::start("127.0.0.1:0".parse().unwrap()).await.unwrap()
}

async fn start_with(config: FakeIronicConfig) -> FakeIronic {
    FakeIronic::start_with("127.0.0.1:0".parse().unwrap(), config).await.unwrap()
}

async fn get(fake: &FakeIronic, path: &str) -> Response {
    client::get(&format!("{}{path}", fake.url())).await.unwrap()
}

async fn send(fake: &FakeIronic, method: &str, path: &str, body: Value) -> Response {
    client::send_json(method, &format!("{}{path}", fake.url()), &body).await.unwrap()
}

/// `send` at microversion 1.81, as ironguard's client negotiates it.
async fn send81(fake: &FakeIronic, method: &str, path: &str, body: Value) -> Response {
    let headers = [("Content-Type", "application/json"), ("X-OpenStack-Ironic-API-Version", "1.81")];
    let body = body.to_string();
    client::send(method, &format!("{}{path}", fake.url()), &headers, Some(body.as_bytes())).await.unwrap()
}

/// The `faultstring` and `faultcode` inside Ironic's `{"error_message": "<JSON string>"}`.
fn fault(resp: &Response) -> (String, String) {
    let body = resp.json().unwrap();
    let inner: Value = serde_json::from_str(body["error_message"].as_str().unwrap()).unwrap();
    assert!(inner["debuginfo"].is_null());
    (inner["faultstring"].as_str().unwrap().to_owned(), inner["faultcode"].as_str().unwrap().to_owned())
}

fn keys(v: &Value) -> HashSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(items: &[&str]) -> HashSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Follows `next` from `first` and returns every page's items.
async fn all_pages(first: String, key: &str) -> Vec<Vec<Value>> {
    let mut pages = Vec::new();
    let mut url = Some(first);
    while let Some(u) = url {
        let resp = client::get(&u).await.unwrap();
        assert_eq!(resp.status, 200, "{u}: {}", resp.text());
        let body = resp.json().unwrap();
        pages.push(body[key].as_array().unwrap().clone());
        url = body.get("next").and_then(Value::as_str).map(str::to_owned);
        assert!(pages.len() < 100, "next never ends");
    }
    pages
}

#[tokio::test]
async fn pagination_over_2500_nodes_sees_every_node_once() {
    let fake = start().await;
    assert_eq!(fake.config().max_limit, 1000);
    let uuids = fake.populate(2500, 1, "enroll");

    let pages = all_pages(format!("{}/v1/nodes", fake.url()), "nodes").await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [1000, 1000, 500]);
    let seen: Vec<String> = pages.iter().flatten().map(|n| n["uuid"].as_str().unwrap().to_owned()).collect();
    assert_eq!(seen, uuids, "every node exactly once, in a stable order");

    // A limit above max_limit is capped; the next link carries the capped limit and the marker, after Ironic's
    // sort parameters.
    let body = get(&fake, "/v1/nodes?limit=5000").await.json().unwrap();
    assert_eq!(body["nodes"].as_array().unwrap().len(), 1000);
    let next = body["next"].as_str().unwrap();
    assert_eq!(next, format!("{}/v1/nodes?sort_key=id&sort_dir=asc&limit=1000&marker={}", fake.url(), uuids[999]));

    // As in Ironic 39, next keeps fields but drops provision_state: the pages after the first list nodes in any
    // state. A last full page gets a next that yields an empty page.
    for uuid in uuids.iter().step_by(2) {
        fake.set_provision_state(uuid, "inspect wait").unwrap();
    }
    let first = format!("{}/v1/nodes?provision_state=inspect%20wait&fields=provision_state&limit=400", fake.url());
    let body = client::get(&first).await.unwrap().json().unwrap();
    let next = body["next"].as_str().unwrap();
    assert!(next.contains("fields=provision_state&limit=400&marker=") && !next.contains("provision_state=inspect"));
    let pages = all_pages(first, "nodes").await;
    assert!(pages[0].iter().all(|n| n["provision_state"] == "inspect wait"));
    assert!(pages[1].iter().any(|n| n["provision_state"] != "inspect wait"), "the filter is lost after page one");

    // Ports paginate the same way.
    let pages = all_pages(format!("{}/v1/ports?fields=address,node_uuid&limit=1000", fake.url()), "ports").await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [1000, 1000, 500]);
    let macs: HashSet<&str> = pages.iter().flatten().map(|p| p["address"].as_str().unwrap()).collect();
    assert_eq!(macs.len(), 2500);
    fake.stop().await;
}

#[tokio::test]
async fn unknown_marker_is_404() {
    let fake = start().await;
    let resp = get(&fake, "/v1/nodes?marker=nope").await;
    assert_eq!(resp.status, 404);
    assert_eq!(fault(&resp).0, "Node nope could not be found.");
}

#[tokio::test]
async fn fields_and_detail() {
    let fake = start().await;
    let uuid = fake.populate(1, 2, "manageable").remove(0);

    let node = &get(&fake, "/v1/nodes").await.json().unwrap()["nodes"][0];
    assert_eq!(
        keys(node),
        set(&["uuid", "name", "instance_uuid", "power_state", "provision_state", "maintenance", "links"])
    );

    let node = &get(&fake, "/v1/nodes?fields=provision_state,driver_info").await.json().unwrap()["nodes"][0];
    assert_eq!(keys(node), set(&["uuid", "provision_state", "driver_info", "links"]));
    assert_eq!(node["provision_state"], "manageable");
    assert_eq!(node["driver_info"]["ipmi_address"], "10.0.0.1");

    for path in ["/v1/nodes/detail", "/v1/nodes?detail=True"] {
        let node = &get(&fake, path).await.json().unwrap()["nodes"][0];
        assert_eq!(node["inspect_interface"], "agent", "{path}");
        assert_eq!(node["driver"], "ipmi");
        assert_eq!(node["maintenance"], false);
        assert_eq!(node["power_state"], "power off");
    }

    let node = get(&fake, &format!("/v1/nodes/{uuid}?fields=inspect_interface")).await.json().unwrap();
    assert_eq!(keys(&node), set(&["uuid", "inspect_interface", "links"]));

    let resp = get(&fake, "/v1/nodes?fields=uuid,bogus").await;
    assert_eq!(resp.status, 400);
    assert_eq!(fault(&resp).0, "Field(s) \"bogus\" are not valid");
    assert_eq!(get(&fake, "/v1/nodes?fields=uuid&detail=true").await.status, 400);

    let body = get(&fake, "/v1/ports?fields=address,node_uuid").await.json().unwrap();
    for port in body["ports"].as_array().unwrap() {
        assert_eq!(keys(port), set(&["uuid", "address", "node_uuid", "links"]));
        assert_eq!(port["node_uuid"], uuid.as_str());
    }
    let port = &get(&fake, "/v1/ports").await.json().unwrap()["ports"][0];
    assert_eq!(keys(port), set(&["uuid", "address", "links"]));
    let port = &get(&fake, "/v1/ports/detail").await.json().unwrap()["ports"][0];
    assert_eq!(port["pxe_enabled"], true);
}

#[tokio::test]
async fn limit_zero_is_400() {
    let fake = start().await;
    fake.populate(3, 1, "enroll");
    for path in ["/v1/nodes?limit=0", "/v1/ports?limit=0", "/v1/nodes?limit=-5"] {
        let resp = get(&fake, path).await;
        assert_eq!(resp.status, 400, "{path}");
        assert_eq!(resp.header("content-type"), Some("application/json"));
        assert_eq!(fault(&resp), ("Limit must be positive".to_owned(), "Client".to_owned()));
    }
    assert_eq!(get(&fake, "/v1/nodes?limit=abc").await.status, 400);
    let body = get(&fake, "/v1/nodes?limit=2").await.json().unwrap();
    assert_eq!(body["nodes"].as_array().unwrap().len(), 2);
    assert!(body["next"].is_string());
    let body = get(&fake, "/v1/nodes?limit=3").await.json().unwrap();
    assert!(body["next"].is_string(), "a full page has next");
    let body = get(&fake, "/v1/nodes?limit=4").await.json().unwrap();
    assert!(body.get("next").is_none(), "a short page has none");
}

#[tokio::test]
async fn microversions() {
    let fake = start().await;
    let url = format!("{}/v1/nodes", fake.url());

    let resp = client::send("GET", &url, &[("X-OpenStack-Ironic-API-Version", "1.82")], None).await.unwrap();
    assert_eq!(resp.status, 406);
    assert!(fault(&resp).0.contains("[1.1, 1.81]"), "{}", resp.text());
    assert_eq!(resp.header("x-openstack-ironic-api-maximum-version"), Some("1.81"));

    let resp = client::send("GET", &url, &[("X-OpenStack-Ironic-API-Version", "1.81")], None).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-openstack-ironic-api-version"), Some("1.81"));
    assert_eq!(resp.header("x-openstack-ironic-api-minimum-version"), Some("1.1"));
    assert_eq!(resp.header("x-openstack-ironic-api-maximum-version"), Some("1.81"));

    let resp = client::get(&url).await.unwrap();
    assert_eq!(resp.header("x-openstack-ironic-api-version"), Some("1.1"));
    let resp = client::send("GET", &url, &[("X-OpenStack-Ironic-API-Version", "latest")], None).await.unwrap();
    assert_eq!(resp.header("x-openstack-ironic-api-version"), Some("1.81"));
    let resp = client::send("GET", &url, &[("OpenStack-API-Version", "baremetal 1.50")], None).await.unwrap();
    assert_eq!(resp.header("x-openstack-ironic-api-version"), Some("1.50"));

    let versions: Vec<Option<String>> = fake.calls().into_iter().map(|c| c.api_version).collect();
    assert_eq!(versions, [Some("1.82".into()), Some("1.81".into()), None, Some("latest".into()), Some("1.50".into())]);

    // A configured maximum.
    let older = start_with(FakeIronicConfig { max_version: "1.46".into(), ..FakeIronicConfig::default() }).await;
    let url = format!("{}/v1/nodes", older.url());
    let resp = client::send("GET", &url, &[("X-OpenStack-Ironic-API-Version", "1.47")], None).await.unwrap();
    assert_eq!(resp.status, 406);
    let root = get(&older, "/").await.json().unwrap();
    assert_eq!(root["default_version"]["version"], "1.46");
}

#[tokio::test]
async fn version_documents() {
    let fake = start().await;
    let root = get(&fake, "/").await;
    assert_eq!(root.status, 200);
    assert!(root.header("x-openstack-ironic-api-version").is_none());
    let root = root.json().unwrap();
    assert_eq!(root["name"], "OpenStack Ironic API");
    assert_eq!(root["versions"][0]["id"], "v1");
    assert_eq!(root["versions"][0]["status"], "CURRENT");
    assert_eq!(root["versions"][0]["version"], "1.81");
    assert_eq!(root["versions"][0]["min_version"], "1.1");
    assert_eq!(root["default_version"]["version"], "1.81");
    assert_eq!(root["versions"][0]["links"][0]["href"], format!("{}/v1/", fake.url()));

    let v1 = get(&fake, "/v1").await;
    assert_eq!(v1.header("x-openstack-ironic-api-maximum-version"), Some("1.81"));
    let v1 = v1.json().unwrap();
    assert_eq!(v1["id"], "v1");
    assert_eq!(v1["version"]["version"], "1.81");

    let resp = get(&fake, "/v1/nothing-here").await;
    assert_eq!(resp.status, 404);
    assert_eq!(fault(&resp).1, "Client");
}

#[tokio::test]
async fn fault_503_hits_count_times_then_succeeds() {
    let fake = start().await;
    fake.populate(1, 1, "enroll");
    fake.inject(Fault {
        method: Some("GET".into()),
        path_prefix: "/v1/nodes".into(),
        status: 503,
        count: 2,
        ..Fault::default()
    });
    // Not matching: other method, other path.
    assert_eq!(get(&fake, "/v1/ports").await.status, 200);
    for _ in 0..2 {
        let resp = get(&fake, "/v1/nodes?limit=1").await;
        assert_eq!(resp.status, 503);
        let (message, code) = fault(&resp);
        assert!(message.contains("lack of free conductor workers"), "{message}");
        assert_eq!(code, "Server");
        assert_eq!(resp.header("x-openstack-ironic-api-maximum-version"), Some("1.81"));
    }
    assert_eq!(get(&fake, "/v1/nodes?limit=1").await.status, 200);
    assert_eq!(get(&fake, "/v1/nodes").await.status, 200);
}

#[tokio::test]
async fn fault_409_node_locked() {
    let fake = start().await;
    let uuid = fake.populate(1, 0, "enroll").remove(0);
    fake.inject(Fault { path_prefix: format!("/v1/nodes/{uuid}/states"), status: 409, count: 1, ..Fault::default() });
    let path = format!("/v1/nodes/{uuid}/states/power");
    let resp = send(&fake, "PUT", &path, json!({"target": "power on"})).await;
    assert_eq!(resp.status, 409);
    let (message, code) = fault(&resp);
    assert!(message.starts_with(&format!("Node {uuid} is locked by host")), "{message}");
    assert_eq!(code, "Client");
    assert_eq!(fake.power_state(&uuid).as_deref(), Some("power off"), "a faulted request changes nothing");
    assert_eq!(send(&fake, "PUT", &path, json!({"target": "power on"})).await.status, 202);
    assert_eq!(fake.power_state(&uuid).as_deref(), Some("power on"));
}

#[tokio::test]
async fn other_fault_statuses_and_first_match_wins() {
    let fake = start().await;
    fake.inject(Fault { path_prefix: "/v1/ports".into(), status: 500, count: 1, ..Fault::default() });
    fake.inject(Fault { path_prefix: "/v1/".into(), status: 502, count: 1, ..Fault::default() });
    let resp = get(&fake, "/v1/ports").await;
    assert_eq!(resp.status, 500);
    assert_eq!(fault(&resp).1, "Server");
    assert_eq!(get(&fake, "/v1/ports").await.status, 502);
    assert_eq!(get(&fake, "/v1/ports").await.status, 200);

    fake.inject(Fault { status: 418, ..Fault::default() });
    for _ in 0..3 {
        assert_eq!(get(&fake, "/v1/nodes").await.status, 418, "count 0 is forever");
    }
    fake.clear_faults();
    assert_eq!(get(&fake, "/v1/nodes").await.status, 200);
}

#[tokio::test]
async fn latency_fault_delays() {
    let fake = start().await;
    fake.inject(Fault { path_prefix: "/v1/nodes".into(), latency_ms: 800, ..Fault::default() });
    let started = Instant::now();
    let resp = get(&fake, "/v1/nodes").await;
    assert_eq!(resp.status, 200, "status 0 is latency only");
    assert!(started.elapsed() >= Duration::from_millis(800), "{:?}", started.elapsed());

    // A request the fault does not match is not delayed: it is answered while a matching one is still held (for a
    // minute, far longer than any answer takes).
    fake.clear_faults();
    fake.inject(Fault { path_prefix: "/v1/nodes".into(), latency_ms: 60_000, ..Fault::default() });
    let url = format!("{}/v1/nodes", fake.url());
    let held = tokio::spawn(async move { client::get(&url).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    // The first /v1/nodes call above, then the held one.
    while fake.calls().iter().filter(|c| c.path.starts_with("/v1/nodes")).count() < 2 {
        assert!(Instant::now() < deadline, "the held request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(get(&fake, "/v1/ports").await.status, 200);
    assert!(!held.is_finished(), "not matching, not delayed: answered while the matching request is still held");
    held.abort();

    // Latency and an error together.
    fake.clear_faults();
    fake.inject(Fault { status: 503, latency_ms: 200, count: 1, ..Fault::default() });
    let started = Instant::now();
    assert_eq!(get(&fake, "/v1/nodes").await.status, 503);
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn calls_are_recorded_in_order() {
    let fake = start().await;
    let uuid = fake.populate(1, 1, "enroll").remove(0);
    get(&fake, "/v1/nodes?fields=uuid&limit=5").await;
    send(&fake, "PUT", &format!("/v1/nodes/{uuid}/states/power"), json!({"target": "power on"})).await;
    get(&fake, "/_fake/calls").await; // not recorded
    get(&fake, "/v1/ports").await;
    let calls = fake.calls();
    let seen: Vec<(&str, &str)> = calls.iter().map(|c| (c.method.as_str(), c.path.as_str())).collect();
    let power = format!("/v1/nodes/{uuid}/states/power");
    assert_eq!(seen, [("GET", "/v1/nodes?fields=uuid&limit=5"), ("PUT", power.as_str()), ("GET", "/v1/ports")]);
    assert!(calls.windows(2).all(|w| w[0].seq < w[1].seq && w[0].at <= w[1].at));

    // The admin API shows the same.
    let listed = get(&fake, "/_fake/calls").await.json().unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 3);
    assert_eq!(listed[1]["method"], "PUT");
    assert_eq!(listed[1]["path"], power.as_str());

    fake.clear_calls();
    assert!(fake.calls().is_empty());
    get(&fake, "/v1/nodes").await;
    let calls = fake.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].seq, 3, "seq keeps counting");
    assert_eq!(send(&fake, "DELETE", "/_fake/calls", json!(null)).await.status, 204);
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn power_and_boot_device() {
    let fake = start().await;
    let uuid = fake.populate(1, 0, "manageable").remove(0);
    let power = format!("/v1/nodes/{uuid}/states/power");

    let resp = send(&fake, "PUT", &power, json!({"target": "power on"})).await;
    assert_eq!(resp.status, 202);
    assert_eq!(resp.header("location"), Some(format!("{}/v1/nodes/{uuid}/states", fake.url()).as_str()));
    assert_eq!(fake.power_state(&uuid).as_deref(), Some("power on"));
    assert_eq!(send(&fake, "PUT", &power, json!({"target": "power off"})).await.status, 202);
    assert_eq!(fake.power_state(&uuid).as_deref(), Some("power off"));
    assert_eq!(send(&fake, "PUT", &power, json!({"target": "rebooting"})).await.status, 202);
    assert_eq!(fake.power_state(&uuid).as_deref(), Some("power on"));
    assert_eq!(send(&fake, "PUT", &power, json!({"target": "soft power off"})).await.status, 202);
    assert_eq!(fake.power_state(&uuid).as_deref(), Some("power off"));
    let resp = send(&fake, "PUT", &power, json!({"target": "explode"})).await;
    assert_eq!(resp.status, 400);
    assert_eq!(fault(&resp).1, "Client");
    assert_eq!(fake.power_state(&uuid).as_deref(), Some("power off"));
    let resp = send(&fake, "PUT", "/v1/nodes/missing/states/power", json!({"target": "power on"})).await;
    assert_eq!(resp.status, 404);
    assert_eq!(fault(&resp).0, "Node missing could not be found.");
    let shown = get(&fake, &format!("/v1/nodes/{uuid}")).await.json().unwrap();
    assert_eq!(shown["power_state"], "power off");

    assert_eq!(fake.boot_device(&uuid), None);
    let boot = format!("/v1/nodes/{uuid}/management/boot_device");
    let resp = send(&fake, "PUT", &boot, json!({"boot_device": "pxe", "persistent": false})).await;
    assert_eq!(resp.status, 204);
    assert_eq!(fake.boot_device(&uuid).as_deref(), Some("pxe"));
    assert_eq!(send(&fake, "PUT", &boot, json!({"boot_device": "floppy"})).await.status, 400);
    assert_eq!(send(&fake, "PUT", &boot, json!({})).await.status, 400);
    let stored = get(&fake, &format!("/_fake/nodes/{uuid}")).await.json().unwrap();
    assert_eq!(stored["boot_device"], "pxe");
    assert_eq!(stored["power_state"], "power off");
}

#[tokio::test]
async fn validate_reports_power_interface() {
    let fake = start().await;
    fake.add_node(Node { name: Some("n1".into()), ..Node::new("11111111-2222-4333-8444-555555555555") });
    let body = get(&fake, "/v1/nodes/n1/validate").await.json().unwrap();
    for iface in ["power", "management", "boot", "deploy", "inspect"] {
        assert_eq!(body[iface]["result"], true, "{iface}");
        assert!(body[iface]["reason"].is_null());
    }
    fake.set_power_valid("n1", false).unwrap();
    let body = get(&fake, "/v1/nodes/n1/validate").await.json().unwrap();
    assert_eq!(body["power"]["result"], false);
    assert!(body["power"]["reason"].is_string());
    assert_eq!(get(&fake, "/v1/nodes/nope/validate").await.status, 404);
}

#[tokio::test]
async fn show_node_by_uuid_or_name_and_404() {
    let fake = start().await;
    let uuid = fake.add_node(Node { name: Some("rack1-u7".into()), ..Node::default() });
    assert_eq!(uuid.len(), 36);
    for ident in [uuid.as_str(), "rack1-u7"] {
        let node = get(&fake, &format!("/v1/nodes/{ident}")).await.json().unwrap();
        assert_eq!(node["uuid"], uuid.as_str());
        assert_eq!(node["links"][0]["href"], format!("{}/v1/nodes/{uuid}", fake.url()));
    }
    let resp = get(&fake, "/v1/nodes/ghost").await;
    assert_eq!(resp.status, 404);
    assert_eq!(fault(&resp), ("Node ghost could not be found.".to_owned(), "Client".to_owned()));
    fake.set_inspect_interface(&uuid, "redfish").unwrap();
    assert_eq!(get(&fake, &format!("/v1/nodes/{uuid}")).await.json().unwrap()["inspect_interface"], "redfish");
    assert!(fake.set_provision_state("ghost", "active").is_err());
}

#[tokio::test]
async fn ports_create_duplicate_delete() {
    let fake = start().await;
    let node = fake.populate(1, 0, "enroll").remove(0);
    let other = fake.populate(1, 1, "enroll").remove(0);

    let resp = send(&fake, "POST", "/v1/ports", json!({"address": "AA:BB:CC:00:11:22", "node_uuid": node})).await;
    assert_eq!(resp.status, 201, "{}", resp.text());
    let port = resp.json().unwrap();
    assert_eq!(port["address"], "aa:bb:cc:00:11:22");
    assert_eq!(port["node_uuid"], node.as_str());
    assert_eq!(port["pxe_enabled"], true);
    let port_uuid = port["uuid"].as_str().unwrap().to_owned();
    assert_eq!(resp.header("location"), Some(format!("{}/v1/ports/{port_uuid}", fake.url()).as_str()));

    let resp = send(&fake, "POST", "/v1/ports", json!({"address": "aa:bb:cc:00:11:22", "node_uuid": other})).await;
    assert_eq!(resp.status, 409);
    assert_eq!(fault(&resp).0, "A port with MAC address aa:bb:cc:00:11:22 already exists.");
    let resp = send(&fake, "POST", "/v1/ports", json!({"address": "aa:bb:cc:00:11:23", "node_uuid": "nope"})).await;
    assert_eq!(resp.status, 400);
    assert_eq!(fault(&resp).0, "Expected UUID for node_uuid: nope");
    let ghost = "11111111-2222-4333-8444-555555555555";
    let resp = send(&fake, "POST", "/v1/ports", json!({"address": "aa:bb:cc:00:11:23", "node_uuid": ghost})).await;
    assert_eq!(resp.status, 400);
    assert_eq!(fault(&resp).0, format!("Node {ghost} could not be found."));
    let resp = send(&fake, "POST", "/v1/ports", json!({"address": "not-a-mac", "node_uuid": node})).await;
    assert_eq!(resp.status, 400);
    assert_eq!(fault(&resp).0, "Expected valid MAC address for address: not-a-mac");
    let resp = send(&fake, "POST", "/v1/ports", json!({"node_uuid": node})).await;
    assert_eq!(resp.status, 400);
    assert_eq!(fault(&resp).0, "Schema error for port: 'address' is a required property");

    // Filters.
    let body = get(&fake, &format!("/v1/ports?node_uuid={node}&fields=address")).await.json().unwrap();
    assert_eq!(body["ports"].as_array().unwrap().len(), 1);
    let body = get(&fake, "/v1/ports?address=AA:BB:CC:00:11:22").await.json().unwrap();
    assert_eq!(body["ports"][0]["uuid"], port_uuid.as_str());
    let name = fake.node(&other).unwrap().name.unwrap();
    let body = get(&fake, &format!("/v1/ports?node={name}&fields=node_uuid")).await.json().unwrap();
    assert_eq!(body["ports"][0]["node_uuid"], other.as_str());

    let path = format!("/v1/ports/{port_uuid}");
    assert_eq!(get(&fake, &path).await.status, 200);
    assert_eq!(send(&fake, "DELETE", &path, json!(null)).await.status, 204);
    let resp = send(&fake, "DELETE", &path, json!(null)).await;
    assert_eq!(resp.status, 404);
    assert_eq!(fault(&resp).0, format!("Port {port_uuid} could not be found."));
    assert_eq!(fake.ports().len(), 1);

    // In-process helper: same rules.
    assert!(fake.add_port(Port::new(node.clone(), "52:54:00:00:00:01")).is_err(), "taken by populate");
    assert!(fake.add_port(Port::new(node.clone(), "02:00:00:00:00:01")).is_ok());
}

#[tokio::test]
async fn deleting_a_node_deletes_its_ports() {
    let fake = start().await;
    let uuids = fake.populate(2, 2, "active");
    let resp = send(&fake, "DELETE", &format!("/v1/nodes/{}", uuids[0]), json!(null)).await;
    assert_eq!(resp.status, 204);
    assert_eq!(get(&fake, &format!("/v1/nodes/{}", uuids[0])).await.status, 404);
    let ports = get(&fake, "/v1/ports?fields=node_uuid").await.json().unwrap();
    assert_eq!(ports["ports"].as_array().unwrap().len(), 2);
    assert!(ports["ports"].as_array().unwrap().iter().all(|p| p["node_uuid"] == uuids[1].as_str()));
    assert_eq!(send(&fake, "DELETE", &format!("/v1/nodes/{}", uuids[0]), json!(null)).await.status, 404);
}

#[tokio::test]
async fn patch_add_replace_remove() {
    let fake = start().await;
    let uuid = fake.populate(1, 0, "inspect wait").remove(0);
    let path = format!("/v1/nodes/{uuid}");

    let resp = send81(
        &fake,
        "PATCH",
        &path,
        json!([
            {"op": "add", "path": "/extra/foo", "value": "bar"},
            {"op": "add", "path": "/extra/keep", "value": {"a": 1}},
            {"op": "add", "path": "/properties/cpus", "value": 4},
            {"op": "add", "path": "/description", "value": "rack 1"},
        ]),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let node = resp.json().unwrap();
    assert_eq!(node["extra"], json!({"foo": "bar", "keep": {"a": 1}}));
    assert_eq!(node["properties"]["cpus"], 4);
    assert_eq!(node["description"], "rack 1");
    assert_eq!(node["provision_state"], "inspect wait");

    let resp = send81(
        &fake,
        "PATCH",
        &path,
        json!([
            {"op": "replace", "path": "/properties/cpus", "value": 8},
            {"op": "remove", "path": "/extra/foo"},
            {"op": "add", "path": "/extra/keep/b", "value": 2},
        ]),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let stored = fake.node(&uuid).unwrap();
    assert_eq!(stored.properties["cpus"], 8);
    assert_eq!(Value::Object(stored.extra), json!({"keep": {"a": 1, "b": 2}}));

    let resp = send81(&fake, "PATCH", &path, json!([{"op": "remove", "path": "/description"}])).await;
    assert_eq!(resp.status, 200);
    assert!(resp.json().unwrap()["description"].is_null());

    // Errors: nothing applied.
    for bad in [
        json!([{"op": "replace", "path": "/extra/absent", "value": 1}]),
        json!([{"op": "remove", "path": "/properties/absent"}]),
        json!([{"op": "add", "path": "/extra/no/parent", "value": 1}]),
        json!([{"op": "add", "path": "/brand_new_root", "value": 1}]),
        json!([{"op": "replace", "path": "/uuid", "value": "x"}]),
        json!([{"op": "replace", "path": "/provision_state", "value": "active"}]),
        json!([{"op": "frobnicate", "path": "/extra/x", "value": 1}]),
        json!([{"op": "add", "path": "/extra/x"}]),
        json!([{"op": "replace", "path": "/extra", "value": "not an object"}]),
        json!({"op": "add", "path": "/extra/x", "value": 1}),
    ] {
        let resp = send81(&fake, "PATCH", &path, bad.clone()).await;
        assert_eq!(resp.status, 400, "{bad}: {}", resp.text());
        assert_eq!(fault(&resp).1, "Client");
    }
    let resp = client::send("PATCH", &format!("{}{path}", fake.url()), &[], Some(b"{not json")).await.unwrap();
    assert_eq!(resp.status, 400);
    assert_eq!(fake.node(&uuid).unwrap().provision_state, "inspect wait");
    assert_eq!(Value::Object(fake.node(&uuid).unwrap().extra), json!({"keep": {"a": 1, "b": 2}}));
    let resp = send81(&fake, "PATCH", "/v1/nodes/ghost", json!([{"op": "add", "path": "/extra/x", "value": 1}])).await;
    assert_eq!(resp.status, 404);
}

#[tokio::test]
async fn basic_auth_and_token() {
    let fake = start_with(FakeIronicConfig {
        require_basic_auth: Some(("ironic".into(), "s3cret".into())),
        ..FakeIronicConfig::default()
    })
    .await;
    let url = format!("{}/v1/nodes", fake.url());
    let resp = client::get(&url).await.unwrap();
    assert_eq!(resp.status, 401);
    assert!(resp.header("www-authenticate").is_some_and(|v| v.starts_with("Basic")));
    // "ironic:s3cret"
    let good = [("Authorization", "Basic aXJvbmljOnMzY3JldA==")];
    assert_eq!(client::send("GET", &url, &good, None).await.unwrap().status, 200);
    let bad = [("Authorization", "Basic aXJvbmljOndyb25n")];
    assert_eq!(client::send("GET", &url, &bad, None).await.unwrap().status, 401);
    assert_eq!(get(&fake, "/").await.status, 200, "the root is public");
    assert_eq!(get(&fake, "/v1").await.status, 200, "so is /v1");
    assert_eq!(get(&fake, "/_fake/calls").await.status, 200, "the admin API needs no credentials");
    assert_eq!(fake.calls().len(), 5, "refused requests are recorded too");

    let fake = start_with(FakeIronicConfig { require_token: Some("tok".into()), ..FakeIronicConfig::default() }).await;
    let url = format!("{}/v1/nodes", fake.url());
    assert_eq!(client::get(&url).await.unwrap().status, 401);
    assert_eq!(client::send("GET", &url, &[("X-Auth-Token", "nope")], None).await.unwrap().status, 401);
    assert_eq!(client::send("GET", &url, &[("X-Auth-Token", "tok")], None).await.unwrap().status, 200);
}

#[tokio::test]
async fn admin_api() {
    let fake = start().await;
    let resp =
        send(&fake, "POST", "/_fake/nodes", json!({"uuid": "node-a", "name": "a", "provision_state": "enroll"})).await;
    assert_eq!(resp.status, 201, "{}", resp.text());
    assert_eq!(resp.json().unwrap()["power_valid"], true);
    let resp =
        send(&fake, "POST", "/_fake/ports", json!({"address": "52:54:00:aa:bb:cc", "node_uuid": "node-a"})).await;
    assert_eq!(resp.status, 201, "{}", resp.text());
    let resp =
        send(&fake, "POST", "/_fake/ports", json!({"address": "52:54:00:aa:bb:cc", "node_uuid": "node-a"})).await;
    assert_eq!(resp.status, 409);
    let resp = send(&fake, "POST", "/_fake/ports", json!({"address": "52:54:00:aa:bb:cd", "node_uuid": "zzz"})).await;
    assert_eq!(resp.status, 400);

    let resp =
        send(&fake, "PUT", "/_fake/nodes/node-a/provision_state", json!({"provision_state": "inspect wait"})).await;
    assert_eq!(resp.status, 204);
    assert_eq!(fake.node("node-a").unwrap().provision_state, "inspect wait");
    let resp = send(&fake, "PUT", "/_fake/nodes/zzz/provision_state", json!({"provision_state": "x"})).await;
    assert_eq!(resp.status, 404);

    let stored = get(&fake, "/_fake/nodes/a").await.json().unwrap();
    assert_eq!(stored["uuid"], "node-a");
    assert_eq!(stored["provision_state"], "inspect wait");
    assert!(stored["boot_device"].is_null());

    let resp =
        send(&fake, "POST", "/_fake/faults", json!({"path_prefix": "/v1/ports", "status": 503, "count": 1})).await;
    assert_eq!(resp.status, 201);
    assert_eq!(get(&fake, "/v1/ports").await.status, 503);
    assert_eq!(get(&fake, "/v1/ports").await.status, 200);
    send(&fake, "POST", "/_fake/faults", json!({"status": 500})).await;
    assert_eq!(get(&fake, "/v1/ports").await.status, 500);
    assert_eq!(send(&fake, "DELETE", "/_fake/faults", json!(null)).await.status, 204);
    assert_eq!(get(&fake, "/v1/ports").await.status, 200);
    assert_eq!(send(&fake, "POST", "/_fake/faults", json!({"status": "x"})).await.status, 400);

    let resp = send(&fake, "POST", "/_fake/populate", json!({"nodes": 3, "ports_per_node": 2})).await;
    assert_eq!(resp.status, 201);
    assert_eq!(resp.json().unwrap()["uuids"].as_array().unwrap().len(), 3);
    assert_eq!(fake.nodes().len(), 4);
    assert_eq!(fake.ports().len(), 7);

    let calls = get(&fake, "/_fake/calls").await.json().unwrap();
    let paths: Vec<&str> = calls.as_array().unwrap().iter().map(|c| c["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["/v1/ports"; 4], "admin requests are not recorded");
}

#[tokio::test]
async fn stop_releases_the_port() {
    let fake = start().await;
    let addr = fake.local_addr();
    fake.inject(Fault { latency_ms: 60_000, ..Fault::default() });
    let url = format!("{}/v1/nodes", fake.url());
    let stuck = tokio::spawn(async move { client::get(&url).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    while fake.calls().is_empty() {
        assert!(Instant::now() < deadline, "the stuck request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // stop() does not wait the full minute for the stuck request: it returns (a generous deadline, far less than the
    // minute) and the stuck request never got its answer.
    tokio::time::timeout(Duration::from_secs(30), fake.stop()).await.expect("stop() returns without the minute");
    if stuck.is_finished() {
        let answer = stuck.await.expect("the client task");
        assert!(!answer.as_ref().is_ok_and(|r| r.status == 200), "the stuck request was not answered: {answer:?}");
    } else {
        stuck.abort();
    }
    let again = FakeIronic::start(addr).await.unwrap();
    assert_eq!(again.local_addr(), addr);
}
