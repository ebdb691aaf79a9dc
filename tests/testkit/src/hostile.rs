//! Strategies for hostile JSON, for the property tests of every parser of outside input: arbitrary documents of
//! bounded size, and the real IPA-shaped fixtures (`tests/data/ipa-*.json`) with keys dropped, types changed, huge
//! or negative numbers, odd strings and empty containers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Number, Value};

/// The IPA-shaped fixtures the hooks' unit tests use.
pub fn fixtures() -> Vec<Value> {
    [
        include_str!("../../data/ipa-two-nics-two-disks.json"),
        include_str!("../../data/ipa-lldp.json"),
        include_str!("../../data/ipa-pci-extra-hardware.json"),
        include_str!("../../data/ipa-ramdisk-error.json"),
    ]
    .iter()
    .map(|t| serde_json::from_str(t).expect("fixture is JSON"))
    .collect()
}

/// Keys the ramdisk, Ironic and the rules use: arbitrary objects built from them reach deep into the parsers.
const KEYS: &[&str] = &[
    "inventory",
    "interfaces",
    "name",
    "mac_address",
    "ipv4_address",
    "ipv6_address",
    "has_carrier",
    "lldp",
    "vendor",
    "product",
    "client_id",
    "biosdevname",
    "speed_mbps",
    "pci_address",
    "driver",
    "cpu",
    "count",
    "architecture",
    "flags",
    "model_name",
    "frequency",
    "memory",
    "physical_mb",
    "total",
    "disks",
    "size",
    "rotational",
    "serial",
    "wwn",
    "model",
    "hctl",
    "by_path",
    "bmc_address",
    "bmc_v6address",
    "boot",
    "current_boot_mode",
    "root_disk",
    "boot_interface",
    "error",
    "data",
    "extra",
    "pci_devices",
    "pci_devices_list",
    "vendor_id",
    "product_id",
    "ipmi_address",
    "macs",
    "all_interfaces",
    "local_gb",
    "cpus",
    "cpu_arch",
    "memory_mb",
    "capabilities",
    "properties",
    "root_device",
    "node_uuid",
    "logs",
    "system_vendor",
    "manufacturer",
    "product_name",
    "numa_topology",
    "raid",
    "physical_network",
    "local_link_connection",
    "switch_id",
    "port_id",
    "switch_info",
    "pxe",
    "ip",
    "mac",
    "uuid",
    "driver_info",
    "provision_state",
    "traits",
    "inspection_scope",
];

/// Strings that look like what the parsers expect, and strings that do not.
pub fn text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => any::<String>(),
        2 => prop::sample::select(vec![
            "", " ", "0", "-1", "1e400", "NaN", "true", "null", "x86_64", "/dev/sda", "/dev/disk/by-path/pci-0",
            "52:54:00:12:34:56", "52-54-00-12-34-56", "52:54:00:12:34", "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00",
            "01:00:5e:00:00:01", "192.0.2.10", "0.0.0.0", "::", "::/0", "fe80::1%eth0", "10.0.0.0/8", "300.1.2.3",
            "eth0", "01-52-54-00-12-34-56", "boot_mode:bios,cpu_vt:true", "a:b:c", ",,,:", "{data[inventory]}",
            "{", "}", "{0}", "{data}", "$.*", "..", "[*]", "\u{0}", "é", "🦀", "\u{202e}", "0x8086", "pci-0000:18:00.0",
            "GPU", "10de", "1eb8", "true", "False", "yes", "uefi", "bios", "inspection:x", "api",
        ]).prop_map(str::to_owned),
        1 => "[0-9a-f:\\-.]{0,20}",
        1 => prop::sample::select(KEYS.to_vec()).prop_map(str::to_owned),
    ]
    .boxed()
}

/// Numbers at and beyond the edges: huge, negative, fractional, zero.
pub fn number() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        prop::sample::select(vec![
            Value::from(0),
            Value::from(-1),
            Value::from(1),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::from(1e308),
            Value::from(-1e308),
            Value::from(0.5),
            Value::from(4_294_967_296u64),
            Value::from(1u64 << 53),
        ]),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![3 => prop::sample::select(KEYS.to_vec()).prop_map(str::to_owned), 1 => text()].boxed()
}

/// Any JSON document: at most `depth` levels of arrays and objects, about `size` values.
pub fn json_with(depth: u32, size: u32) -> BoxedStrategy<Value> {
    let leaf =
        prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::Bool), number(), text().prop_map(Value::String),];
    leaf.prop_recursive(depth, size, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// Any JSON document of moderate size.
pub fn json() -> BoxedStrategy<Value> {
    json_with(4, 64)
}

/// Any JSON object of moderate size (what the APIs are meant to receive).
pub fn json_object() -> BoxedStrategy<Value> {
    prop::collection::btree_map(key(), json_with(3, 32), 0..8)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
        .boxed()
}

/// One change of a document at one place.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Remove the key (or array item) there.
    Drop(Index),
    /// Replace the value there.
    Replace(Index, Value),
    /// Replace an object or array there with its empty self, a string or a number.
    Flatten(Index, Value),
    /// Wrap the value there in an array (a list where one value was expected).
    Wrap(Index),
}

pub fn mutation() -> BoxedStrategy<Mutation> {
    let scalar = prop_oneof![
        Just(Value::Null),
        Just(Value::Array(vec![])),
        Just(Value::Object(Map::new())),
        number(),
        text().prop_map(Value::String),
        any::<bool>().prop_map(Value::Bool),
    ];
    prop_oneof![
        3 => any::<Index>().prop_map(Mutation::Drop),
        3 => (any::<Index>(), json_with(2, 12)).prop_map(|(i, v)| Mutation::Replace(i, v)),
        3 => (any::<Index>(), scalar).prop_map(|(i, v)| Mutation::Flatten(i, v)),
        1 => any::<Index>().prop_map(Mutation::Wrap),
    ]
    .boxed()
}

/// JSON pointers of every value in `v` except the root.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        _ => {}
    }
}

/// Applies `m` to `doc` (no-op on a document without inner values).
pub fn mutate(doc: &mut Value, m: &Mutation) {
    let mut all = Vec::new();
    pointers(doc, String::new(), &mut all);
    if all.is_empty() {
        return;
    }
    let pick = |i: &Index| all[i.index(all.len())].clone();
    match m {
        Mutation::Drop(i) => {
            let p = pick(i);
            let (parent, last) = p.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            match doc.pointer_mut(parent) {
                Some(Value::Object(o)) => {
                    o.remove(&last);
                }
                Some(Value::Array(a)) => {
                    if let Ok(n) = last.parse::<usize>() {
                        if n < a.len() {
                            a.remove(n);
                        }
                    }
                }
                _ => {}
            }
        }
        Mutation::Replace(i, v) | Mutation::Flatten(i, v) => {
            if let Some(slot) = doc.pointer_mut(&pick(i)) {
                *slot = v.clone();
            }
        }
        Mutation::Wrap(i) => {
            if let Some(slot) = doc.pointer_mut(&pick(i)) {
                *slot = Value::Array(vec![slot.take()]);
            }
        }
    }
}

/// A real fixture with a few mutations.
pub fn mutated_fixture() -> BoxedStrategy<Value> {
    let all = fixtures();
    (prop::sample::select(all), prop::collection::vec(mutation(), 0..6))
        .prop_map(|(mut doc, ms)| {
            for m in &ms {
                mutate(&mut doc, m);
            }
            doc
        })
        .boxed()
}

/// Ramdisk data as hostile as it gets: arbitrary documents, and the real ones damaged.
pub fn ramdisk_data() -> BoxedStrategy<Value> {
    prop_oneof![1 => json(), 1 => json_object(), 3 => mutated_fixture()].boxed()
}
