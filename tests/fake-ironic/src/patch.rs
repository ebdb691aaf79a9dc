//! JSON Patch (RFC 6902) `add`, `replace` and `remove`, which is what Ironic clients send in `PATCH` bodies.

use serde_json::Value;

/// One patch operation, as parsed from a `PATCH` body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PatchOp {
    pub(crate) op: Op,
    pub(crate) path: String,
    pub(crate) value: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    Replace,
    Remove,
}

/// Parses a `PATCH` body: a JSON list of `{"op", "path", "value"}` objects.
pub(crate) fn parse(body: &Value) -> Result<Vec<PatchOp>, String> {
    let list = body.as_array().ok_or("a JSON patch must be a list of operations")?;
    list.iter()
        .map(|item| {
            let op = match item.get("op").and_then(Value::as_str) {
                Some("add") => Op::Add,
                Some("replace") => Op::Replace,
                Some("remove") => Op::Remove,
                Some(other) => return Err(format!("unsupported patch operation '{other}'")),
                None => return Err(format!("patch operation without 'op': {item}")),
            };
            let path =
                item.get("path").and_then(Value::as_str).ok_or(format!("patch operation without 'path': {item}"))?;
            let value = item.get("value").cloned();
            if op != Op::Remove && value.is_none() {
                return Err(format!("'add' and 'replace' operations need a value: {item}"));
            }
            Ok(PatchOp { op, path: path.to_owned(), value })
        })
        .collect()
}

/// The reference tokens of a JSON pointer (`/a/b~1c` → `["a", "b/c"]`); the whole document (`""`) is refused.
pub(crate) fn pointer(path: &str) -> Result<Vec<String>, String> {
    let rest = path.strip_prefix('/').ok_or_else(|| format!("invalid path '{path}': it must start with '/'"))?;
    Ok(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

/// Applies one operation to `doc`.
pub(crate) fn apply(doc: &mut Value, op: &PatchOp) -> Result<(), String> {
    let tokens = pointer(&op.path)?;
    let (last, parents) = tokens.split_last().ok_or_else(|| format!("invalid path '{}'", op.path))?;
    let mut target = doc;
    for token in parents {
        target = match target {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| format!("can't resolve '{}': member '{token}' not found", op.path))?;
    }
    let missing = || format!("can't {} '{}': member '{last}' not found", op_name(op.op), op.path);
    match target {
        Value::Object(map) => match op.op {
            Op::Add => {
                map.insert(last.clone(), op.value.clone().unwrap_or(Value::Null));
            }
            Op::Replace => {
                let slot = map.get_mut(last).ok_or_else(missing)?;
                *slot = op.value.clone().unwrap_or(Value::Null);
            }
            Op::Remove => {
                map.remove(last).ok_or_else(missing)?;
            }
        },
        Value::Array(items) => {
            let value = op.value.clone().unwrap_or(Value::Null);
            if op.op == Op::Add && last == "-" {
                items.push(value);
                return Ok(());
            }
            let index = last.parse::<usize>().map_err(|_| format!("invalid array index '{last}' in '{}'", op.path))?;
            match op.op {
                Op::Add if index <= items.len() => items.insert(index, value),
                Op::Replace if index < items.len() => items[index] = value,
                Op::Remove if index < items.len() => {
                    items.remove(index);
                }
                _ => return Err(format!("array index {index} out of range in '{}'", op.path)),
            }
        }
        _ => return Err(format!("can't {} '{}': not inside an object or a list", op_name(op.op), op.path)),
    }
    Ok(())
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Add => "add",
        Op::Replace => "replace",
        Op::Remove => "remove",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(doc: &mut Value, patch: Value) -> Result<(), String> {
        for op in parse(&patch)? {
            apply(doc, &op)?;
        }
        Ok(())
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
                {"op": "add", "path": "/extra/a~1b", "value": 1},
                {"op": "remove", "path": "/extra/foo"},
            ]),
        )
        .unwrap();
        assert_eq!(doc, json!({"extra": {"a/b": 1}, "properties": {"cpus": 8}, "list": [1, 2, 3, 4]}));
    }

    #[test]
    fn errors() {
        let mut doc = json!({"extra": {}});
        assert!(run(&mut doc, json!([{"op": "replace", "path": "/extra/nope", "value": 1}])).is_err());
        assert!(run(&mut doc, json!([{"op": "remove", "path": "/extra/nope"}])).is_err());
        assert!(run(&mut doc, json!([{"op": "add", "path": "/extra/a/b", "value": 1}])).is_err());
        assert!(run(&mut doc, json!([{"op": "add", "path": "extra", "value": 1}])).is_err());
        assert!(run(&mut doc, json!([{"op": "move", "path": "/extra", "from": "/x"}])).is_err());
        assert!(run(&mut doc, json!([{"op": "add", "path": "/extra/x"}])).is_err());
        assert!(run(&mut doc, json!({"op": "add"})).is_err());
    }
}
