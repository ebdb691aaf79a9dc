//! How Python prints JSON values: Ironic's error messages embed `repr()` and `str()` of request values (`'x' is
//! not of type 'object'`, `Couldn't apply patch '{'op': 'add', ...}'`), so the fake formats them the same way.
//!
//! One difference cannot be helped: Python keeps an object's keys in the order the client sent them, the fake
//! (`serde_json` without `preserve_order`) in sorted order.

use serde_json::Value;

/// Python's `repr()` of a decoded JSON value: `None`, `True`, `'text'`, `[1, 2]`, `{'a': 1}`.
pub(crate) fn repr(value: &Value) -> String {
    match value {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Number(n) => number(n),
        Value::String(s) => repr_str(s),
        Value::Array(items) => format!("[{}]", items.iter().map(repr).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter().map(|(k, v)| format!("{}: {}", repr_str(k), repr(v))).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Python's `str()`: a string as is, anything else as [`repr`].
pub(crate) fn str_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => repr(other),
    }
}

/// Python's `repr()` of a string: single quotes unless the text has a single quote and no double one.
pub(crate) fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn number(n: &serde_json::Number) -> String {
    if n.is_f64() {
        let f = n.as_f64().unwrap_or_default();
        // Python writes 1.0, not 1.
        if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 { format!("{f:.1}") } else { f.to_string() }
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reprs_like_python() {
        assert_eq!(repr(&json!(null)), "None");
        assert_eq!(repr(&json!([true, false, 1, 1.5, 2.0])), "[True, False, 1, 1.5, 2.0]");
        assert_eq!(repr(&json!("a'b")), "\"a'b\"");
        assert_eq!(repr(&json!("a'b\"c")), "'a\\'b\"c'");
        assert_eq!(repr(&json!("x\\y\n")), "'x\\\\y\\n'");
        assert_eq!(
            repr(&json!({"op": "add", "path": "/x", "value": {"a": [1]}})),
            "{'op': 'add', 'path': '/x', 'value': {'a': [1]}}"
        );
        assert_eq!(str_of(&json!("plain")), "plain");
        assert_eq!(str_of(&json!(null)), "None");
    }
}
