//! ironic-inspector's default parameter check for operators and actions (`WithValidation.validate`).

use serde_json::{Map, Value};

/// Every name in `required` must be present and not null; no name outside `required` and `optional` may be
/// present unless it is null. The error is ironic-inspector's message.
pub(super) fn check(params: &Map<String, Value>, required: &[&str], optional: &[&str]) -> Result<(), String> {
    let passed = |name: &str| params.get(name).is_some_and(|v| !v.is_null());
    let missing: Vec<&str> = required.iter().copied().filter(|name| !passed(name)).collect();
    let unexpected: Vec<&str> = params
        .iter()
        .filter(|(name, value)| {
            !value.is_null() && !required.contains(&name.as_str()) && !optional.contains(&name.as_str())
        })
        .map(|(name, _)| name.as_str())
        .collect();
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("missing required parameter(s): {}", missing.join(", ")));
    }
    if !unexpected.is_empty() {
        problems.push(format!("unexpected parameter(s): {}", unexpected.join(", ")));
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn missing_and_unexpected_are_both_reported() {
        let params = json!({"b": 1, "c": null, "d": 2}).as_object().cloned().unwrap();
        assert_eq!(
            check(&params, &["a", "c"], &["b"]),
            Err("missing required parameter(s): a, c; unexpected parameter(s): d".to_owned())
        );
        assert_eq!(check(&params, &["b", "d"], &[]), Ok(()));
    }
}
