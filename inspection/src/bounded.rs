//! The ramdisk's data parsed within bounds: anyone on the PXE network may post it, so its cost in memory must not
//! follow what the poster chooses. [`parse_callback`] builds the JSON value in one pass over the body, counting
//! every value and the nesting depth, and stops at the first one over its bound; the top-level `logs` (a base64
//! tarball, megabytes, never stored nor read by processing) is skipped without being copied.
//!
//! The memory of a parsed body is then at most the body's own bytes (strings) plus about 100 bytes per value:
//! with the defaults, 100 000 values (a large real inventory has about 15 000) cost about 10 MiB.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// What a callback body may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// JSON values (objects, arrays, strings, numbers, booleans, nulls, and object keys), all levels together.
    pub max_values: usize,
    /// Nesting of objects and arrays.
    pub max_depth: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self { max_values: 100_000, max_depth: 32 }
    }
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("introspection data is not JSON: {0}")]
    NotJson(String),
    #[error("introspection data holds more than {0} JSON values")]
    TooManyValues(usize),
    #[error("introspection data is nested deeper than {0} levels")]
    TooDeep(usize),
    #[error("introspection data is not a JSON object")]
    NotObject,
}

/// The ramdisk's data, a JSON object, without its top-level `logs`, or why not.
pub fn parse_callback(body: &[u8], bounds: Bounds) -> Result<Value, BoundsError> {
    let state = State { values: Cell::new(0), over: Cell::new(None), bounds };
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = Node { state: &state, depth: 0 }.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match (parsed, state.over.take()) {
        (_, Some(over)) => Err(over),
        (Ok(v @ Value::Object(_)), None) => Ok(v),
        (Ok(_), None) => Err(BoundsError::NotObject),
        (Err(e), None) => Err(BoundsError::NotJson(e.to_string())),
    }
}

struct State {
    values: Cell<usize>,
    over: Cell<Option<BoundsError>>,
    bounds: Bounds,
}

impl State {
    fn count<E: de::Error>(&self) -> Result<(), E> {
        let n = self.values.get() + 1;
        self.values.set(n);
        if n > self.bounds.max_values {
            return Err(self.refuse(BoundsError::TooManyValues(self.bounds.max_values)));
        }
        Ok(())
    }

    fn refuse<E: de::Error>(&self, e: BoundsError) -> E {
        let message = e.to_string();
        self.over.set(Some(e));
        E::custom(message)
    }
}

/// One value at `depth` (0: the body itself).
struct Node<'a> {
    state: &'a State,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.state.count()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.state.count()?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.state.count()?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.state.count()?;
        Ok(Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.state.count()?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.state.count()?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.state.count()?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.state.count()?;
        if self.depth >= self.state.bounds.max_depth {
            return Err(self.state.refuse(BoundsError::TooDeep(self.state.bounds.max_depth)));
        }
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Node { state: self.state, depth: self.depth + 1 })? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.state.count()?;
        if self.depth >= self.state.bounds.max_depth {
            return Err(self.state.refuse(BoundsError::TooDeep(self.state.bounds.max_depth)));
        }
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.depth == 0 && key == "logs" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            self.state.count()?;
            let v = map.next_value_seed(Node { state: self.state, depth: self.depth + 1 })?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(s: &str, max_values: usize, max_depth: usize) -> Result<Value, BoundsError> {
        parse_callback(s.as_bytes(), Bounds { max_values, max_depth })
    }

    #[test]
    fn parses_as_serde_json_does_without_the_logs() {
        let body = json!({
            "inventory": {"interfaces": [{"name": "eth0", "mac_address": "52:54:00:aa:00:01"}], "cpu": {"count": 4}},
            "n": -1, "u": 18_446_744_073_709_551_615u64, "f": 1.5, "t": true, "z": null,
            "logs": "H4sIAAAAAAAAA+3OMQ6CQBCF4a09xV7A7Mwus1wB/",
            "nested": {"logs": "kept below the top level"},
        });
        let v = parse(&body.to_string(), 1000, 32).unwrap();
        let mut want = body.clone();
        want.as_object_mut().unwrap().remove("logs");
        assert_eq!(v, want);
    }

    #[test]
    fn values_are_counted_at_every_level_and_keys_too() {
        // {"a": [1, 2]}: the object, the key, the array, two numbers = 5
        assert!(parse(r#"{"a": [1, 2]}"#, 5, 32).is_ok());
        assert_eq!(parse(r#"{"a": [1, 2]}"#, 4, 32), Err(BoundsError::TooManyValues(4)));
        // the skipped logs count for nothing
        assert!(parse(r#"{"logs": [1, 2, 3, 4, 5, 6], "a": 1}"#, 3, 32).is_ok());
        // a long list of interfaces stops at the bound, whatever follows
        let many =
            format!(r#"{{"inventory": {{"interfaces": [{}]}}}}"#, vec![r#"{"mac_address": "x"}"#; 10_000].join(","));
        assert_eq!(parse(&many, 1000, 32), Err(BoundsError::TooManyValues(1000)));
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| format!("{{\"a\": {}1{}}}", "[".repeat(n), "]".repeat(n));
        assert!(parse(&deep(31), 1000, 32).is_ok());
        assert_eq!(parse(&deep(32), 1000, 32), Err(BoundsError::TooDeep(32)));
        // deeper than serde_json's own limit: still our error, not a stack overflow
        assert_eq!(parse(&deep(100_000), 1_000_000, 32), Err(BoundsError::TooDeep(32)));
    }

    #[test]
    fn junk_and_other_shapes_are_refused() {
        assert!(matches!(parse("", 10, 4), Err(BoundsError::NotJson(_))));
        assert!(matches!(parse("{\"a\": 1} trailing", 10, 4), Err(BoundsError::NotJson(_))));
        assert!(matches!(parse("{\"a\": \"\\ud800\"}", 10, 4), Err(BoundsError::NotJson(_))));
        assert_eq!(parse("[1, 2]", 10, 4), Err(BoundsError::NotObject));
        assert_eq!(parse("\"inventory\"", 10, 4), Err(BoundsError::NotObject));
        // duplicate keys: the last one wins, as serde_json's own Value
        assert_eq!(parse(r#"{"a": 1, "a": 2}"#, 10, 4).unwrap(), json!({"a": 2}));
    }
}
