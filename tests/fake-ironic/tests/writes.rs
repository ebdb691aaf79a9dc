//! The writes ironguard's control plane makes while processing inspection data, against the fake over real HTTP:
//! reading a whole node and its ports, patching nodes and ports, creating ports and nodes, and traits. Expected
//! messages are Ironic's (and, for schema errors, Python jsonschema's) for the same request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use fake_ironic::client::{self, Admin, Response};
use fake_ironic::{FakeIronic, Node, Port};
use serde_json::{Value, json};

const N1: &str = "11111111-2222-4333-8444-555555555555";
const N2: &str = "22222222-2222-4333-8444-555555555555";
const MAC1: &str = "52:54:00:aa:00:01";

async fn start() -> FakeIronic {
    let fake = FakeIronic::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let mut node = Node::new(N1);
    node.name = Some("n1".into());
    node.provision_state = "inspect wait".into();
    node.driver_info.insert("ipmi_address".into(), json!("10.0.0.1"));
    node.properties.insert("cpu_arch".into(), json!("x86_64"));
    fake.add_node(node);
    fake.add_node(Node { provision_state: "manageable".into(), ..Node::new(N2) });
    fake.add_port(Port::new(N1, MAC1)).unwrap();
    fake
}

/// A request at microversion `version` with an optional JSON body.
async fn call(fake: &FakeIronic, version: &str, method: &str, path: &str, body: Option<Value>) -> Response {
    let body = body.map(|b| b.to_string());
    let headers = [("Content-Type", "application/json"), ("X-OpenStack-Ironic-API-Version", version)];
    client::send(method, &format!("{}{path}", fake.url()), &headers, body.as_deref().map(str::as_bytes)).await.unwrap()
}

async fn get(fake: &FakeIronic, path: &str) -> Response {
    call(fake, "1.81", "GET", path, None).await
}

async fn send(fake: &FakeIronic, method: &str, path: &str, body: Value) -> Response {
    call(fake, "1.81", method, path, Some(body)).await
}

/// Asserts the status and returns Ironic's `faultstring`.
fn fault(resp: &Response, status: u16) -> String {
    assert_eq!(resp.status, status, "{}", resp.text());
    let body = resp.json().unwrap();
    let inner: Value = serde_json::from_str(body["error_message"].as_str().unwrap()).unwrap();
    assert_eq!(inner["faultcode"], if status >= 500 { "Server" } else { "Client" });
    inner["faultstring"].as_str().unwrap().to_owned()
}

fn ok(resp: &Response, status: u16) -> Value {
    assert_eq!(resp.status, status, "{}", resp.text());
    if resp.body.is_empty() { Value::Null } else { resp.json().unwrap() }
}

fn keys(v: &Value) -> HashSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(items: &[&str]) -> HashSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

// --- reading ---------------------------------------------------------------------------------------------------

#[tokio::test]
async fn whole_node_and_fields() {
    let fake = start().await;
    fake.add_trait(N1, "CUSTOM_GPU").unwrap();
    let node = ok(&get(&fake, &format!("/v1/nodes/{N1}")).await, 200);
    assert_eq!(node["traits"], json!(["CUSTOM_GPU"]));
    assert_eq!(node["properties"], json!({"cpu_arch": "x86_64"}));
    assert_eq!(node["extra"], json!({}));
    assert_eq!(node["driver_info"]["ipmi_address"], "10.0.0.1");
    assert_eq!(node["provision_state"], "inspect wait");
    assert_eq!(node["maintenance"], false);
    assert!(node["resource_class"].is_null());
    assert_eq!(node["boot_interface"], "ipxe");
    assert_eq!(node["conductor_group"], "");
    assert_eq!(node["instance_info"], json!({}));
    assert_eq!(node["ports"][0]["href"], format!("{}/v1/nodes/{N1}/ports", fake.url()));
    assert!(node["created_at"].as_str().unwrap().ends_with("+00:00"));

    let body = ok(&get(&fake, "/v1/nodes?fields=uuid,driver_info").await, 200);
    assert_eq!(body["nodes"].as_array().unwrap().len(), 2);
    for n in body["nodes"].as_array().unwrap() {
        assert_eq!(keys(n), set(&["uuid", "driver_info", "links"]));
    }
    let node = ok(&get(&fake, &format!("/v1/nodes/{N1}?fields=traits,properties")).await, 200);
    assert_eq!(keys(&node), set(&["uuid", "traits", "properties", "links"]));
    assert_eq!(fault(&get(&fake, "/v1/nodes?fields=uuid,shard").await, 406), "Request not acceptable.");
    assert_eq!(fault(&get(&fake, "/v1/nodes?fields=uuid,bogus").await, 400), "Field(s) \"bogus\" are not valid");
    let resp = get(&fake, &format!("/v1/nodes/{N1}?fields=uuid,bogus")).await;
    assert_eq!(fault(&resp, 400), "Field bogus is not a valid field.");
}

#[tokio::test]
async fn ports_with_fields_and_filters() {
    let fake = start().await;
    let path = format!(
        "/v1/ports?fields=uuid,address,node_uuid,pxe_enabled,extra,local_link_connection,physical_network&node_uuid={N1}"
    );
    let body = ok(&get(&fake, &path).await, 200);
    let ports = body["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(
        keys(&ports[0]),
        set(&[
            "uuid",
            "address",
            "node_uuid",
            "pxe_enabled",
            "extra",
            "local_link_connection",
            "physical_network",
            "links"
        ])
    );
    assert_eq!(ports[0]["pxe_enabled"], true);
    assert_eq!(ports[0]["extra"], json!({}));
    assert_eq!(ports[0]["local_link_connection"], json!({}));
    assert!(ports[0]["physical_network"].is_null());

    let body = ok(&get(&fake, "/v1/ports?fields=uuid,address,node_uuid&address=52:54:00:AA:00:01").await, 200);
    assert_eq!(body["ports"][0]["node_uuid"], N1);
    assert_eq!(keys(&body["ports"][0]), set(&["uuid", "address", "node_uuid", "links"]));
    let body = ok(&get(&fake, "/v1/ports?fields=uuid&address=02:00:00:00:00:09").await, 200);
    assert_eq!(body["ports"], json!([]));
    let resp = get(&fake, "/v1/ports?address=nope").await;
    assert_eq!(fault(&resp, 400), "Expected valid MAC address for address: nope");
    // With a node, Ironic ignores the address.
    let body = ok(&get(&fake, &format!("/v1/ports?node_uuid={N1}&address=02:00:00:00:00:09")).await, 200);
    assert_eq!(body["ports"].as_array().unwrap().len(), 1);
    assert_eq!(fault(&get(&fake, "/v1/ports?node_uuid=n1").await, 400), "Expected UUID for node_uuid: n1");
    assert_eq!(fault(&get(&fake, "/v1/ports?fields=name").await, 406), "Request not acceptable.");
}

// --- PATCH /v1/nodes -----------------------------------------------------------------------------------------

#[tokio::test]
async fn patch_node_properties_extra_and_driver() {
    let fake = start().await;
    let path = format!("/v1/nodes/{N1}");
    let resp = send(
        &fake,
        "PATCH",
        &path,
        json!([
            {"op": "add", "path": "/properties/cpus", "value": 8},
            {"op": "add", "path": "/properties/capabilities", "value": "boot_mode:uefi,cpu_vt:true"},
            {"op": "add", "path": "/extra/x", "value": {"y": 1}},
            {"op": "add", "path": "/resource_class", "value": "baremetal"},
            {"op": "replace", "path": "/maintenance", "value": "false"},
        ]),
    )
    .await;
    let node = ok(&resp, 200);
    assert_eq!(node["properties"]["capabilities"], "boot_mode:uefi,cpu_vt:true");
    assert_eq!(node["properties"]["cpus"], 8);
    assert_eq!(node["extra"], json!({"x": {"y": 1}}));
    assert_eq!(node["maintenance"], false);
    let stored = fake.node(N1).unwrap();
    assert_eq!(stored.properties["cpu_arch"], "x86_64");
    assert_eq!(stored.resource_class.as_deref(), Some("baremetal"));
    assert!(stored.updated_at.is_some());

    // A driver change: reset_interfaces gives the new hardware type's defaults; without it they stay.
    let patch = json!([{"op": "replace", "path": "/driver", "value": "redfish"}]);
    let node = ok(&send(&fake, "PATCH", &format!("{path}?reset_interfaces=false"), patch.clone()).await, 200);
    assert_eq!((node["driver"].as_str(), node["power_interface"].as_str()), (Some("redfish"), Some("ipmitool")));
    let patch = json!([{"op": "replace", "path": "/driver", "value": "ipmi"}]);
    ok(&send(&fake, "PATCH", &path, patch).await, 200);
    let patch = json!([{"op": "replace", "path": "/driver", "value": "redfish"}]);
    let node = ok(&send(&fake, "PATCH", &format!("{path}?reset_interfaces=True"), patch.clone()).await, 200);
    assert_eq!(node["power_interface"], "redfish");
    assert_eq!(node["inspect_interface"], "agent");

    let extra = json!([{"op": "add", "path": "/extra/z", "value": 1}]);
    let resp = send(&fake, "PATCH", &format!("{path}?reset_interfaces=true"), extra.clone()).await;
    assert_eq!(fault(&resp, 400), "The reset_interfaces parameter can only be used when changing the node's driver.");
    assert_eq!(
        ok(&send(&fake, "PATCH", &format!("{path}?reset_interfaces=false"), extra.clone()).await, 200)["extra"]["z"],
        1
    );
    let resp = send(&fake, "PATCH", &format!("{path}?reset_interfaces=maybe"), extra.clone()).await;
    assert_eq!(
        fault(&resp, 400),
        "Invalid reset_interfaces: Unrecognized value 'maybe', acceptable values are: '0', '1', 'f', 'false', 'n', \
         'no', 'off', 'on', 't', 'true', 'y', 'yes'"
    );
    let resp = call(&fake, "1.44", "PATCH", &format!("{path}?reset_interfaces=true"), Some(patch)).await;
    assert_eq!(fault(&resp, 406), "Request not acceptable.");
    let resp = send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/driver", "value": "idrac"}])).await;
    assert_eq!(
        fault(&resp, 400),
        "No valid host was found. Reason: No conductor service registered which supports driver idrac for conductor \
         group \"\". Ensure the driver is valid and enabled."
    );
    assert_eq!(fake.node(N1).unwrap().driver, "redfish");
}

#[tokio::test]
async fn patch_node_errors() {
    let fake = start().await;
    let path = format!("/v1/nodes/{N1}");
    let before = fake.node(N1).unwrap();
    let resp =
        send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/provision_state", "value": "active"}])).await;
    assert!(fault(&resp, 400).starts_with(
        "Cannot patch /provision_state. Only the following can be updated: automated_clean, bios_interface, "
    ));
    let resp = send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/traits", "value": ["CUSTOM_A"]}])).await;
    assert!(fault(&resp, 400).starts_with("Cannot patch /traits."));
    let resp = send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/extra", "value": 5}])).await;
    assert_eq!(fault(&resp, 400), "Schema error for patch: 5 is not of type 'object', 'null'");
    let resp = send(&fake, "PATCH", &path, json!([{"op": "remove", "path": "/driver"}])).await;
    assert_eq!(fault(&resp, 400), "Schema error for patch: 'driver' is a required property");
    let resp =
        send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/maintenance", "value": "perhaps"}])).await;
    assert!(fault(&resp, 400).starts_with("Invalid maintenance: Unrecognized value 'perhaps'"));
    let resp = send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/extra/absent", "value": 1}])).await;
    assert_eq!(
        fault(&resp, 400),
        "Couldn't apply patch '{'op': 'replace', 'path': '/extra/absent', 'value': 1}'. Reason: can't replace a \
         non-existent object 'absent'"
    );
    let resp = send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/shard", "value": "a"}])).await;
    assert_eq!(fault(&resp, 406), "Request not acceptable.");
    let resp = send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/name", "value": "has space"}])).await;
    assert_eq!(fault(&resp, 400), format!("Node {N1}: Cannot change name to invalid name 'has space'"));
    let resp = send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/name", "value": "detail"}])).await;
    assert!(fault(&resp, 400).starts_with("The word \"detail\" is reserved and can not be used as a node name."));
    fake.update_node(N2, |n| n.name = Some("taken".into())).unwrap();
    let resp = send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/name", "value": "taken"}])).await;
    assert_eq!(fault(&resp, 409), "A node with name taken already exists.");
    let resp = send(&fake, "PATCH", &path, json!({"op": "add"})).await;
    assert_eq!(fault(&resp, 400), "Schema error for patch: {'op': 'add'} is not of type 'array'");
    let ghost = "/v1/nodes/99999999-2222-4333-8444-555555555555";
    let resp = send(&fake, "PATCH", ghost, json!([{"op": "add", "path": "/extra/x", "value": 1}])).await;
    assert_eq!(fault(&resp, 404), "Node 99999999-2222-4333-8444-555555555555 could not be found.");
    assert_eq!(fake.node(N1).unwrap(), before, "failed patches change nothing");

    // States.
    fake.set_provision_state(N1, "inspecting").unwrap();
    let extra = json!([{"op": "add", "path": "/extra/x", "value": 1}]);
    let resp = send(&fake, "PATCH", &path, extra.clone()).await;
    assert_eq!(fault(&resp, 409), format!("Cannot update node \"{N1}\" while it is in state \"inspecting\"."));
    assert_eq!(call(&fake, "1.38", "PATCH", &path, Some(extra.clone())).await.status, 200, "allowed before 1.39");
    fake.set_provision_state(N1, "clean wait").unwrap();
    let resp = send(&fake, "PATCH", "/v1/nodes/n1", extra.clone()).await;
    assert_eq!(fault(&resp, 409), "Node n1 can not be updated while a state transition is in progress.");
    fake.set_provision_state(N1, "active").unwrap();
    assert_eq!(send(&fake, "PATCH", &path, extra).await.status, 200, "extra may change on an active node");
    let resp = send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/boot_interface", "value": "pxe"}])).await;
    assert_eq!(
        fault(&resp, 409),
        format!(
            "Node {N1} can not have boot_interface updated unless it is in one of allowed (enroll, inspecting, inspect \
             wait, manageable, available) states or in maintenance mode. Current state is 'active'."
        )
    );
}

// --- POST /v1/ports --------------------------------------------------------------------------------------------

#[tokio::test]
async fn create_ports() {
    let fake = start().await;
    let body = json!({
        "node_uuid": N1,
        "address": "52:54:00:AA:00:02",
        "pxe_enabled": false,
        "extra": {"client-id": "ff:00"},
        "local_link_connection": {"switch_id": "AA:BB:CC:DD:EE:FF", "port_id": "Eth1/1", "switch_info": "sw1"},
        "physical_network": "physnet1",
    });
    let resp = send(&fake, "POST", "/v1/ports", body).await;
    let port = ok(&resp, 201);
    let uuid = port["uuid"].as_str().unwrap().to_owned();
    assert_eq!(resp.header("location"), Some(format!("{}/v1/ports/{uuid}", fake.url()).as_str()));
    assert_eq!(port["address"], "52:54:00:aa:00:02");
    assert_eq!(port["pxe_enabled"], false);
    assert_eq!(port["extra"], json!({"client-id": "ff:00"}));
    assert_eq!(port["local_link_connection"]["switch_id"], "aa:bb:cc:dd:ee:ff");
    assert_eq!(port["physical_network"], "physnet1");
    assert_eq!(port["is_smartnic"], false);
    let stored = fake.port(&uuid).unwrap();
    assert!(!stored.pxe_enabled);
    assert_eq!(stored.local_link_connection["port_id"], "Eth1/1");
    assert_eq!(fake.ports_of("n1").len(), 2);

    let minimal = ok(
        &send(
            &fake,
            "POST",
            "/v1/ports",
            json!({"node_uuid": N2, "address": "02:00:00:00:00:01", "pxe_enabled": "yes"}),
        )
        .await,
        201,
    );
    assert_eq!((minimal["pxe_enabled"].as_bool(), minimal["local_link_connection"].clone()), (Some(true), json!({})));

    let cases = [
        (json!({"node_uuid": N1, "address": MAC1}), 409, format!("A port with MAC address {MAC1} already exists.")),
        (
            json!({"node_uuid": N2, "address": "02:00:00:00:00:02", "uuid": uuid}),
            409,
            format!("A port with UUID {uuid} already exists."),
        ),
        (
            json!({"node_uuid": "99999999-2222-4333-8444-555555555555", "address": "02:00:00:00:00:03"}),
            400,
            "Node 99999999-2222-4333-8444-555555555555 could not be found.".to_owned(),
        ),
        (
            json!({"node_uuid": N1, "address": "02:00:00:00:00:03", "foo": 1}),
            400,
            "Schema error for port: Additional properties are not allowed ('foo' was unexpected)".to_owned(),
        ),
        (
            json!({"address": "02:00:00:00:00:03"}),
            400,
            "Schema error for port: {'address': '02:00:00:00:00:03'} is not valid under any of the given schemas. \
             Possible root cause: 'node_ident' is a required property"
                .to_owned(),
        ),
        (
            json!({"node_uuid": N1, "address": "02:00:00:00:00:03", "pxe_enabled": 5}),
            400,
            "Schema error for port: 5 is not of type 'string', 'boolean', 'null'".to_owned(),
        ),
        (
            json!({"node_uuid": N1, "address": "02:00:00:00:00:03", "local_link_connection": {"port_id": "Eth1"}}),
            400,
            "Schema error for local_link_connection: {'port_id': 'Eth1'} is not valid under any of the given \
             schemas. Possible root cause: 'switch_id' is a required property"
                .to_owned(),
        ),
        (
            json!({"node_uuid": N1, "address": "02:00:00:00:00:03", "physical_network": ""}),
            400,
            "A non-empty value is required when setting physical_network".to_owned(),
        ),
        (
            json!({"node_uuid": N1, "address": "02:00:00:00:00:03", "portgroup_uuid": N2}),
            400,
            format!("Portgroup {N2} could not be found."),
        ),
        (
            json!({"node_uuid": N1, "address": "02:00:00:00:00:03", "name": "p"}),
            406,
            "Request not acceptable.".to_owned(),
        ),
        (json!({"node_ident": "n1", "address": "02:00:00:00:00:03"}), 406, "Request not acceptable.".to_owned()),
    ];
    for (body, status, message) in cases {
        assert_eq!(fault(&send(&fake, "POST", "/v1/ports", body.clone()).await, status), message, "{body}");
    }
    let old = json!({"node_uuid": N1, "address": "02:00:00:00:00:03", "pxe_enabled": true});
    assert_eq!(fault(&call(&fake, "1.18", "POST", "/v1/ports", Some(old)).await, 406), "Request not acceptable.");
    assert_eq!(fake.ports().len(), 3);
}

// --- PATCH /v1/ports -------------------------------------------------------------------------------------------

#[tokio::test]
async fn patch_ports() {
    let fake = start().await;
    let uuid = fake.ports_of(N1)[0].uuid.clone();
    let path = format!("/v1/ports/{uuid}");
    let resp = send(
        &fake,
        "PATCH",
        &path,
        json!([
            {"op": "replace", "path": "/pxe_enabled", "value": false},
            {"op": "add", "path": "/local_link_connection/port_id", "value": "Eth1/1"},
            {"op": "add", "path": "/local_link_connection/switch_id", "value": "AA:BB:CC:DD:EE:FF"},
            {"op": "add", "path": "/physical_network", "value": "physnet1"},
            {"op": "add", "path": "/extra/client-id", "value": "ff:00:00"},
        ]),
    )
    .await;
    let port = ok(&resp, 200);
    assert_eq!(port["pxe_enabled"], false);
    assert_eq!(port["local_link_connection"], json!({"port_id": "Eth1/1", "switch_id": "aa:bb:cc:dd:ee:ff"}));
    assert_eq!(port["physical_network"], "physnet1");
    assert_eq!(port["extra"], json!({"client-id": "ff:00:00"}));
    let stored = fake.port(&uuid).unwrap();
    assert_eq!(stored.physical_network.as_deref(), Some("physnet1"));
    assert!(stored.updated_at.is_some());

    let before = fake.port(&uuid).unwrap();
    let cases = [
        (
            json!([{"op": "remove", "path": "/local_link_connection/port_id"}]),
            400,
            "Schema error for local_link_connection: {'switch_id': 'aa:bb:cc:dd:ee:ff'} is not valid under any of the \
             given schemas. Possible root cause: 'port_id' is a required property"
                .to_owned(),
        ),
        (
            json!([{"op": "add", "path": "/local_link_connection/color", "value": "red"}]),
            400,
            "Schema error for local_link_connection: {'color': 'red', 'port_id': 'Eth1/1', 'switch_id': \
             'aa:bb:cc:dd:ee:ff'} is not valid under any of the given schemas. Possible root cause: Additional \
             properties are not allowed ('color' was unexpected)"
                .to_owned(),
        ),
        (
            json!([{"op": "add", "path": "/local_link_connection/switch_id", "value": "switch-1"}]),
            400,
            "Expected a MAC address or OpenFlow datapath ID but received switch-1.".to_owned(),
        ),
        (
            json!([{"op": "replace", "path": "/uuid", "value": N2}]),
            400,
            "Cannot patch /uuid. Only the following can be updated: address, extra, is_smartnic, \
             local_link_connection, node_ident, node_uuid, physical_network, portgroup_uuid, pxe_enabled, name, \
             description, vendor, category, available_for_dynamic_portgroup"
                .to_owned(),
        ),
        (
            json!([{"op": "replace", "path": "/address", "value": "bad"}]),
            400,
            "Expected valid MAC address for address: bad".to_owned(),
        ),
        (
            json!([{"op": "replace", "path": "/node_uuid", "value": "ghost"}]),
            400,
            "Unable to apply the requested node_uuid 'ghost'. Requested value was invalid.".to_owned(),
        ),
        (
            json!([{"op": "replace", "path": "/physical_network", "value": ""}]),
            400,
            "A non-empty value is required when setting physical_network".to_owned(),
        ),
    ];
    for (patch, status, message) in cases {
        assert_eq!(fault(&send(&fake, "PATCH", &path, patch.clone()).await, status), message, "{patch}");
    }
    assert_eq!(fake.port(&uuid).unwrap(), before, "failed patches change nothing");

    // Another port's address, an unknown port.
    let other =
        ok(&send(&fake, "POST", "/v1/ports", json!({"node_uuid": N2, "address": "02:00:00:00:00:01"})).await, 201);
    let resp =
        send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/address", "value": "02:00:00:00:00:01"}])).await;
    assert_eq!(fault(&resp, 409), "A port with MAC address 02:00:00:00:00:01 already exists.");
    let ghost = "/v1/ports/99999999-2222-4333-8444-555555555555";
    let resp = send(&fake, "PATCH", ghost, json!([{"op": "add", "path": "/extra/x", "value": 1}])).await;
    assert_eq!(fault(&resp, 404), "Port 99999999-2222-4333-8444-555555555555 could not be found.");

    // Moving a port to another node (by name).
    let moved = ok(
        &send(
            &fake,
            "PATCH",
            &format!("/v1/ports/{}", other["uuid"].as_str().unwrap()),
            json!([{"op": "replace", "path": "/node_uuid", "value": "n1"}]),
        )
        .await,
        200,
    );
    assert_eq!(moved["node_uuid"], N1);

    // States: connectivity only in enroll, inspecting, inspect wait or manageable (or maintenance); nothing while
    // inspecting from 1.39.
    fake.set_provision_state(N1, "active").unwrap();
    let resp = send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/pxe_enabled", "value": true}])).await;
    assert_eq!(
        fault(&resp, 409),
        format!(
            "Port {uuid} can not have any connectivity attributes (portgroup_id, pxe_enabled, local_link_connection, \
             physical_network) updated unless node {N1} is in a enroll, inspecting, inspect wait, manageable state or \
             in maintenance mode. The current state is active."
        )
    );
    let resp =
        send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/address", "value": "02:00:00:00:00:07"}])).await;
    assert_eq!(
        fault(&resp, 409),
        format!("Cannot update hardware address for port {uuid} as node {N1} is active or has instance UUID assigned")
    );
    ok(&send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/extra/a", "value": 1}])).await, 200);
    fake.update_node(N1, |n| n.maintenance = true).unwrap();
    ok(&send(&fake, "PATCH", &path, json!([{"op": "replace", "path": "/pxe_enabled", "value": true}])).await, 200);
    fake.update_node(N1, |n| {
        n.maintenance = false;
        n.provision_state = "inspecting".into();
    })
    .unwrap();
    let resp = send(&fake, "PATCH", &path, json!([{"op": "add", "path": "/extra/b", "value": 1}])).await;
    assert_eq!(
        fault(&resp, 409),
        format!("Cannot update port \"{uuid}\" on \"{N1}\" while it is in state \"inspecting\".")
    );
}

// --- traits ----------------------------------------------------------------------------------------------------

#[tokio::test]
async fn traits() {
    let fake = start().await;
    let path = format!("/v1/nodes/{N1}/traits");
    let resp = call(&fake, "1.81", "PUT", &format!("{path}/CUSTOM_B"), None).await;
    ok(&resp, 204);
    assert_eq!(resp.header("location"), Some(format!("{}/v1/nodes/{N1}/traits/CUSTOM_B", fake.url()).as_str()));
    ok(&call(&fake, "1.81", "PUT", "/v1/nodes/n1/traits/HW_CPU_X86_AVX2", None).await, 204);
    ok(&call(&fake, "1.81", "PUT", &format!("{path}/CUSTOM_B"), None).await, 204);
    assert_eq!(ok(&get(&fake, &path).await, 200), json!({"traits": ["CUSTOM_B", "HW_CPU_X86_AVX2"]}));
    assert_eq!(
        ok(&get(&fake, &format!("/v1/nodes/{N1}")).await, 200)["traits"],
        json!(["CUSTOM_B", "HW_CPU_X86_AVX2"])
    );

    ok(&call(&fake, "1.81", "DELETE", &format!("{path}/CUSTOM_B"), None).await, 204);
    let resp = call(&fake, "1.81", "DELETE", &format!("{path}/CUSTOM_B"), None).await;
    assert_eq!(fault(&resp, 404), format!("Node {N1} doesn't have a trait 'CUSTOM_B'"));
    assert_eq!(fake.traits(N1), Some(vec!["HW_CPU_X86_AVX2".to_owned()]));

    let resp = call(&fake, "1.81", "PUT", &format!("{path}/lower"), None).await;
    assert_eq!(
        fault(&resp, 400),
        "Schema error for trait: 'lower' is not valid under any of the given schemas. Possible root cause: 'lower' \
         does not match '^CUSTOM_[A-Z0-9_]+$'"
    );
    let resp = call(&fake, "1.81", "PUT", &format!("{path}/CUSTOM_X"), Some(json!({"traits": ["CUSTOM_Y"]}))).await;
    assert!(fault(&resp, 400).starts_with("A single node trait may be added via PUT"));
    let resp = call(&fake, "1.81", "PUT", &format!("{path}/CUSTOM_X"), Some(json!({"foo": 1}))).await;
    assert_eq!(
        fault(&resp, 400),
        "Schema error for body: Additional properties are not allowed ('foo' was unexpected)"
    );
    let resp = call(&fake, "1.81", "PUT", "/v1/nodes/ghost/traits/CUSTOM_X", None).await;
    assert_eq!(fault(&resp, 404), "Node ghost could not be found.");
    let resp = call(&fake, "1.36", "PUT", &format!("{path}/CUSTOM_X"), None).await;
    assert_eq!(fault(&resp, 404), "The resource could not be found.");

    // Replace all, the limit, delete all.
    ok(&call(&fake, "1.81", "PUT", &path, Some(json!({"traits": ["CUSTOM_Z", "CUSTOM_A", "CUSTOM_Z"]}))).await, 204);
    assert_eq!(fake.traits(N1), Some(vec!["CUSTOM_A".to_owned(), "CUSTOM_Z".to_owned()]));
    let many: Vec<String> = (0..51).map(|i| format!("CUSTOM_T{i}")).collect();
    let resp = call(&fake, "1.81", "PUT", &path, Some(json!({"traits": many}))).await;
    assert_eq!(
        fault(&resp, 400),
        "Could not modify traits for node 1 as it would exceed the maximum number of traits per node (51 vs. 50)"
    );
    ok(&call(&fake, "1.81", "DELETE", &path, None).await, 204);
    assert_eq!(fake.traits(N1), Some(vec![]));
}

// --- POST /v1/nodes --------------------------------------------------------------------------------------------

#[tokio::test]
async fn create_nodes() {
    let fake = start().await;
    let body = json!({
        "driver": "fake-hardware",
        "driver_info": {"ipmi_address": "10.1.2.3"},
        "resource_class": "baremetal",
        "name": "discovered-1",
        "properties": {"cpus": 4},
    });
    let resp = send(&fake, "POST", "/v1/nodes", body).await;
    let node = ok(&resp, 201);
    let uuid = node["uuid"].as_str().unwrap().to_owned();
    assert_eq!(uuid.len(), 36);
    assert_eq!(resp.header("location"), Some(format!("{}/v1/nodes/{uuid}", fake.url()).as_str()));
    assert_eq!(node["provision_state"], "enroll");
    assert!(node["power_state"].is_null());
    assert_eq!(node["driver"], "fake-hardware");
    assert_eq!(node["driver_info"], json!({"ipmi_address": "10.1.2.3"}));
    assert_eq!(node["resource_class"], "baremetal");
    assert_eq!(node["properties"], json!({"cpus": 4}));
    assert_eq!(node["traits"], json!([]));
    assert_eq!(node["power_interface"], "fake");
    let stored = fake.node("discovered-1").unwrap();
    assert_eq!(stored.uuid, uuid);
    assert_eq!(fake.power_state(&uuid).as_deref(), Some(""));

    let old = call(&fake, "1.10", "POST", "/v1/nodes", Some(json!({"driver": "ipmi"}))).await;
    assert_eq!(ok(&old, 201)["provision_state"], "available");

    let cases = [
        (json!({"driver": "ipmi", "foo": 1}), 400, "Schema error for node: Additional properties are not allowed ('foo' was unexpected)".to_owned()),
        (json!({"driver_info": {}}), 400, "Schema error for node: 'driver' is a required property".to_owned()),
        (json!({"driver": "ipmi", "traits": ["CUSTOM_A"]}), 400, "Schema error for node: Additional properties are not allowed ('traits' was unexpected)".to_owned()),
        (json!({"driver": "ipmi", "properties": "x", "name": 5}), 400, "Schema error for node: 'x' is not of type 'object', 'null'".to_owned()),
        (
            json!({"driver": "nope"}),
            400,
            "No valid host was found. Reason: No conductor service registered which supports driver nope for conductor \
             group \"\". Ensure the driver is valid and enabled."
                .to_owned(),
        ),
        (json!({"driver": "ipmi", "name": "discovered-1"}), 409, "A node with name discovered-1 already exists.".to_owned()),
        (json!({"driver": "ipmi", "uuid": N1}), 409, format!("A node with UUID {N1} already exists.")),
        (json!({"driver": "ipmi", "name": "bad name"}), 400, "Cannot create node with invalid name 'bad name'".to_owned()),
        (json!({"driver": "ipmi", "uuid": "x"}), 400, "Expected UUID for uuid: x".to_owned()),
        (json!({"driver": "ipmi", "shard": "s1"}), 406, "Request not acceptable.".to_owned()),
    ];
    for (body, status, message) in cases {
        assert_eq!(fault(&send(&fake, "POST", "/v1/nodes", body.clone()).await, status), message, "{body}");
    }
    let resp = call(&fake, "1.49", "POST", "/v1/nodes", Some(json!({"driver": "ipmi", "owner": "p"}))).await;
    assert_eq!(fault(&resp, 406), "Request not acceptable.");
    assert_eq!(fake.nodes().len(), 4);
}

// --- test-side helpers -----------------------------------------------------------------------------------------

#[tokio::test]
async fn calls_and_admin_views() {
    let fake = start().await;
    fake.clear_calls();
    send(&fake, "PATCH", &format!("/v1/nodes/{N1}"), json!([{"op": "add", "path": "/extra/a", "value": 1}])).await;
    call(&fake, "1.81", "PUT", &format!("/v1/nodes/{N1}/traits/CUSTOM_A"), None).await;
    send(&fake, "POST", "/v1/ports", json!({"node_uuid": N1, "address": "02:00:00:00:00:05"})).await;
    let seen: Vec<(String, String)> = fake.calls().into_iter().map(|c| (c.method, c.path)).collect();
    assert_eq!(
        seen,
        [
            ("PATCH".to_owned(), format!("/v1/nodes/{N1}")),
            ("PUT".to_owned(), format!("/v1/nodes/{N1}/traits/CUSTOM_A")),
            ("POST".to_owned(), "/v1/ports".to_owned()),
        ]
    );

    let admin = Admin::new(fake.url());
    let node = admin.node("n1").await.unwrap().unwrap();
    assert_eq!((node.extra["a"].clone(), node.traits.clone()), (json!(1), vec!["CUSTOM_A".to_owned()]));
    assert_eq!(node.properties["cpu_arch"], "x86_64");
    assert!(admin.node("ghost").await.unwrap().is_none());
    let ports = admin.ports_of(N1).await.unwrap().unwrap();
    assert_eq!(ports.len(), 2);
    assert!(ports.iter().all(|p| p.pxe_enabled && p.local_link_connection.is_empty()));
    assert!(admin.ports_of("ghost").await.unwrap().is_none());
    let port = admin.port(&ports[0].uuid).await.unwrap().unwrap();
    assert_eq!(port, ports[0]);
    assert_eq!(admin.calls().await.unwrap().len(), 3, "admin requests are not recorded");

    // Nodes and ports with the new fields, through the admin API and in process.
    let mut n = Node::new("33333333-2222-4333-8444-555555555555");
    n.traits = vec!["CUSTOM_X".into()];
    n.other.insert("description".into(), json!("from a test"));
    let stored = admin.add_node(&n).await.unwrap();
    assert_eq!(stored.traits, ["CUSTOM_X"]);
    let shown = ok(&get(&fake, &format!("/v1/nodes/{}", n.uuid)).await, 200);
    assert_eq!((shown["description"].as_str(), shown["traits"].clone()), (Some("from a test"), json!(["CUSTOM_X"])));
    let mut p = Port::new(n.uuid.clone(), "02:00:00:00:00:06");
    p.pxe_enabled = false;
    p.physical_network = Some("physnet2".into());
    assert!(!admin.add_port(&p).await.unwrap().pxe_enabled);
    let listed =
        ok(&get(&fake, &format!("/v1/ports?node_uuid={}&fields=physical_network,pxe_enabled", n.uuid)).await, 200);
    assert_eq!(listed["ports"][0]["physical_network"], "physnet2");
    assert_eq!(listed["ports"][0]["pxe_enabled"], false);

    let changed = fake
        .update_port(&p.uuid, |p| {
            p.extra.insert("k".into(), json!("v"));
        })
        .unwrap();
    assert_eq!(changed.extra["k"], "v");
    assert!(fake.update_port(&p.uuid, |p| p.address = MAC1.into()).is_err(), "another port's address");
    assert_eq!(fake.port(&p.uuid).unwrap().address, "02:00:00:00:00:06");
}
