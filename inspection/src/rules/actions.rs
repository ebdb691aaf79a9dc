//! Rule actions: `{action, …parameters}`, their validation, and the effects they ask of the engine.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Effect;
use super::format::{FormatFailure, format_value};
use super::params;
use super::python::{self, truthy, type_name};

/// An action (ironic-inspector's `ironic_inspector.rules.actions` plugins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionKind {
    /// ironic-inspector's sample plugin, registered by default: it only logs, and takes no parameters.
    Example,
    /// `{message}`: fail the introspection.
    Fail,
    /// `{path, value, reset_interfaces?}`: PATCH `add` on the node.
    SetAttribute,
    /// `{name, value?}`: merge a capability into `properties.capabilities` (no value removes it).
    SetCapability,
    /// `{path, value, unique?}`: append to a list on the node.
    ExtendAttribute,
    /// `{name}`: add a trait.
    AddTrait,
    /// `{name}`: remove a trait (absent is fine).
    RemoveTrait,
}

impl ActionKind {
    /// Every action, in ironic-inspector's registration order (as its schema errors list them).
    pub const ALL: [ActionKind; 7] = [
        ActionKind::Example,
        ActionKind::Fail,
        ActionKind::SetAttribute,
        ActionKind::SetCapability,
        ActionKind::ExtendAttribute,
        ActionKind::AddTrait,
        ActionKind::RemoveTrait,
    ];

    /// The action's name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Example => "example",
            ActionKind::Fail => "fail",
            ActionKind::SetAttribute => "set-attribute",
            ActionKind::SetCapability => "set-capability",
            ActionKind::ExtendAttribute => "extend-attribute",
            ActionKind::AddTrait => "add-trait",
            ActionKind::RemoveTrait => "remove-trait",
        }
    }

    /// The action with this API name.
    pub fn from_name(name: &str) -> Option<ActionKind> {
        ActionKind::ALL.into_iter().find(|a| a.as_str() == name)
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One action of a rule, as ironic-inspector stores and shows it: its kind and its parameters, kept verbatim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    /// The action.
    pub action: ActionKind,
    /// Every other key of the action (`message`, `path`, `value` …), as sent.
    #[serde(flatten)]
    pub params: Map<String, Value>,
}

/// Checks an action's parameters as ironic-inspector's plugin does; the error is its message.
pub(super) fn validate_params(kind: ActionKind, params: &Map<String, Value>) -> Result<(), String> {
    match kind {
        ActionKind::Example => params::check(params, &[], &[]),
        ActionKind::Fail => params::check(params, &["message"], &[]),
        // `value` must be present but may be null.
        ActionKind::SetAttribute if !params.contains_key("value") => {
            Err("missing required parameter(s): value".to_owned())
        }
        ActionKind::SetAttribute => params::check(params, &["path"], &["value", "reset_interfaces"]),
        ActionKind::SetCapability => params::check(params, &["name"], &["value"]),
        ActionKind::ExtendAttribute => params::check(params, &["path", "value"], &["unique"]),
        ActionKind::AddTrait | ActionKind::RemoveTrait => params::check(params, &["name"], &[]),
    }
}

/// Why an action could not produce its effects.
#[derive(Debug)]
pub(super) enum ActionFailure {
    /// A `value` could not be formatted.
    Format(FormatFailure),
    /// Anything else (a parameter of the wrong type, a node field that cannot be extended …).
    Invalid(String),
}

impl From<FormatFailure> for ActionFailure {
    fn from(failure: FormatFailure) -> Self {
        ActionFailure::Format(failure)
    }
}

/// Turns actions into effects, keeping a copy of the node with the effects so far applied (ironic-inspector
/// re-reads the node after each PATCH, so a later `extend-attribute` sees an earlier `set-attribute`).
#[derive(Debug)]
pub(super) struct Effects<'d> {
    data: &'d Value,
    node: Value,
    effects: Vec<Effect>,
}

impl<'d> Effects<'d> {
    pub(super) fn new(node: &Value, data: &'d Value) -> Self {
        Effects { data, node: node.clone(), effects: Vec::new() }
    }

    /// Whether a `fail` effect was produced.
    pub(super) fn failed(&self) -> bool {
        self.effects.iter().any(|e| matches!(e, Effect::Fail(_)))
    }

    pub(super) fn into_effects(self) -> Vec<Effect> {
        self.effects
    }

    /// Produces the effects of one action.
    pub(super) fn apply(&mut self, action: &Action) -> Result<(), ActionFailure> {
        let params = &action.params;
        match action.action {
            ActionKind::Example => {}
            ActionKind::Fail => {
                let message = required(params, "message")?;
                self.effects.push(Effect::Fail(python::str(message)));
            }
            ActionKind::SetAttribute => {
                let path = string(params, "path")?;
                let value = format_value(required(params, "value")?, self.data)?;
                if path.trim_matches('/') == "driver" {
                    let reset = params.get("reset_interfaces").is_none_or(truthy);
                    self.effects.push(Effect::ResetInterfaces(reset));
                }
                self.patch("add", patch_path(path), value);
            }
            ActionKind::SetCapability => {
                let Some(Value::String(name)) = params.get("name") else {
                    return Err(ActionFailure::Invalid("the capability name must be a string".to_owned()));
                };
                let value = match params.get("value") {
                    None => None,
                    Some(value) => match format_value(value, self.data)? {
                        Value::Null => None,
                        formatted => Some(python::str(&formatted)),
                    },
                };
                merge_capability(&mut self.node, name, value.as_deref()).map_err(ActionFailure::Invalid)?;
                self.effects.push(Effect::Capability { name: name.clone(), value });
            }
            ActionKind::ExtendAttribute => {
                let path = string(params, "path")?;
                let value = format_value(required(params, "value")?, self.data)?;
                let unique = params.get("unique").is_some_and(truthy);
                let (current, op) = match field_by_path(&self.node, path).map_err(ActionFailure::Invalid)? {
                    Some(current) => (current.clone(), "replace"),
                    None => (Value::Array(Vec::new()), "add"),
                };
                let extended = extend(&current, value, unique).map_err(ActionFailure::Invalid)?;
                if !python::equal(&extended, &current) {
                    self.patch(op, patch_path(path), extended);
                }
            }
            ActionKind::AddTrait => {
                let name = required(params, "name")?;
                self.effects.push(Effect::AddTrait(python::str(name)));
            }
            ActionKind::RemoveTrait => {
                let name = required(params, "name")?;
                self.effects.push(Effect::RemoveTrait(python::str(name)));
            }
        }
        Ok(())
    }

    fn patch(&mut self, op: &str, path: String, value: Value) {
        apply_patch(&mut self.node, op, &path, value.clone());
        self.effects.push(Effect::NodePatch { op: op.to_owned(), path, value });
    }
}

fn required<'p>(params: &'p Map<String, Value>, name: &str) -> Result<&'p Value, ActionFailure> {
    params.get(name).ok_or_else(|| ActionFailure::Invalid(format!("missing parameter {name}")))
}

fn string<'p>(params: &'p Map<String, Value>, name: &str) -> Result<&'p str, ActionFailure> {
    match required(params, name)? {
        Value::String(s) => Ok(s),
        other => Err(ActionFailure::Invalid(format!("{name} must be a string, not {}", python::repr(other)))),
    }
}

/// The PATCH path: a leading '/' is added when missing (an empty path is left alone, as ironic-inspector does).
fn patch_path(path: &str) -> String {
    if path.is_empty() || path.starts_with('/') { path.to_owned() } else { format!("/{path}") }
}

/// ironic-inspector's `NodeInfo.get_by_path`: `/prop` or `/prop/key` (one level; the key is the whole rest).
/// `Ok(None)` when absent.
fn field_by_path<'n>(node: &'n Value, path: &str) -> Result<Option<&'n Value>, String> {
    let path = path.trim_matches('/');
    let Some((property, key)) = path.split_once('/') else {
        return Ok(node.get(path));
    };
    match node.get(property) {
        None => Ok(None),
        Some(Value::Object(map)) => Ok(map.get(key)),
        Some(other) => Err(format!(
            "cannot read {} from the node's {property}: '{}' object is not subscriptable by a string",
            python::repr_str(key),
            type_name(other)
        )),
    }
}

/// ExtendAttributeAction's `_replace`: append `value` unless `unique` and already present.
fn extend(current: &Value, value: Value, unique: bool) -> Result<Value, String> {
    match current {
        Value::Array(items) => {
            let mut items = items.clone();
            if !unique || !items.iter().any(|item| python::equal(item, &value)) {
                items.push(value);
            }
            Ok(Value::Array(items))
        }
        // Python evaluates `value not in current` first, then fails on `.append`.
        other => {
            if unique && contains(other, &value)? {
                Ok(other.clone())
            } else {
                Err(format!(
                    "cannot extend {}: '{}' object has no attribute 'append'",
                    python::repr(other),
                    type_name(other)
                ))
            }
        }
    }
}

/// Python's `value in container` for a container that is not a list.
fn contains(container: &Value, value: &Value) -> Result<bool, String> {
    match (container, value) {
        (Value::String(s), Value::String(v)) => Ok(s.contains(v.as_str())),
        (Value::String(_), other) => {
            Err(format!("'in <string>' requires string as left operand, not {}", type_name(other)))
        }
        (Value::Object(map), Value::String(key)) => Ok(map.contains_key(key)),
        (Value::Object(_), Value::Array(_) | Value::Object(_)) => {
            Err(format!("unhashable type: '{}'", type_name(value)))
        }
        (Value::Object(_), _) => Ok(false),
        (other, _) => Err(format!("argument of type '{}' is not iterable", type_name(other))),
    }
}

/// ironic-inspector's `update_capabilities`: parse `k:v,k2:v2`, set (or, with no value, drop) one, write back.
fn merge_capability(node: &mut Value, name: &str, value: Option<&str>) -> Result<(), String> {
    let Some(node) = node.as_object_mut() else { return Ok(()) };
    let properties = node.entry("properties").or_insert_with(|| Value::Object(Map::new()));
    let Some(properties) = properties.as_object_mut() else {
        return Err("the node's properties are not a dict".to_owned());
    };
    let current = properties.get("capabilities").cloned().unwrap_or(Value::Null);
    let mut capabilities: Vec<(String, Option<String>)> = Vec::new();
    match &current {
        c if !truthy(c) => {}
        Value::String(text) => {
            for piece in text.split(',') {
                let Some((key, val)) = piece.split_once(':') else {
                    return Err(format!("the node's capabilities {} are malformed", python::repr(&current)));
                };
                match capabilities.iter_mut().find(|(k, _)| k == key) {
                    Some(slot) => slot.1 = Some(val.to_owned()),
                    None => capabilities.push((key.to_owned(), Some(val.to_owned()))),
                }
            }
        }
        other => return Err(format!("the node's capabilities {} are not a string", python::repr(other))),
    }
    match capabilities.iter_mut().find(|(k, _)| k == name) {
        Some(slot) => slot.1 = value.map(str::to_owned),
        None => capabilities.push((name.to_owned(), value.map(str::to_owned))),
    }
    let joined: Vec<String> = capabilities.into_iter().filter_map(|(k, v)| v.map(|v| format!("{k}:{v}"))).collect();
    properties.insert("capabilities".to_owned(), Value::String(joined.join(",")));
    Ok(())
}

/// Applies one JSON-patch `add`/`replace` to the working copy of the node, as well as it can (a path whose
/// parent is missing is left to Ironic to reject).
fn apply_patch(node: &mut Value, op: &str, path: &str, value: Value) {
    let Some(rest) = path.strip_prefix('/') else { return };
    let tokens: Vec<String> = rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
    let Some((last, parents)) = tokens.split_last() else { return };
    let mut target = node;
    for token in parents {
        let next = match target {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        };
        let Some(next) = next else { return };
        target = next;
    }
    match target {
        Value::Object(map) => {
            map.insert(last.clone(), value);
        }
        Value::Array(items) if last == "-" => items.push(value),
        Value::Array(items) => {
            let Ok(index) = last.parse::<usize>() else { return };
            if op == "add" && index <= items.len() {
                items.insert(index, value);
            } else if let Some(slot) = items.get_mut(index) {
                *slot = value;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn action(body: Value) -> Action {
        serde_json::from_value(body).unwrap()
    }

    fn effects(node: Value, data: Value, actions: &[Value]) -> Result<Vec<Effect>, ActionFailure> {
        let mut run = Effects::new(&node, &data);
        for body in actions {
            run.apply(&action(body.clone()))?;
        }
        Ok(run.into_effects())
    }

    fn patch(op: &str, path: &str, value: Value) -> Effect {
        Effect::NodePatch { op: op.to_owned(), path: path.to_owned(), value }
    }

    #[test]
    fn fail() {
        let out = effects(json!({}), json!({}), &[json!({"action": "fail", "message": "boom"})]).unwrap();
        assert_eq!(out, vec![Effect::Fail("boom".to_owned())]);
    }

    #[test]
    fn set_attribute() {
        let out = effects(
            json!({}),
            json!({"inventory": {"bmc_address": "192.0.2.9"}}),
            &[
                json!({"action": "set-attribute", "path": "/extra/value", "value": 42}),
                json!({"action": "set-attribute", "path": "driver_info/ipmi_address", "value": "{data[inventory][bmc_address]}"}),
                json!({"action": "set-attribute", "path": "/properties/cpus", "value": null}),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                patch("add", "/extra/value", json!(42)),
                patch("add", "/driver_info/ipmi_address", json!("192.0.2.9")),
                patch("add", "/properties/cpus", json!(null)),
            ]
        );
    }

    #[test]
    fn set_attribute_on_driver_resets_interfaces_unless_told_not_to() {
        let out =
            effects(json!({}), json!({}), &[json!({"action": "set-attribute", "path": "/driver", "value": "ipmi"})]);
        assert_eq!(out.unwrap(), vec![Effect::ResetInterfaces(true), patch("add", "/driver", json!("ipmi"))]);
        let out = effects(
            json!({}),
            json!({}),
            &[json!({"action": "set-attribute", "path": "driver/", "value": "ipmi", "reset_interfaces": false})],
        );
        assert_eq!(out.unwrap(), vec![Effect::ResetInterfaces(false), patch("add", "/driver/", json!("ipmi"))]);
    }

    #[test]
    fn set_capability() {
        let out = effects(
            json!({"properties": {"capabilities": "x:y,cap1:old_val"}}),
            json!({"memory_mb": 1024}),
            &[
                json!({"action": "set-capability", "name": "cap1", "value": "val"}),
                json!({"action": "set-capability", "name": "mem", "value": "{data[memory_mb]}"}),
                json!({"action": "set-capability", "name": "x"}),
                json!({"action": "extend-attribute", "path": "/extra/caps", "value": "x"}),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                Effect::Capability { name: "cap1".to_owned(), value: Some("val".to_owned()) },
                Effect::Capability { name: "mem".to_owned(), value: Some("1024".to_owned()) },
                Effect::Capability { name: "x".to_owned(), value: None },
                patch("add", "/extra/caps", json!(["x"])),
            ]
        );
        let mut node = json!({"properties": {"capabilities": "x:y,cap1:old_val,answer:42"}});
        merge_capability(&mut node, "cap1", Some("val")).unwrap();
        merge_capability(&mut node, "x", None).unwrap();
        assert_eq!(node["properties"]["capabilities"], json!("cap1:val,answer:42"));
        let mut malformed = json!({"properties": {"capabilities": "nocolon"}});
        assert!(merge_capability(&mut malformed, "a", Some("b")).is_err());
    }

    #[test]
    fn extend_attribute() {
        let data = json!({"memory_mb": 1024});
        let extend = |node: Value, unique: bool| {
            effects(
                node,
                data.clone(),
                &[json!({"action": "extend-attribute", "path": "/extra/value", "value": 42, "unique": unique})],
            )
            .unwrap()
        };
        assert_eq!(extend(json!({"extra": {}}), false), vec![patch("add", "/extra/value", json!([42]))]);
        assert_eq!(extend(json!({}), false), vec![patch("add", "/extra/value", json!([42]))]);
        assert_eq!(
            extend(json!({"extra": {"value": [0]}}), false),
            vec![patch("replace", "/extra/value", json!([0, 42]))]
        );
        assert_eq!(
            extend(json!({"extra": {"value": [42]}}), false),
            vec![patch("replace", "/extra/value", json!([42, 42]))]
        );
        assert_eq!(extend(json!({"extra": {"value": [42]}}), true), vec![]);
        assert_eq!(
            extend(json!({"extra": {"value": [1]}}), true),
            vec![patch("replace", "/extra/value", json!([1, 42]))]
        );
        let not_a_list = effects(
            json!({"extra": {"value": "text"}}),
            json!({}),
            &[json!({"action": "extend-attribute", "path": "/extra/value", "value": 1})],
        );
        assert!(matches!(not_a_list, Err(ActionFailure::Invalid(_))));
    }

    #[test]
    fn extend_attribute_sees_earlier_patches() {
        let out = effects(
            json!({"extra": {}}),
            json!({"memory_mb": 1024}),
            &[
                json!({"action": "extend-attribute", "path": "/extra/tags", "value": "a"}),
                json!({"action": "extend-attribute", "path": "extra/tags", "value": "{data[memory_mb]}"}),
                json!({"action": "extend-attribute", "path": "/extra/tags", "value": "a", "unique": true}),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            vec![patch("add", "/extra/tags", json!(["a"])), patch("replace", "/extra/tags", json!(["a", "1024"]))]
        );
    }

    #[test]
    fn traits() {
        let out = effects(
            json!({}),
            json!({}),
            &[
                json!({"action": "add-trait", "name": "CUSTOM_FOO"}),
                json!({"action": "remove-trait", "name": "CUSTOM_BAR"}),
            ],
        )
        .unwrap();
        assert_eq!(out, vec![Effect::AddTrait("CUSTOM_FOO".to_owned()), Effect::RemoveTrait("CUSTOM_BAR".to_owned())]);
    }

    #[test]
    fn example_does_nothing() {
        assert_eq!(effects(json!({}), json!({}), &[json!({"action": "example"})]).unwrap(), vec![]);
    }

    #[test]
    fn params_validation() {
        let p = |v: Value| v.as_object().cloned().unwrap();
        assert!(validate_params(ActionKind::Fail, &p(json!({"message": "boom"}))).is_ok());
        assert!(validate_params(ActionKind::Fail, &p(json!({}))).is_err());
        assert!(validate_params(ActionKind::SetAttribute, &p(json!({"path": "/extra/value", "value": 42}))).is_ok());
        assert!(validate_params(ActionKind::SetAttribute, &p(json!({"path": "/extra/value", "value": null}))).is_ok());
        assert!(validate_params(ActionKind::SetAttribute, &p(json!({"value": 42}))).is_err());
        assert_eq!(
            validate_params(ActionKind::SetAttribute, &p(json!({"path": "/extra/value"}))),
            Err("missing required parameter(s): value".to_owned())
        );
        assert!(validate_params(ActionKind::SetCapability, &p(json!({"name": "cap1"}))).is_ok());
        assert!(validate_params(ActionKind::SetCapability, &p(json!({"value": 42}))).is_err());
        assert!(validate_params(ActionKind::ExtendAttribute, &p(json!({"value": 42}))).is_err());
        assert!(validate_params(ActionKind::AddTrait, &p(json!({"value": 42}))).is_err());
        assert!(validate_params(ActionKind::RemoveTrait, &p(json!({"name": "CUSTOM_FOO"}))).is_ok());
        assert!(validate_params(ActionKind::Example, &p(json!({"foo": 1}))).is_err());
    }

    #[test]
    fn working_copy_patches() {
        let mut node = json!({"extra": {"list": [1, 2]}});
        apply_patch(&mut node, "add", "/extra/list/1", json!(9));
        apply_patch(&mut node, "add", "/extra/list/-", json!(3));
        apply_patch(&mut node, "replace", "/extra/list/0", json!(0));
        apply_patch(&mut node, "add", "/extra/a~1b", json!("slash"));
        apply_patch(&mut node, "add", "/missing/x", json!(1));
        assert_eq!(node, json!({"extra": {"list": [0, 9, 2, 3], "a/b": "slash"}}));
    }
}
