//! ironic-inspector's introspection rules (`/v1/rules`): validation of what users POST, and evaluation against
//! the processed introspection data and the node. Pure: no I/O, no clock, no Ironic client.
//!
//! - [`validate`] checks a POST body as ironic-inspector does and returns the [`Rule`] to store.
//! - [`apply`] checks every applicable rule's conditions, then turns the matching rules' actions into
//!   [`Effect`]s, which the engine carries out against Ironic.
//!
//! Inside: `conditions` (operators), `actions` (effects), `path` (JSONPath in `jsonpath_rw`'s dialect), `format`
//! (Python's `str.format` for action values), `net` (`in-net`), `python` (the Python value semantics the rules
//! inherit: `str()`, `==`, `<`, `int()`), `params` and `validate` (POST checks).

mod actions;
mod conditions;
mod format;
mod net;
mod params;
mod path;
mod python;
mod validate;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use actions::{Action, ActionKind};
pub use conditions::{Condition, ConditionError, Multiple, Operator};
pub use format::FormatError;
pub use path::PathError;

/// One introspection rule as ironic-inspector stores and returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// The rule's UUID, as given (any form oslo's `is_uuid_like` accepts) or generated.
    pub uuid: String,
    /// Free text; the rule's name in messages when set.
    pub description: Option<String>,
    /// When set and not empty, the rule applies only to nodes whose `properties.inspection_scope` equals it.
    pub scope: Option<String>,
    /// Conditions, all of which must hold (none: the rule always applies).
    pub conditions: Vec<Condition>,
    /// Actions, in order (at least one).
    pub actions: Vec<Action>,
    /// Milliseconds since the epoch; rules apply in this order (ties: by uuid).
    pub created_at: u64,
}

impl Rule {
    /// The short form `GET /v1/rules` lists: `{"uuid", "description", "scope"}` (the REST layer adds `links`).
    pub fn summary(&self) -> Value {
        json!({"uuid": self.uuid, "description": self.description, "scope": self.scope})
    }

    /// The full form `GET /v1/rules/{uuid}` and `POST /v1/rules` return (the REST layer adds `links`): conditions
    /// and actions as they were posted, conditions with `multiple` and `invert` filled in.
    pub fn full(&self) -> Value {
        json!({
            "uuid": self.uuid,
            "description": self.description,
            "scope": self.scope,
            "conditions": self.conditions,
            "actions": self.actions,
        })
    }

    /// How messages name the rule: its description, or its uuid when it has none (as ironic-inspector does).
    pub fn display_name(&self) -> &str {
        self.description.as_deref().filter(|d| !d.is_empty()).unwrap_or(&self.uuid)
    }

    fn in_scope(&self, node: &Value) -> bool {
        match self.scope.as_deref() {
            None | Some("") => true,
            Some(scope) => node.pointer("/properties/inspection_scope").and_then(Value::as_str) == Some(scope),
        }
    }

    /// Whether every condition holds; `Ok(false)` as soon as one does not (later ones are not checked).
    fn matches(&self, data: &Value, node: &Value) -> Result<bool, RuleError> {
        for condition in &self.conditions {
            let outcome = condition.holds(data, node).map_err(|source| RuleError::Condition {
                rule: self.display_name().to_owned(),
                field: condition.field.clone(),
                op: condition.op,
                source,
            })?;
            match outcome {
                Some(true) => {}
                Some(false) => {
                    tracing::info!(rule = self.display_name(), field = %condition.field, op = %condition.op,
                        "rule will not be applied: condition failed");
                    return Ok(false);
                }
                None => {
                    tracing::info!(rule = self.display_name(), field = %condition.field,
                        "rule will not be applied: field not found in the data");
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}

/// What applying the matching rules asks for; the engine turns it into Ironic calls, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Fail the inspection with this message (the `fail` action).
    Fail(String),
    /// A JSON-patch op on the node ("add"/"replace", path with a leading '/', value).
    NodePatch {
        /// `add` or `replace`.
        op: String,
        /// The JSON pointer, with a leading '/'.
        path: String,
        /// The new value.
        value: Value,
    },
    /// `set-attribute` on `/driver`: comes right before that `NodePatch`; the engine adds
    /// `?reset_interfaces=<bool>` to its PATCH.
    ResetInterfaces(bool),
    /// `set-capability`: merge `name:value` into `properties.capabilities` (ironic-inspector's
    /// `update_capabilities`); `None` (no value given, or null) removes `name`.
    Capability {
        /// The capability.
        name: String,
        /// Its new value (Python's `str()` of the formatted value), or `None` to remove it.
        value: Option<String>,
    },
    /// `add-trait`: `PUT /v1/nodes/{node}/traits/{name}`.
    AddTrait(String),
    /// `remove-trait`: `DELETE /v1/nodes/{node}/traits/{name}` (a 404 is fine).
    RemoveTrait(String),
}

/// Why a rule body is invalid (validation: an HTTP 400 with this message) or why applying rules failed (the
/// introspection fails with this message).
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// The body is not a JSON object.
    #[error("Invalid rule: the request body must be a JSON object")]
    BodyNotObject,
    /// `uuid` is not a UUID.
    #[error("Invalid UUID value")]
    InvalidUuid,
    /// `scope` is longer than 255 characters.
    #[error("Invalid scope: the length of the scope should be within 255 characters")]
    ScopeTooLong,
    /// `scope` is not a string.
    #[error("Invalid scope: the scope must be a string")]
    InvalidScope,
    /// `description` is not a string.
    #[error("Invalid description: the description must be a string")]
    InvalidDescription,
    /// `conditions` does not match ironic-inspector's schema (not a list, unknown `op`, missing `field`, bad
    /// `multiple` or `invert` …).
    #[error("Validation failed for conditions: {0}")]
    ConditionsSchema(String),
    /// `actions` does not match ironic-inspector's schema (not a list, empty, unknown `action` …).
    #[error("Validation failed for actions: {0}")]
    ActionsSchema(String),
    /// A field's scheme is neither `data://` nor `node://`.
    #[error("Unsupported scheme for field: {0}, valid values are node:// or data://")]
    UnsupportedScheme(String),
    /// A field's JSONPath does not parse.
    #[error("Unable to parse field JSON path {field}: {source}")]
    FieldPath {
        /// The field as given.
        field: String,
        /// The parse error.
        #[source]
        source: PathError,
    },
    /// An operator's parameters are missing, unexpected or invalid (a bad CIDR, a bad regex).
    #[error("Invalid parameters for operator {op}: {reason}")]
    OperatorParams {
        /// The operator.
        op: Operator,
        /// ironic-inspector's message.
        reason: String,
    },
    /// An action's parameters are missing or unexpected.
    #[error("Invalid parameters for action {action}: {reason}")]
    ActionParams {
        /// The action.
        action: ActionKind,
        /// ironic-inspector's message.
        reason: String,
    },
    /// A condition could not be checked (a value that does not convert, compare or parse as an address).
    #[error("Rule \"{rule}\": condition {field} {op} could not be checked: {source}")]
    Condition {
        /// The rule's display name.
        rule: String,
        /// The condition's field.
        field: String,
        /// The condition's operator.
        op: Operator,
        /// Why.
        #[source]
        source: ConditionError,
    },
    /// An action's value could not be formatted with the data (e.g. `{data[missing]}`).
    #[error("Rule \"{rule}\": action {action}: invalid formatting of value {template}: {source}")]
    Format {
        /// The rule's display name.
        rule: String,
        /// The action.
        action: ActionKind,
        /// The string that could not be formatted.
        template: String,
        /// Why.
        #[source]
        source: FormatError,
    },
    /// An action could not produce its effect (a parameter of the wrong type, a node field that is not a list …).
    #[error("Rule \"{rule}\": action {action} failed: {reason}")]
    Action {
        /// The rule's display name.
        rule: String,
        /// The action.
        action: ActionKind,
        /// Why.
        reason: String,
    },
}

/// Validates a `POST /v1/rules` body like ironic-inspector: `{uuid?, description?, scope? (<= 255 characters),
/// conditions: [...] (may be empty or absent), actions: [...] (at least one)}`. A missing or empty `uuid` is
/// generated (random v4); `created_at` is `now_ms`. Errors carry ironic-inspector's messages (the REST layer
/// returns them as HTTP 400 `{"error":{"message":...}}`). Uniqueness of the uuid is the store's business.
pub fn validate(body: &Value, now_ms: u64) -> Result<Rule, RuleError> {
    validate::rule(body, now_ms)
}

/// Applies `rules` to the processed `data` and the Ironic `node` (its API JSON), as ironic-inspector's
/// `rules.apply` does:
///
/// 1. rules are taken in `created_at` order (ties: uuid); only those whose scope is empty or equals
///    `node.properties.inspection_scope` apply;
/// 2. every applicable rule's conditions are checked first, against the data as given (a missing field makes the
///    rule not match, except for `is-empty`); `node://` fields see the node with openstacksdk's names added;
/// 3. then each matching rule's actions, in order, produce effects. Action values are formatted with Python's
///    `str.format(data=data)`; a later `extend-attribute` sees the patches of earlier actions.
///
/// A `fail` effect stops nothing here: later actions and rules still produce effects, and the engine fails the
/// inspection when it reaches the `Fail`. An error met *after* a `Fail` was produced ends production and returns
/// the effects so far, since ironic-inspector would have stopped at the `fail` and reported its message.
pub fn apply(rules: &[Rule], data: &Value, node: &Value) -> Result<Vec<Effect>, RuleError> {
    let mut ordered: Vec<&Rule> = rules.iter().collect();
    ordered.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.uuid.cmp(&b.uuid)));
    let node_view = conditions::node_view(node);
    let mut matching = Vec::new();
    for rule in ordered {
        if !rule.in_scope(node) {
            tracing::debug!(rule = rule.display_name(), scope = ?rule.scope, "rule ignored: the node's scope differs");
            continue;
        }
        if rule.matches(data, &node_view)? {
            tracing::info!(rule = rule.display_name(), "rule will be applied");
            matching.push(rule);
        }
    }
    let mut effects = actions::Effects::new(node, data);
    for rule in matching {
        for action in &rule.actions {
            let Err(failure) = effects.apply(action) else { continue };
            if effects.failed() {
                return Ok(effects.into_effects());
            }
            let rule = rule.display_name().to_owned();
            return Err(match failure {
                actions::ActionFailure::Format(f) => {
                    RuleError::Format { rule, action: action.action, template: f.template, source: f.error }
                }
                actions::ActionFailure::Invalid(reason) => RuleError::Action { rule, action: action.action, reason },
            });
        }
    }
    Ok(effects.into_effects())
}

#[cfg(test)]
mod tests;
