//! `ironguardctl rules import|list|show|delete`: reading a rules file and rendering the answers.
//!
//! A rules file holds one rule (a JSON object) or a list of them, as `openstack baremetal introspection rule import`
//! reads it. It is checked here before anything is sent; the control plane validates each rule itself.

use std::io::Read as _;
use std::path::Path;

use ironguard_proto::v1::Rule;
use serde_json::Value;

use crate::table::Table;

/// Why a rules file cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum RulesFileError {
    #[error("cannot read {origin}: {source}")]
    Read {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin} is not JSON: {source}")]
    NotJson {
        origin: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{origin}: expected a rule (a JSON object) or a list of rules, found {found}")]
    NotRules { origin: String, found: String },
    #[error("{origin} holds no rule")]
    Empty { origin: String },
}

/// The rules of `file` (`-`: standard input), each a JSON object.
pub fn read_rules(file: &Path) -> Result<Vec<Value>, RulesFileError> {
    let (origin, read) = if file == Path::new("-") {
        let mut text = String::new();
        ("standard input".to_string(), std::io::stdin().read_to_string(&mut text).map(|_| text))
    } else {
        (file.display().to_string(), std::fs::read_to_string(file))
    };
    let text = read.map_err(|source| RulesFileError::Read { origin: origin.clone(), source })?;
    parse_rules(&origin, &text)
}

/// `text` as a list of rules; `origin` names where it came from, for the error.
pub fn parse_rules(origin: &str, text: &str) -> Result<Vec<Value>, RulesFileError> {
    let value: Value =
        serde_json::from_str(text).map_err(|source| RulesFileError::NotJson { origin: origin.to_string(), source })?;
    let rules = match value {
        Value::Object(_) => vec![value],
        Value::Array(items) => items,
        other => return Err(RulesFileError::NotRules { origin: origin.to_string(), found: kind(&other).into() }),
    };
    if rules.is_empty() {
        return Err(RulesFileError::Empty { origin: origin.to_string() });
    }
    if let Some((i, bad)) = rules.iter().enumerate().find(|(_, r)| !r.is_object()) {
        return Err(RulesFileError::NotRules {
            origin: origin.to_string(),
            found: format!("{} as item {}", kind(bad), i + 1),
        });
    }
    Ok(rules)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The answers' rules as JSON values.
pub fn parse_all(rules: &[Rule]) -> anyhow::Result<Vec<Value>> {
    rules
        .iter()
        .map(|r| {
            serde_json::from_str(&r.rule_json)
                .map_err(|e| anyhow::anyhow!("the control plane sent a rule that is not JSON: {e}"))
        })
        .collect()
}

/// `<uuid>: created (<description>)`.
pub fn created_line(rule_json: &str) -> String {
    let v: Value = serde_json::from_str(rule_json).unwrap_or(Value::Null);
    let uuid = v["uuid"].as_str().unwrap_or("?");
    match v["description"].as_str().filter(|d| !d.is_empty()) {
        Some(d) => format!("{uuid}: created ({d})"),
        None => format!("{uuid}: created"),
    }
}

/// One line per rule: uuid, description, scope, how many conditions and actions.
pub fn render_table(rules: &[Value]) -> String {
    if rules.is_empty() {
        return "no introspection rules\n".into();
    }
    let mut t = Table::new(&["UUID", "DESCRIPTION", "SCOPE", "CONDITIONS", "ACTIONS"]);
    for r in rules {
        let count = |k: &str| r[k].as_array().map_or(0, Vec::len).to_string();
        t.row(vec![
            r["uuid"].as_str().unwrap_or_default().to_string(),
            r["description"].as_str().unwrap_or("-").to_string(),
            r["scope"].as_str().filter(|s| !s.is_empty()).unwrap_or("-").to_string(),
            count("conditions"),
            count("actions"),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_or_a_list() {
        assert_eq!(parse_rules("f", r#"{"actions": []}"#).unwrap().len(), 1);
        assert_eq!(parse_rules("f", r#"[{"actions": []}, {"actions": []}]"#).unwrap().len(), 2);
    }

    #[test]
    fn what_is_not_rules_is_refused_with_its_origin() {
        let e = parse_rules("rules.json", "[1]").unwrap_err().to_string();
        assert_eq!(e, "rules.json: expected a rule (a JSON object) or a list of rules, found a number as item 1");
        let e = parse_rules("rules.json", "\"x\"").unwrap_err().to_string();
        assert!(e.contains("found a string"), "{e}");
        assert!(parse_rules("rules.json", "[]").unwrap_err().to_string().contains("holds no rule"));
        assert!(parse_rules("rules.json", "{").unwrap_err().to_string().starts_with("rules.json is not JSON"));
    }

    #[test]
    fn table_and_lines() {
        let rules = vec![
            serde_json::json!({"uuid": "u1", "description": "gpu", "scope": null, "conditions": [{}], "actions": [{}, {}]}),
            serde_json::json!({"uuid": "u2", "description": null, "scope": "rack1", "conditions": [], "actions": [{}]}),
        ];
        let out = render_table(&rules);
        assert_eq!(
            out,
            "UUID  DESCRIPTION  SCOPE  CONDITIONS  ACTIONS\nu1    gpu          -      1           2\nu2    -            rack1  0           1\n"
        );
        assert_eq!(render_table(&[]), "no introspection rules\n");
        assert_eq!(created_line(r#"{"uuid": "u1", "description": "gpu"}"#), "u1: created (gpu)");
        assert_eq!(created_line(r#"{"uuid": "u1", "description": null}"#), "u1: created");
    }
}
