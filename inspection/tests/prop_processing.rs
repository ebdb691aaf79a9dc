//! Property tests of ironic-inspector's processing hooks on hostile ramdisk data: arbitrary JSON and the real
//! IPA-shaped fixtures damaged (keys dropped, types changed, huge and negative numbers, odd strings, empty
//! containers), through every hook ironguard knows (ironic-inspector's and Ironic's, the optional ones included),
//! with nodes and ports as hostile as Ironic could return them. Never a panic: a failure is a `HookError` naming a
//! configured hook; the plan it leaves can always be turned into Ironic requests.
//!
//! Case count: `IRONGUARD_PROPTEST_CASES` (default below); `scripts/fuzz.sh` runs many more.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use ironguard_inspection::processing::{
    AddPorts, CapabilitiesConfig, KeepPorts, KnownAccelerator, NodeView, PciAlias, PciDevicesConfig, Pipeline, Plan,
    ProcessingConfig, lookup_attributes, node_view, parse_capabilities,
};
use ironguard_testkit::hostile::{json, json_object, mutate, mutation, ramdisk_data, text};
use ironguard_testkit::prop::check;
use proptest::prelude::*;
use serde_json::{Value, json};

const DEFAULT_CASES: u32 = 1500;
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proptest-regressions/prop_processing.txt");

fn cases() -> u32 {
    ironguard_testkit::prop::cases("IRONGUARD_PROPTEST_CASES", DEFAULT_CASES)
}

/// Every hook, with every optional feature configured, in each port policy.
fn configs() -> Vec<ProcessingConfig> {
    let every_hook = Pipeline::valid_hook_names().join(",");
    let full = |add_ports, keep_ports, overwrite_existing, extra_hardware_strict| ProcessingConfig {
        processing_hooks: every_hook.clone(),
        add_ports,
        keep_ports,
        overwrite_existing,
        update_pxe_enabled: true,
        disk_partitioning_spacing: overwrite_existing,
        power_off: true,
        capabilities: CapabilitiesConfig { boot_mode: true, ..CapabilitiesConfig::default() },
        pci_devices: PciDevicesConfig {
            alias: vec![PciAlias { vendor_id: "10de".into(), product_id: "1eb8".into(), name: "gpu_t4".into() }],
        },
        extra_hardware_strict,
        physnet_cidr_map: vec!["192.0.2.0/24:physnet1".into(), "2001:db8::/32:physnet2".into()],
        accelerators: vec![KnownAccelerator {
            vendor_id: "10de".into(),
            device_id: "1eb8".into(),
            device_type: "GPU".into(),
            device_info: "NVIDIA Corporation Tesla T4".into(),
        }],
    };
    vec![
        ProcessingConfig::default(),
        full(AddPorts::Pxe, KeepPorts::All, true, false),
        full(AddPorts::All, KeepPorts::Present, false, true),
        full(AddPorts::Active, KeepPorts::Added, true, false),
        full(AddPorts::Disabled, KeepPorts::Present, false, false),
    ]
}

/// A node as Ironic returns it (`GET /v1/nodes/{uuid}`), then damaged, or any JSON at all.
fn ironic_node() -> BoxedStrategy<Value> {
    let real = json!({
        "uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
        "name": "node-1",
        "provision_state": "manageable",
        "driver": "ipmi",
        "driver_info": {"ipmi_address": "192.0.2.200"},
        "properties": {
            "capabilities": "boot_mode:bios,cpu_vt:true",
            "local_gb": "19",
            "cpus": 4,
            "memory_mb": "8192",
            "cpu_arch": "x86_64",
            "root_device": {"name": "/dev/sda", "size": ">= 10"},
            "inspection_scope": "rack-1",
        },
        "extra": {"on_node": true},
        "traits": ["CUSTOM_X"],
    });
    prop_oneof![
        3 => prop::collection::vec(mutation(), 0..6).prop_map(move |ms| {
            let mut n = real.clone();
            for m in &ms {
                mutate(&mut n, m);
            }
            n
        }),
        1 => json(),
        1 => json_object(),
    ]
    .boxed()
}

/// The node's ports as Ironic returns them, damaged, or anything.
fn ironic_ports() -> BoxedStrategy<Vec<Value>> {
    let port = (
        text(),
        prop_oneof![Just("52:54:00:12:34:56".to_string()), Just("52:54:00:65:43:21".to_string()), text()],
        any::<bool>(),
        prop::collection::vec(mutation(), 0..3),
    )
        .prop_map(|(uuid, address, pxe, ms)| {
            let mut p = json!({
                "uuid": uuid,
                "address": address,
                "node_uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
                "pxe_enabled": pxe,
                "extra": {"client-id": "x"},
                "local_link_connection": {"switch_id": "00:00:5e:00:53:01", "port_id": "Ethernet1/3"},
                "physical_network": "physnet1",
            });
            for m in &ms {
                mutate(&mut p, m);
            }
            p
        });
    prop::collection::vec(prop_oneof![4 => port, 1 => json()], 0..4).boxed()
}

/// Everything the plan offers must be computable for any node.
fn exercise_plan(plan: &Plan, node: &NodeView) {
    let _ = plan.node_patch(node);
    let _ = plan.new_ports();
    let _ = plan.port_patches();
    let _ = plan.port_deletes();
    let _ = plan.write_requests(node);
    let _ = plan.is_empty();
    for p in &node.ports {
        let _ = plan.port_by_address(node, &p.address);
    }
    for op in plan.node_patch(node) {
        // What is sent to Ironic serialises.
        serde_json::to_string(&op).unwrap();
    }
}

#[test]
fn every_hook_on_hostile_ramdisk_data_fails_cleanly_or_plans() {
    let pipelines: Vec<(Pipeline, Vec<&'static str>)> = configs()
        .iter()
        .map(|c| {
            let p = Pipeline::new(c).expect("the configuration is valid");
            let names = p.hook_names();
            (p, names)
        })
        .collect();
    // Every hook runs in the full configurations.
    assert_eq!(pipelines[1].1.len(), 21, "{:?}", pipelines[1].1);
    let strategy = (ramdisk_data(), ironic_node(), ironic_ports(), any::<prop::sample::Index>());
    let (planned, refused) = (AtomicUsize::new(0), AtomicUsize::new(0));
    check(REGRESSIONS, "processing_hooks_on_hostile_data", cases(), strategy, |(data, node, ports, which)| {
        let (pipeline, names) = &pipelines[which.index(pipelines.len())];
        let mut data = data;
        for e in pipeline.before_processing(&mut data) {
            prop_assert!(names.contains(&e.hook.as_str()), "unknown hook in {e}");
        }
        let (macs, bmcs) = lookup_attributes(&data);
        let attrs = ironguard_inspection::lookup::lookup_attributes(&data, None);
        prop_assert!(attrs.macs.len() <= macs.len() + data["macs"].as_array().map_or(0, Vec::len));
        prop_assert!(attrs.bmc_addresses.len() <= bmcs.len());
        let view = node_view(&node, &ports);
        let mut plan = Plan::new();
        match pipeline.before_update(&mut data, &view, &mut plan) {
            Ok(()) => planned.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                prop_assert!(names.contains(&e.hook.as_str()), "unknown hook in {e}");
                prop_assert!(!e.message.is_empty());
                refused.fetch_add(1, Ordering::Relaxed)
            }
        };
        exercise_plan(&plan, &view);
        // The processed data is still a document that can be stored and served.
        serde_json::to_string(&data).unwrap();
        Ok(())
    });
    eprintln!("  (before_update: {} planned, {} refused by a hook)", planned.into_inner(), refused.into_inner());
}

#[test]
fn the_real_fixtures_damaged_one_key_at_a_time() {
    // The one-mutation neighbourhood of each fixture, through the full pipeline with a plain node: where most
    // real-world damage (a collector failing, an old IPA) lands.
    let pipeline = Pipeline::new(&configs()[1]).expect("valid");
    let node = NodeView {
        uuid: "1be26c0b-03f2-4d2e-ae87-c02d7f33c123".into(),
        provision_state: "manageable".into(),
        ..Default::default()
    };
    let strategy = (prop::sample::select(ironguard_testkit::hostile::fixtures()), mutation());
    check(REGRESSIONS, "processing_fixture_one_mutation", cases(), strategy, |(mut data, m)| {
        mutate(&mut data, &m);
        let _ = pipeline.before_processing(&mut data);
        let mut plan = Plan::new();
        let _ = pipeline.before_update(&mut data, &node, &mut plan);
        exercise_plan(&plan, &node);
        Ok(())
    });
}

#[test]
fn capabilities_of_any_shape_are_parsed_or_refused() {
    check(REGRESSIONS, "processing_parse_capabilities", cases(), json(), |caps| {
        if let (Value::String(s), Ok(pairs)) = (&caps, parse_capabilities(&caps)) {
            // From the string form, every key and value is a piece of the string.
            for (k, v) in pairs {
                prop_assert!(s.contains(&k) && s.contains(&v), "{s:?} gave {k:?}:{v:?}");
            }
        }
        Ok(())
    });
}
