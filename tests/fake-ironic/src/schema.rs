//! The part of JSON Schema that Ironic's request schemas use, evaluated the way Python's `jsonschema` (4.2x)
//! evaluates it, so that the fake's 400s carry Ironic's text. Ironic validates a body with `jsonschema`, keeps the
//! error `best_match` picks, and words it `Schema error for <name>: <message>`, adding `. Possible root cause:
//! <message>` when that error came from an `anyOf`/`oneOf` (`ironic/common/args.py`).
//!
//! Keywords are checked in the order they are added, which must be the order of the keys in Ironic's schema dict:
//! among equally relevant errors the first one found wins, as in Python.

use std::cmp::Ordering;

use serde_json::Value;

use crate::pyfmt::{repr, repr_str};

/// A step of the path from the validated value to the failing part of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Seg {
    Index(usize),
    Key(String),
}

/// A schema: its keywords, in Ironic's order.
#[derive(Debug, Default)]
pub(crate) struct Schema {
    keywords: Vec<Keyword>,
}

#[derive(Debug)]
enum Keyword {
    Type(&'static [&'static str]),
    Properties(Vec<(&'static str, Schema)>),
    Items(Box<Schema>),
    Required(&'static [&'static str]),
    NoAdditionalProperties,
    Enum(Vec<Value>),
    /// Stands in for an `enum` too long to spell out: `test` says whether the value is in it.
    EnumCheck(fn(&Value) -> bool, &'static str),
    Pattern(&'static str, fn(&str) -> bool),
    MinLength(usize),
    MaxLength(usize),
    AnyOf(Vec<Schema>),
    /// Each subschema with its Python `repr`, which the "valid under each of" message shows.
    OneOf(Vec<(Schema, &'static str)>),
    DependentRequired(&'static [(&'static str, &'static [&'static str])]),
}

/// One validation error, as `jsonschema.ValidationError` has it.
#[derive(Debug, Clone)]
struct Error {
    message: String,
    path: Vec<Seg>,
    keyword: &'static str,
    /// Whether the value matches the `type` of the schema the failing keyword is in (false without a `type`).
    matches_type: bool,
    /// The errors of the subschemas of a failed `anyOf`/`oneOf`.
    context: Vec<Error>,
}

impl Schema {
    pub(crate) fn new() -> Schema {
        Schema::default()
    }

    /// `{"type": types}` alone.
    pub(crate) fn of_type(types: &'static [&'static str]) -> Schema {
        Schema::new().types(types)
    }

    fn with(mut self, keyword: Keyword) -> Schema {
        self.keywords.push(keyword);
        self
    }

    pub(crate) fn types(self, types: &'static [&'static str]) -> Schema {
        self.with(Keyword::Type(types))
    }

    pub(crate) fn properties(self, properties: Vec<(&'static str, Schema)>) -> Schema {
        self.with(Keyword::Properties(properties))
    }

    pub(crate) fn items(self, items: Schema) -> Schema {
        self.with(Keyword::Items(Box::new(items)))
    }

    pub(crate) fn required(self, names: &'static [&'static str]) -> Schema {
        self.with(Keyword::Required(names))
    }

    /// `"additionalProperties": false`.
    pub(crate) fn no_additional_properties(self) -> Schema {
        self.with(Keyword::NoAdditionalProperties)
    }

    pub(crate) fn enumeration(self, values: Vec<Value>) -> Schema {
        self.with(Keyword::Enum(values))
    }

    /// An `enum` given as a test; `shown` stands for the list in the message.
    pub(crate) fn enum_check(self, test: fn(&Value) -> bool, shown: &'static str) -> Schema {
        self.with(Keyword::EnumCheck(test, shown))
    }

    /// `"pattern"`: `shown` is the regular expression as Ironic writes it, `test` implements it.
    pub(crate) fn pattern(self, shown: &'static str, test: fn(&str) -> bool) -> Schema {
        self.with(Keyword::Pattern(shown, test))
    }

    pub(crate) fn min_length(self, n: usize) -> Schema {
        self.with(Keyword::MinLength(n))
    }

    pub(crate) fn max_length(self, n: usize) -> Schema {
        self.with(Keyword::MaxLength(n))
    }

    pub(crate) fn any_of(self, schemas: Vec<Schema>) -> Schema {
        self.with(Keyword::AnyOf(schemas))
    }

    pub(crate) fn one_of(self, schemas: Vec<(Schema, &'static str)>) -> Schema {
        self.with(Keyword::OneOf(schemas))
    }

    pub(crate) fn dependent_required(self, deps: &'static [(&'static str, &'static [&'static str])]) -> Schema {
        self.with(Keyword::DependentRequired(deps))
    }

    /// `Ok` when `instance` is valid, else Ironic's message for it: `Schema error for <name>: ...`.
    pub(crate) fn check(&self, name: &str, instance: &Value) -> Result<(), String> {
        let errors = self.errors(instance);
        let Some(best) = best_match(&errors) else { return Ok(()) };
        let mut message = format!("Schema error for {name}: {}", best.message);
        // Ironic digs into the context for a likelier cause, best_match again at every level.
        let mut current = best;
        let mut cause = None;
        while let Some(next) = best_match(&current.context) {
            cause = Some(next.message.as_str());
            current = next;
        }
        if let Some(cause) = cause {
            message.push_str(". Possible root cause: ");
            message.push_str(cause);
        }
        Err(message)
    }

    pub(crate) fn is_valid(&self, instance: &Value) -> bool {
        self.errors(instance).is_empty()
    }

    fn matches_type(&self, instance: &Value) -> bool {
        self.keywords.iter().find_map(|k| match k {
            Keyword::Type(types) => Some(types.iter().any(|t| is_type(instance, t))),
            _ => None,
        }) == Some(true)
    }

    /// The names under `properties`.
    pub(crate) fn property_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.keywords
            .iter()
            .filter_map(|k| match k {
                Keyword::Properties(p) => Some(p.iter().map(|(name, _)| *name)),
                _ => None,
            })
            .flatten()
    }

    fn errors(&self, instance: &Value) -> Vec<Error> {
        let matches_type = self.matches_type(instance);
        let error = |keyword: &'static str, message: String| Error {
            message,
            path: Vec::new(),
            keyword,
            matches_type,
            context: Vec::new(),
        };
        let mut out = Vec::new();
        for keyword in &self.keywords {
            match keyword {
                Keyword::Type(types) => {
                    if !types.iter().any(|t| is_type(instance, t)) {
                        let shown = types.iter().map(|t| repr_str(t)).collect::<Vec<_>>().join(", ");
                        out.push(error("type", format!("{} is not of type {shown}", repr(instance))));
                    }
                }
                Keyword::Properties(properties) => {
                    let Value::Object(map) = instance else { continue };
                    for (name, schema) in properties {
                        if let Some(value) = map.get(*name) {
                            out.extend(schema.errors(value).into_iter().map(|mut e| {
                                e.path.insert(0, Seg::Key((*name).to_owned()));
                                e
                            }));
                        }
                    }
                }
                Keyword::Items(schema) => {
                    let Value::Array(items) = instance else { continue };
                    for (i, item) in items.iter().enumerate() {
                        out.extend(schema.errors(item).into_iter().map(|mut e| {
                            e.path.insert(0, Seg::Index(i));
                            e
                        }));
                    }
                }
                Keyword::Required(names) => {
                    let Value::Object(map) = instance else { continue };
                    for name in names.iter().filter(|n| !map.contains_key(**n)) {
                        out.push(error("required", format!("{} is a required property", repr_str(name))));
                    }
                }
                Keyword::NoAdditionalProperties => {
                    let Value::Object(map) = instance else { continue };
                    let known: Vec<&str> = self.property_names().collect();
                    let mut extras: Vec<&String> = map.keys().filter(|k| !known.contains(&k.as_str())).collect();
                    if !extras.is_empty() {
                        extras.sort();
                        let verb = if extras.len() == 1 { "was" } else { "were" };
                        let shown = extras.iter().map(|k| repr_str(k)).collect::<Vec<_>>().join(", ");
                        out.push(error(
                            "additionalProperties",
                            format!("Additional properties are not allowed ({shown} {verb} unexpected)"),
                        ));
                    }
                }
                Keyword::Enum(values) => {
                    if !values.contains(instance) {
                        let shown = repr(&Value::Array(values.clone()));
                        out.push(error("enum", format!("{} is not one of {shown}", repr(instance))));
                    }
                }
                Keyword::EnumCheck(test, shown) => {
                    if !test(instance) {
                        out.push(error("enum", format!("{} is not one of {shown}", repr(instance))));
                    }
                }
                Keyword::Pattern(shown, test) => {
                    if let Value::String(s) = instance
                        && !test(s)
                    {
                        out.push(error("pattern", format!("{} does not match {}", repr(instance), repr_str(shown))));
                    }
                }
                Keyword::MinLength(n) => {
                    if let Value::String(s) = instance
                        && s.chars().count() < *n
                    {
                        let what = if *n == 1 { "should be non-empty" } else { "is too short" };
                        out.push(error("minLength", format!("{} {what}", repr(instance))));
                    }
                }
                Keyword::MaxLength(n) => {
                    if let Value::String(s) = instance
                        && s.chars().count() > *n
                    {
                        let what = if *n == 0 { "is expected to be empty" } else { "is too long" };
                        out.push(error("maxLength", format!("{} {what}", repr(instance))));
                    }
                }
                Keyword::AnyOf(schemas) => {
                    let mut all = Vec::new();
                    let mut valid = false;
                    for schema in schemas {
                        let errors = schema.errors(instance);
                        if errors.is_empty() {
                            valid = true;
                            break;
                        }
                        all.extend(errors);
                    }
                    if !valid {
                        let message = format!("{} is not valid under any of the given schemas", repr(instance));
                        out.push(Error { context: all, ..error("anyOf", message) });
                    }
                }
                Keyword::OneOf(schemas) => {
                    let mut all = Vec::new();
                    let first_valid = schemas.iter().position(|(schema, _)| {
                        let errors = schema.errors(instance);
                        let valid = errors.is_empty();
                        all.extend(errors);
                        valid
                    });
                    match first_valid {
                        None => {
                            let message = format!("{} is not valid under any of the given schemas", repr(instance));
                            out.push(Error { context: all, ..error("oneOf", message) });
                        }
                        Some(first) => {
                            let mut more: Vec<&str> = schemas[first + 1..]
                                .iter()
                                .filter(|(schema, _)| schema.is_valid(instance))
                                .map(|(_, shown)| *shown)
                                .collect();
                            if !more.is_empty() {
                                more.push(schemas[first].1);
                                let message = format!("{} is valid under each of {}", repr(instance), more.join(", "));
                                out.push(error("oneOf", message));
                            }
                        }
                    }
                }
                Keyword::DependentRequired(deps) => {
                    let Value::Object(map) = instance else { continue };
                    for (property, needs) in deps.iter().filter(|(p, _)| map.contains_key(*p)) {
                        for need in needs.iter().filter(|n| !map.contains_key(**n)) {
                            let message = format!("{} is a dependency of {}", repr_str(need), repr_str(property));
                            out.push(error("dependentRequired", message));
                        }
                    }
                }
            }
        }
        out
    }
}

fn is_type(value: &Value, ty: &str) -> bool {
    match ty {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// `jsonschema.exceptions.relevance`: shallower errors first, then the later sibling, then anything but
/// `anyOf`/`oneOf`, then errors whose value has the schema's type. Greater is more relevant.
fn relevance(a: &Error, b: &Error) -> Ordering {
    let weak = |e: &Error| matches!(e.keyword, "anyOf" | "oneOf");
    b.path
        .len()
        .cmp(&a.path.len())
        .then_with(|| a.path.cmp(&b.path))
        .then_with(|| (!weak(a)).cmp(&!weak(b)))
        .then_with(|| (!a.matches_type).cmp(&!b.matches_type))
}

/// `jsonschema.exceptions.best_match`: the most relevant error (the first of equals); while it has a context, its
/// least relevant sub-error, unless the two least relevant tie.
fn best_match(errors: &[Error]) -> Option<&Error> {
    let mut best = errors.iter().reduce(|best, e| if relevance(e, best) == Ordering::Greater { e } else { best })?;
    while !best.context.is_empty() {
        let mut sorted: Vec<&Error> = best.context.iter().collect();
        sorted.sort_by(|a, b| relevance(a, b));
        if let [first, second, ..] = sorted[..]
            && relevance(first, second) == Ordering::Equal
        {
            return Some(best);
        }
        best = sorted[0];
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Expected messages are what Python's jsonschema 4.2x says for the same schema and value.

    fn patch_schema() -> Schema {
        Schema::of_type(&["array"]).items(
            Schema::of_type(&["object"])
                .properties(vec![
                    ("path", Schema::of_type(&["string"]).pattern("^(/[\\w-]+)+$", |s| !s.contains(' '))),
                    ("op", Schema::of_type(&["string"]).enumeration(vec![json!("add"), json!("remove")])),
                ])
                .no_additional_properties()
                .required(&["op", "path"]),
        )
    }

    #[test]
    fn picks_the_error_python_picks() {
        let s = patch_schema();
        assert_eq!(s.check("patch", &json!([{"op": "add", "path": "/x"}])), Ok(()));
        assert_eq!(
            s.check("patch", &json!({"op": 5})).unwrap_err(),
            "Schema error for patch: {'op': 5} is not of type 'array'"
        );
        // The later sibling wins among equally deep errors; item-level errors beat property-level ones.
        assert_eq!(
            s.check("patch", &json!([{"op": "move", "path": "/x"}, {"op": "add", "path": "/a b"}])).unwrap_err(),
            "Schema error for patch: '/a b' does not match '^(/[\\\\w-]+)+$'"
        );
        assert_eq!(
            s.check("patch", &json!([{"op": "move", "path": "/x"}, {"path": "/x"}])).unwrap_err(),
            "Schema error for patch: 'op' is a required property"
        );
        assert_eq!(
            s.check("patch", &json!([{"op": "add", "path": "/x", "from": 1, "a": 2}])).unwrap_err(),
            "Schema error for patch: Additional properties are not allowed ('a', 'from' were unexpected)"
        );
        assert_eq!(
            s.check("patch", &json!([{"op": 5, "path": "/x"}])).unwrap_err(),
            "Schema error for patch: 5 is not of type 'string'"
        );
    }

    #[test]
    fn any_of_gives_a_root_cause() {
        let s = Schema::of_type(&["string"]).min_length(1).max_length(5).any_of(vec![
            Schema::new().pattern("^CUSTOM_[A-Z0-9_]+$", |s| s.starts_with("CUSTOM_")),
            Schema::new().enum_check(|v| v == "HW_A", "['HW_A']"),
        ]);
        assert_eq!(
            s.check("trait", &json!("lower")).unwrap_err(),
            "Schema error for trait: 'lower' is not valid under any of the given schemas. Possible root cause: \
             'lower' does not match '^CUSTOM_[A-Z0-9_]+$'"
        );
        assert_eq!(s.check("trait", &json!("")).unwrap_err(), "Schema error for trait: '' should be non-empty");
        assert_eq!(s.check("trait", &json!("TOOLONG")).unwrap_err(), "Schema error for trait: 'TOOLONG' is too long");
        assert_eq!(s.check("trait", &json!(5)).unwrap_err(), "Schema error for trait: 5 is not of type 'string'");
        assert_eq!(s.check("trait", &json!("HW_A")), Ok(()));
    }

    #[test]
    fn one_of_both_and_neither() {
        let s = Schema::of_type(&["object"]).required(&["a"]).one_of(vec![
            (Schema::new().required(&["x"]), "{'required': ['x']}"),
            (Schema::new().required(&["y"]), "{'required': ['y']}"),
        ]);
        assert_eq!(
            s.check("port", &json!({"a": 1})).unwrap_err(),
            "Schema error for port: {'a': 1} is not valid under any of the given schemas. Possible root cause: 'x' \
             is a required property"
        );
        assert_eq!(
            s.check("port", &json!({"a": 1, "x": 1, "y": 2})).unwrap_err(),
            "Schema error for port: {'a': 1, 'x': 1, 'y': 2} is valid under each of {'required': ['y']}, \
             {'required': ['x']}"
        );
        assert_eq!(s.check("port", &json!({"x": 1})).unwrap_err(), "Schema error for port: 'a' is a required property");
    }
}
