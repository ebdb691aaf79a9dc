//! `extra_hardware` / `extra-hardware`: turns IPA's `extra-hardware` collector data (`data`, a list of
//! `[a, b, c, d]`) into `extra[a][b][c] = d` (d as an integer where Python's `int()` accepts it) and drops
//! `data`. No Ironic write.
use serde_json::{Map, Value};

use super::Hook;
use crate::processing::data::{object_mut, python_int, truthy};
use crate::processing::plan::{NodeView, Plan};

/// Converts eDeploy-format `data` into `extra`.
#[derive(Debug)]
pub(crate) struct ExtraHardware {
    /// Refuse records that are not exactly 4 long, and drop unrecognised `data`.
    pub(crate) strict: bool,
}

/// A JSON key for a record field, as Python's dict key would serialise; lists and dicts cannot be keys.
fn key(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some("null".to_owned()),
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// Adds one `[a, b, c, d]` record, creating the levels it reaches before a malformed part, as Python does.
fn add_record(extra: &mut Map<String, Value>, item: &[Value]) {
    let Some(k0) = item.first().and_then(key) else { return };
    let level0 = extra.entry(k0).or_insert_with(|| Value::Object(Map::new()));
    let Some(level0) = level0.as_object_mut() else { return };
    let Some(k1) = item.get(1).and_then(key) else { return };
    let level1 = level0.entry(k1).or_insert_with(|| Value::Object(Map::new()));
    let Some(level1) = level1.as_object_mut() else { return };
    let (Some(k2), Some(value)) = (item.get(2).and_then(key), item.get(3)) else { return };
    let value = python_int(value).map_or_else(|| value.clone(), Value::from);
    level1.insert(k2, value);
}

impl Hook for ExtraHardware {
    fn before_update(&self, data: &mut Value, _node: &NodeView, _plan: &mut Plan) -> Result<(), String> {
        let object = object_mut(data)?;
        let Some(records) = object.get("data") else {
            return Ok(());
        };
        let recognised = records.as_array().is_some_and(|items| {
            items.iter().all(|item| item.as_array().is_some_and(|fields| !self.strict || fields.len() == 4))
        });
        if !recognised {
            if self.strict {
                object.remove("data");
            }
            return Ok(());
        }
        let mut extra = Map::new();
        for item in records.as_array().into_iter().flatten() {
            if let Some(fields) = item.as_array().filter(|_| truthy(item)) {
                add_record(&mut extra, fields);
            }
        }
        object.insert("extra".to_owned(), Value::Object(extra));
        object.remove("data");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processing::testdata;
    use serde_json::json;

    fn run(strict: bool, data: &mut Value) {
        let mut plan = Plan::new();
        ExtraHardware { strict }.before_update(data, &testdata::node(), &mut plan).expect("extra_hardware");
        assert!(plan.is_empty());
    }

    #[test]
    fn converts_edeploy_records() {
        let mut data = testdata::pci_and_extra_hardware();
        run(false, &mut data);
        assert!(data.get("data").is_none());
        assert_eq!(data["extra"]["cpu"]["logical"]["number"], json!(8));
        assert_eq!(data["extra"]["cpu"]["physical_0"]["vendor"], json!("GenuineIntel"));
        assert_eq!(data["extra"]["memory"]["total"]["size"], json!(8_589_934_592u64));
        assert_eq!(data["extra"]["disk"]["sda"]["size"], json!(21));
        assert_eq!(
            data["extra"]["system"]["product"]["name"],
            json!("PowerEdge R640 (SKU=NotProvided;ModelName=PowerEdge R640)")
        );
        assert_eq!(data["extra"]["network"]["eth0"]["serial"], json!("52:54:00:12:34:56"));
    }

    #[test]
    fn short_records_create_levels_and_are_skipped() {
        let mut data =
            json!({"data": [[], ["a"], ["b", "c"], ["d", "e", "f"], ["g", "h", "i", "1_0"], [["x"], "y", "z", 1]]});
        run(false, &mut data);
        assert_eq!(data["extra"], json!({"a": {}, "b": {"c": {}}, "d": {"e": {}}, "g": {"h": {"i": 10}}}));
    }

    #[test]
    fn unrecognised_data_stays_unless_strict() {
        let mut data = json!({"data": {"not": "a list"}});
        run(false, &mut data);
        assert_eq!(data, json!({"data": {"not": "a list"}}));
        run(true, &mut data);
        assert_eq!(data, json!({}));

        let mut data = json!({"data": [["a", "b", "c"]]});
        run(true, &mut data);
        assert_eq!(data, json!({}), "strict refuses records that are not 4 long");
    }

    #[test]
    fn no_data_no_change() {
        let mut data = testdata::two_nics_two_disks();
        let before = data.clone();
        run(true, &mut data);
        assert_eq!(data, before);
    }
}
