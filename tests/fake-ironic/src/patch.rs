//! JSON Patch bodies of `PATCH /v1/nodes/{ident}` and `PATCH /v1/ports/{uuid}`, handled as Ironic handles them:
//! the body checked against Ironic's patch schema (`add`, `replace` or `remove`, paths of word characters and
//! dashes), helpers that look at the operations the way Ironic's API does (`get_patch_values`, ...), and each
//! operation applied with python-jsonpatch's semantics and reasons, wrapped in Ironic's `PatchError`.

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::pyfmt::repr;
use crate::schema::Schema;

/// One patch operation, as parsed from a `PATCH` body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PatchOp {
    pub(crate) op: Op,
    pub(crate) path: String,
    /// `None` when the operation has no `value` member (valid for the schema, an error when applied).
    pub(crate) value: Option<Value>,
    /// The operation as sent, which Ironic's messages quote.
    raw: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    Replace,
    Remove,
}

/// `\w` of a Python `str` pattern, enough for a path: letters, digits (of any script) and `_`.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Ironic's `^(/[\w-]+)+$`.
fn is_patch_path(s: &str) -> bool {
    s.strip_prefix('/')
        .is_some_and(|rest| rest.split('/').all(|seg| !seg.is_empty() && seg.chars().all(|c| is_word(c) || c == '-')))
}

/// Ironic's `args.patch` schema.
fn patch_schema() -> Schema {
    Schema::of_type(&["array"]).items(
        Schema::of_type(&["object"])
            .properties(vec![
                ("path", Schema::of_type(&["string"]).pattern("^(/[\\w-]+)+$", is_patch_path)),
                ("op", Schema::of_type(&["string"]).enumeration(vec![json!("add"), json!("replace"), json!("remove")])),
                ("value", Schema::new()),
            ])
            .no_additional_properties()
            .required(&["op", "path"]),
    )
}

/// Parses a `PATCH` body; a body that does not fit Ironic's schema is its 400 ("Schema error for patch: ...").
pub(crate) fn parse(body: &Value) -> Result<Vec<PatchOp>, ApiError> {
    patch_schema().check("patch", body).map_err(ApiError::bad_request)?;
    let items = body.as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(items
        .iter()
        .map(|item| {
            let op = match item.get("op").and_then(Value::as_str) {
                Some("add") => Op::Add,
                Some("replace") => Op::Replace,
                _ => Op::Remove,
            };
            let path = item.get("path").and_then(Value::as_str).unwrap_or_default().to_owned();
            PatchOp { op, path, value: item.get("value").cloned(), raw: item.clone() }
        })
        .collect())
}

/// The top-level field an operation touches (`extra` for `/extra/foo`).
pub(crate) fn root(op: &PatchOp) -> &str {
    op.path.split('/').nth(1).unwrap_or_default()
}

/// Ironic's `patch_validate_allowed_fields`: a 400 naming the first operation on a field not in `allowed`.
pub(crate) fn check_allowed(ops: &[PatchOp], allowed: &[&str]) -> Result<(), ApiError> {
    match ops.iter().find(|op| !allowed.contains(&root(op))) {
        Some(op) => Err(ApiError::bad_request(format!(
            "Cannot patch {}. Only the following can be updated: {}",
            op.path,
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

/// Ironic's `get_patch_values`: the values of the operations on exactly `path`, except removals (a missing value
/// counts as `null`).
pub(crate) fn values<'a>(ops: &'a [PatchOp], path: &str) -> Vec<&'a Value> {
    ops.iter()
        .filter(|op| op.path == path && op.op != Op::Remove)
        .map(|op| op.value.as_ref().unwrap_or(&Value::Null))
        .collect()
}

/// Ironic's `is_path_removed`: whether an operation removes `path` or something under it.
pub(crate) fn is_removed(ops: &[PatchOp], path: &str) -> bool {
    ops.iter().any(|op| op.op == Op::Remove && (op.path == path || op.path.starts_with(&format!("{path}/"))))
}

/// Ironic's `is_path_updated`, which looks at the first operation only (a quirk the fake keeps).
pub(crate) fn first_touches(ops: &[PatchOp], path: &str) -> bool {
    ops.first().is_some_and(|op| op.path == path || op.path.starts_with(&format!("{path}/")))
}

/// Ironic's `apply_jsonpatch`: refuses an `add` of a new top-level field, then applies the operations one by one;
/// a failing one is Ironic's `PatchError` 400 with python-jsonpatch's reason.
pub(crate) fn apply_all(doc: &mut Map<String, Value>, ops: &[PatchOp]) -> Result<(), ApiError> {
    for op in ops {
        if op.op == Op::Add && op.path.matches('/').count() == 1 && !doc.contains_key(op.path.trim_start_matches('/')) {
            return Err(ApiError::bad_request(format!(
                "Adding a new attribute ({}) to the root of the resource is not allowed",
                op.path
            )));
        }
    }
    let mut value = Value::Object(std::mem::take(doc));
    let mut result = Ok(());
    for op in ops {
        if let Err(reason) = apply(&mut value, op) {
            result = Err(ApiError::bad_request(format!("Couldn't apply patch '{}'. Reason: {reason}", repr(&op.raw))));
            break;
        }
    }
    if let Value::Object(map) = value {
        *doc = map;
    }
    result
}

/// A reference token as jsonpointer's `get_part` reads it for a container.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Key(String),
    Index(usize),
    /// `-`: past the end of a list.
    End,
}

fn python_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<class 'NoneType'>",
        Value::Bool(_) => "<class 'bool'>",
        Value::Number(n) if n.is_f64() => "<class 'float'>",
        Value::Number(_) => "<class 'int'>",
        Value::String(_) => "<class 'str'>",
        Value::Array(_) => "<class 'list'>",
        Value::Object(_) => "<class 'dict'>",
    }
}

/// jsonpointer's `get_part`: how `part` addresses `doc` (strings are sequences too, as in Python).
fn get_part(doc: &Value, part: &str) -> Result<Part, String> {
    match doc {
        Value::Object(_) => Ok(Part::Key(part.to_owned())),
        Value::Array(_) | Value::String(_) => {
            if part == "-" {
                return Ok(Part::End);
            }
            let is_index = part == "0"
                || (part.starts_with(|c: char| matches!(c, '1'..='9')) && part.chars().all(|c| c.is_ascii_digit()));
            part.parse::<usize>()
                .ok()
                .filter(|_| is_index)
                .map(Part::Index)
                .ok_or_else(|| format!("'{part}' is not a valid sequence index"))
        }
        other => Err(format!(
            "Document '{}' does not support indexing, must be mapping/sequence or support __getitem__",
            python_type(other)
        )),
    }
}

/// jsonpointer's `walk`: one step down, by value (a character of a string is a one-character string).
fn walk(doc: &Value, part: &str) -> Result<Value, String> {
    match (doc, get_part(doc, part)?) {
        (Value::Object(map), Part::Key(k)) => {
            map.get(&k).cloned().ok_or_else(|| format!("member '{k}' not found in {}", repr(doc)))
        }
        (Value::Array(items), Part::Index(i)) => {
            items.get(i).cloned().ok_or_else(|| format!("index '{i}' is out of bounds"))
        }
        (Value::String(s), Part::Index(i)) => s
            .chars()
            .nth(i)
            .map(|c| Value::String(c.to_string()))
            .ok_or_else(|| format!("index '{i}' is out of bounds")),
        // Past the end of a list: an `EndOfList`, which nothing can index.
        _ => Err("Document '<class 'jsonpointer.EndOfList'>' does not support indexing, must be \
                  mapping/sequence or support __getitem__"
            .to_owned()),
    }
}

/// Applies one operation to `doc` as python-jsonpatch does, or says why not in its words.
fn apply(doc: &mut Value, op: &PatchOp) -> Result<(), String> {
    let parts: Vec<&str> = op.path.split('/').skip(1).collect();
    let Some((last, parents)) = parts.split_last() else { return Err("Location must start with /".to_owned()) };
    if op.op != Op::Remove && op.value.is_none() {
        return Err("The operation does not contain a 'value' member".to_owned());
    }
    // Resolve the parent by value first: every error is found before anything changes.
    let mut parent = doc.clone();
    for part in parents {
        parent = walk(&parent, part)?;
    }
    let part = get_part(&parent, last)?;
    let unresolved = || format!("unable to fully resolve json pointer {}, part {last}", op.path);
    match op.op {
        Op::Add => match (&parent, &part) {
            (Value::Array(items), Part::Index(i)) if *i > items.len() => {
                return Err("can't insert outside of list".to_owned());
            }
            (Value::Array(_), _) | (Value::Object(_), _) => {}
            _ => return Err(unresolved()),
        },
        Op::Replace => match (&parent, &part) {
            (_, Part::End) => return Err("'path' with '-' can't be applied to 'replace' operation".to_owned()),
            (Value::Object(_), Part::Key(k)) if k == "-" => {
                return Err("'path' with '-' can't be applied to 'replace' operation".to_owned());
            }
            (Value::Array(items), Part::Index(i)) if *i >= items.len() => {
                return Err("can't replace outside of list".to_owned());
            }
            (Value::Object(map), Part::Key(k)) if !map.contains_key(k) => {
                return Err(format!("can't replace a non-existent object '{k}'"));
            }
            (Value::Array(_), _) | (Value::Object(_), _) => {}
            _ => return Err(unresolved()),
        },
        Op::Remove => match (&parent, &part) {
            (Value::Array(_) | Value::String(_), Part::End) => return Err("invalid array index '-'".to_owned()),
            (Value::Array(items), Part::Index(i)) if *i >= items.len() => {
                return Err(format!("can't remove a non-existent object '{i}'"));
            }
            (Value::Object(map), Part::Key(k)) if !map.contains_key(k) => {
                return Err(format!("can't remove a non-existent object '{k}'"));
            }
            (Value::Array(_), _) | (Value::Object(_), _) => {}
            _ => return Err(unresolved()),
        },
    }
    // Now change it in place: every parent is an object or a list, and the operation fits.
    let mut target = doc;
    for part in parents {
        target = match target {
            Value::Object(map) => map.get_mut(*part),
            Value::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        }
        .ok_or_else(unresolved)?;
    }
    let value = op.value.clone().unwrap_or(Value::Null);
    match (target, part) {
        (Value::Object(map), Part::Key(k)) => {
            if op.op == Op::Remove {
                map.remove(&k);
            } else {
                map.insert(k, value);
            }
        }
        (Value::Array(items), Part::End) => items.push(value),
        (Value::Array(items), Part::Index(i)) => match op.op {
            Op::Add => items.insert(i, value),
            Op::Replace => items[i] = value,
            Op::Remove => {
                items.remove(i);
            }
        },
        _ => return Err(unresolved()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(doc: &mut Value, patch: Value) -> Result<(), String> {
        let ops = parse(&patch).map_err(|e| e.faultstring)?;
        let Value::Object(map) = doc else { unreachable!() };
        apply_all(map, &ops).map_err(|e| e.faultstring)
    }

    #[test]
    fn add_replace_remove_nested() {
        let mut doc = json!({"extra": {}, "properties": {"cpus": 2}, "list": [1, 3]});
        run(
            &mut doc,
            json!([
                {"op": "add", "path": "/extra/foo", "value": "bar"},
                {"op": "replace", "path": "/properties/cpus", "value": 8},
                {"op": "add", "path": "/list/1", "value": 2},
                {"op": "add", "path": "/list/-", "value": 4},
                {"op": "add", "path": "/extra/client-id", "value": 1},
                {"op": "remove", "path": "/extra/foo"},
                {"op": "remove", "path": "/list/0"},
            ]),
        )
        .unwrap();
        assert_eq!(doc, json!({"extra": {"client-id": 1}, "properties": {"cpus": 8}, "list": [2, 3, 4]}));
    }

    // The expected reasons are python-jsonpatch's for the same document and operation.
    #[test]
    fn errors_in_ironic_words() {
        let mut doc = json!({"extra": {"s": "text", "n": null}, "list": [1]});
        let cases = [
            (
                json!([{"op": "replace", "path": "/extra/nope", "value": 1}]),
                "Couldn't apply patch '{'op': 'replace', 'path': '/extra/nope', 'value': 1}'. Reason: can't replace a \
                 non-existent object 'nope'",
            ),
            (
                json!([{"op": "remove", "path": "/extra/nope"}]),
                "Couldn't apply patch '{'op': 'remove', 'path': '/extra/nope'}'. Reason: can't remove a non-existent \
                 object 'nope'",
            ),
            (
                json!([{"op": "add", "path": "/extra/a/b", "value": 1}]),
                "Couldn't apply patch '{'op': 'add', 'path': '/extra/a/b', 'value': 1}'. Reason: member 'a' not found \
                 in {'n': None, 's': 'text'}",
            ),
            (
                json!([{"op": "add", "path": "/extra/n/x", "value": 1}]),
                "Couldn't apply patch '{'op': 'add', 'path': '/extra/n/x', 'value': 1}'. Reason: Document '<class \
                 'NoneType'>' does not support indexing, must be mapping/sequence or support __getitem__",
            ),
            (
                json!([{"op": "add", "path": "/extra/s/x", "value": 1}]),
                "Couldn't apply patch '{'op': 'add', 'path': '/extra/s/x', 'value': 1}'. Reason: 'x' is not a valid \
                 sequence index",
            ),
            (
                json!([{"op": "add", "path": "/list/5", "value": 1}]),
                "Couldn't apply patch '{'op': 'add', 'path': '/list/5', 'value': 1}'. Reason: can't insert outside of \
                 list",
            ),
            (
                json!([{"op": "add", "path": "/extra/x"}]),
                "Couldn't apply patch '{'op': 'add', 'path': '/extra/x'}'. Reason: The operation does not contain a \
                 'value' member",
            ),
            (
                json!([{"op": "add", "path": "/brand_new", "value": 1}]),
                "Adding a new attribute (/brand_new) to the root of the resource is not allowed",
            ),
            (
                json!([{"op": "move", "path": "/extra", "from": "/x"}]),
                "Schema error for patch: Additional properties are not allowed ('from' was unexpected)",
            ),
            (
                json!([{"op": "add", "path": "extra", "value": 1}]),
                "Schema error for patch: 'extra' does not match '^(/[\\\\w-]+)+$'",
            ),
            (
                json!([{"op": "add", "path": "/extra/a~1b", "value": 1}]),
                "Schema error for patch: '/extra/a~1b' does not match '^(/[\\\\w-]+)+$'",
            ),
            (json!({"op": "add"}), "Schema error for patch: {'op': 'add'} is not of type 'array'"),
        ];
        for (patch, want) in cases {
            assert_eq!(run(&mut doc, patch.clone()).unwrap_err(), want, "{patch}");
        }
        assert_eq!(doc, json!({"extra": {"s": "text", "n": null}, "list": [1]}), "failed patches change nothing");
    }

    #[test]
    fn ironic_helpers() {
        let ops = parse(&json!([
            {"op": "add", "path": "/driver", "value": "redfish"},
            {"op": "remove", "path": "/local_link_connection/port_id"},
            {"op": "add", "path": "/name"},
        ]))
        .unwrap();
        assert_eq!(values(&ops, "/driver"), [&json!("redfish")]);
        assert_eq!(values(&ops, "/name"), [&Value::Null]);
        assert!(values(&ops, "/local_link_connection").is_empty());
        assert!(is_removed(&ops, "/local_link_connection"));
        assert!(first_touches(&ops, "/driver") && !first_touches(&ops, "/name"));
        assert_eq!(
            check_allowed(&ops, &["driver", "name"]).unwrap_err().faultstring,
            "Cannot patch /local_link_connection/port_id. Only the following can be updated: driver, name"
        );
    }
}
