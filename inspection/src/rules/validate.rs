//! `POST /v1/rules` body validation, in ironic-inspector's order and with its messages: the uuid and the scope,
//! then the conditions' schema, each condition's field and parameters, then the actions' schema and parameters.

use serde_json::{Map, Value};

use super::actions::{self, Action, ActionKind};
use super::conditions::{self, Condition, ConditionError, Multiple, Operator, RESERVED};
use super::python::{self, truthy};
use super::{Rule, RuleError};

/// The longest scope ironic-inspector stores.
const MAX_SCOPE: usize = 255;

pub(super) fn rule(body: &Value, now_ms: u64) -> Result<Rule, RuleError> {
    let body = body.as_object().ok_or(RuleError::BodyNotObject)?;
    let uuid = match body.get("uuid") {
        Some(given) if truthy(given) => match given.as_str() {
            Some(uuid) if uuid_like(uuid) => uuid.to_owned(),
            _ => return Err(RuleError::InvalidUuid),
        },
        _ => random_uuid(),
    };
    let scope = match body.get("scope") {
        None | Some(Value::Null) => None,
        Some(Value::String(scope)) if scope.chars().count() > MAX_SCOPE => return Err(RuleError::ScopeTooLong),
        Some(Value::String(scope)) => Some(scope.clone()),
        Some(_) => return Err(RuleError::InvalidScope),
    };
    let description = match body.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(description)) => Some(description.clone()),
        Some(_) => return Err(RuleError::InvalidDescription),
    };
    let empty = Value::Array(Vec::new());
    let conditions = validate_conditions(body.get("conditions").unwrap_or(&empty))?;
    let actions = validate_actions(body.get("actions").unwrap_or(&empty))?;
    Ok(Rule { uuid, description, scope, conditions, actions, created_at: now_ms })
}

fn validate_conditions(conditions: &Value) -> Result<Vec<Condition>, RuleError> {
    let items = schema::conditions(conditions).map_err(RuleError::ConditionsSchema)?;
    let mut valid = Vec::with_capacity(items.len());
    for item in items {
        // The schema check guarantees these.
        let (Some(Value::String(field)), Some(op)) =
            (item.get("field"), item.get("op").and_then(Value::as_str).and_then(Operator::from_name))
        else {
            return Err(RuleError::ConditionsSchema("a condition lacks op or field".to_owned()));
        };
        match conditions::parse_field(field) {
            Ok(_) => {}
            Err(ConditionError::Scheme(scheme)) => return Err(RuleError::UnsupportedScheme(scheme)),
            Err(ConditionError::Path(source)) => return Err(RuleError::FieldPath { field: field.clone(), source }),
            Err(other) => return Err(RuleError::ConditionsSchema(other.to_string())),
        }
        let params: Map<String, Value> =
            item.iter().filter(|(k, _)| !RESERVED.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
        conditions::validate_params(op, &params).map_err(|reason| RuleError::OperatorParams { op, reason })?;
        let multiple = match item.get("multiple").and_then(Value::as_str) {
            Some("all") => Multiple::All,
            Some("first") => Multiple::First,
            _ => Multiple::Any,
        };
        let invert = item.get("invert").and_then(Value::as_bool).unwrap_or(false);
        valid.push(Condition { op, field: field.clone(), multiple, invert, params });
    }
    Ok(valid)
}

fn validate_actions(actions: &Value) -> Result<Vec<Action>, RuleError> {
    let items = schema::actions(actions).map_err(RuleError::ActionsSchema)?;
    let mut valid = Vec::with_capacity(items.len());
    for item in items {
        let Some(kind) = item.get("action").and_then(Value::as_str).and_then(ActionKind::from_name) else {
            return Err(RuleError::ActionsSchema("an action lacks its name".to_owned()));
        };
        let params: Map<String, Value> =
            item.iter().filter(|(k, _)| k.as_str() != "action").map(|(k, v)| (k.clone(), v.clone())).collect();
        actions::validate_params(kind, &params).map_err(|reason| RuleError::ActionParams { action: kind, reason })?;
        valid.push(Action { action: kind, params });
    }
    Ok(valid)
}

/// oslo's `is_uuid_like`: after removing `urn:`, `uuid:`, surrounding braces and hyphens, 32 hex digits.
fn uuid_like(text: &str) -> bool {
    let stripped = text.replace("urn:", "").replace("uuid:", "");
    let hex: String = stripped.trim_matches(['{', '}']).chars().filter(|c| *c != '-').collect();
    hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A random (version 4) UUID, lowercase and hyphenated.
fn random_uuid() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let part = |range: std::ops::Range<usize>| hex.get(range).unwrap_or_default().to_owned();
    format!("{}-{}-{}-{}-{}", part(0..8), part(8..12), part(12..16), part(16..20), part(20..32))
}

/// The JSON schemas ironic-inspector checks conditions and actions against, with `jsonschema`'s messages.
/// Like `jsonschema.best_match`, the error reported is the shallowest one (the first of those).
mod schema {
    use super::*;

    /// Collects errors with their depth in the instance.
    #[derive(Default)]
    struct Errors(Vec<(usize, String)>);

    impl Errors {
        fn add(&mut self, depth: usize, message: String) {
            self.0.push((depth, message));
        }

        fn best(self) -> Option<String> {
            let shallowest = self.0.iter().map(|(d, _)| *d).min()?;
            self.0.into_iter().find(|(d, _)| *d == shallowest).map(|(_, m)| m)
        }
    }

    fn not_of_type(instance: &Value, kind: &str) -> String {
        format!("{} is not of type '{kind}'", python::repr(instance))
    }

    fn not_one_of(instance: &Value, names: &[&str]) -> String {
        let names: Vec<String> = names.iter().map(|n| python::repr_str(n)).collect();
        format!("{} is not one of [{}]", python::repr(instance), names.join(", "))
    }

    fn objects<'v>(list: &'v [Value], required: &[&str], errors: &mut Errors) -> Vec<&'v Map<String, Value>> {
        let mut objects = Vec::new();
        for item in list {
            let Some(object) = item.as_object() else {
                errors.add(1, not_of_type(item, "object"));
                continue;
            };
            for name in required {
                if !object.contains_key(*name) {
                    errors.add(1, format!("'{name}' is a required property"));
                }
            }
            objects.push(object);
        }
        objects
    }

    pub(super) fn conditions(instance: &Value) -> Result<Vec<&Map<String, Value>>, String> {
        let Some(list) = instance.as_array() else { return Err(not_of_type(instance, "array")) };
        let mut errors = Errors::default();
        let items = objects(list, &["op", "field"], &mut errors);
        let operators: Vec<&str> = Operator::ALL.iter().map(|op| op.as_str()).collect();
        for item in &items {
            if let Some(op) = item.get("op").filter(|op| op.as_str().is_none_or(|s| Operator::from_name(s).is_none())) {
                errors.add(2, not_one_of(op, &operators));
            }
            if let Some(field) = item.get("field").filter(|f| !f.is_string()) {
                errors.add(2, not_of_type(field, "string"));
            }
            if let Some(multiple) =
                item.get("multiple").filter(|m| m.as_str().is_none_or(|s| !Multiple::NAMES.contains(&s)))
            {
                errors.add(2, not_one_of(multiple, &Multiple::NAMES));
            }
            if let Some(invert) = item.get("invert").filter(|i| !i.is_boolean()) {
                errors.add(2, not_of_type(invert, "boolean"));
            }
        }
        match errors.best() {
            Some(message) => Err(message),
            None => Ok(items),
        }
    }

    pub(super) fn actions(instance: &Value) -> Result<Vec<&Map<String, Value>>, String> {
        let Some(list) = instance.as_array() else { return Err(not_of_type(instance, "array")) };
        if list.is_empty() {
            return Err("[] is too short".to_owned());
        }
        let mut errors = Errors::default();
        let items = objects(list, &["action"], &mut errors);
        let names: Vec<&str> = ActionKind::ALL.iter().map(|a| a.as_str()).collect();
        for item in &items {
            if let Some(action) =
                item.get("action").filter(|a| a.as_str().is_none_or(|s| ActionKind::from_name(s).is_none()))
            {
                errors.add(2, not_one_of(action, &names));
            }
        }
        match errors.best() {
            Some(message) => Err(message),
            None => Ok(items),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids() {
        assert!(uuid_like("0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d"));
        assert!(uuid_like("0F4C1A547D0A4A4E9D4C0A4F8A1C2B3D"));
        assert!(uuid_like("{0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d}"));
        assert!(uuid_like("urn:uuid:0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d"));
        assert!(!uuid_like("foobar"));
        assert!(!uuid_like("0f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3"));
        assert!(!uuid_like("+f4c1a54-7d0a-4a4e-9d4c-0a4f8a1c2b3d"));
        let random = random_uuid();
        assert_eq!(random.len(), 36);
        assert!(uuid_like(&random));
        assert_eq!(random.get(14..15), Some("4"));
        assert!(matches!(random.get(19..20), Some("8" | "9" | "a" | "b")));
        assert_eq!(random, random.to_lowercase());
        assert_ne!(random, random_uuid());
    }
}
