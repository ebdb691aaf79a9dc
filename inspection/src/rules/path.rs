//! JSONPath in the dialect of Python's `jsonpath_rw`, which ironic-inspector uses for condition fields.
//!
//! Syntax (as `jsonpath_rw` 1.4 parses it):
//! - names: `memory_mb`, `inventory.cpu.count`, quoted `'odd.name'` or `"odd name"`, several at once `a,b`,
//!   every field `*`; a name is `[A-Za-z_@][A-Za-z0-9_@-]*` (so `disks.0` is not a path, `disks[0]` is);
//! - `$` the root, `` `this` `` the current value, `` `parent` `` its parent;
//! - brackets: `[0]`, `[-1]`, `[*]`, `[1:]`, `[:2]`, `[1:3]` (no step), `['name']`, `[a,b]`;
//! - operators, loosest first: `..` (descendants), `.` (child), `|` (union), `&` (intersection, which
//!   `jsonpath_rw` parses but cannot evaluate), `where` (filter); brackets bind tightest; `( … )` groups.
//!
//! Evaluation follows `jsonpath_rw`'s quirks: a slice (`[*]`) of a dict, an int or a string treats it as a list of
//! one, a name never matches inside a list (`interfaces.mac` finds nothing, `interfaces[*].mac` does), and an
//! index of a dict or of a number is an error, like the Python exception that fails the introspection.
//! Objects are visited in key order (`serde_json` keeps keys sorted; Python keeps insertion order).

use std::rc::Rc;

use serde_json::Value;

use super::python::{truthy, type_name};

/// How deeply operators may nest (Python has no limit; ours keeps evaluation off the edge of the stack).
const MAX_DEPTH: usize = 64;
/// How many values one evaluation may visit before it is abandoned (`..` over `..` can explode).
const MAX_MATCHES: usize = 100_000;

/// Why a JSONPath could not be parsed or evaluated. Parse messages follow `jsonpath_rw`'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// A character that starts no token.
    #[error("Error on line {line}, col {col}: Unexpected character: {character} ")]
    UnexpectedCharacter {
        /// 1-based line.
        line: usize,
        /// Column as `jsonpath_rw` counts it.
        col: usize,
        /// The character.
        character: char,
    },
    /// A backslash that escapes nothing inside a quoted name or operator.
    #[error("Error on line {line}, col {col} while lexing quoted field: Unexpected character: \\ ")]
    BadEscape {
        /// 1-based line.
        line: usize,
        /// Column as `jsonpath_rw` counts it.
        col: usize,
    },
    /// A quote that is never closed.
    #[error("Unexpected EOF in string literal or identifier")]
    UnterminatedString,
    /// A token the grammar does not allow where it stands.
    #[error("Parse error at {line}:{col} near token {token} ({kind})")]
    UnexpectedToken {
        /// 1-based line.
        line: usize,
        /// Column as `jsonpath_rw` counts it.
        col: usize,
        /// The token's text.
        token: String,
        /// The token's kind as `jsonpath_rw` names it (`ID`, `NUMBER`, `.` …).
        kind: String,
    },
    /// The path ends where more is needed (also the empty path).
    #[error("Parse error: unexpected end of the path")]
    UnexpectedEnd,
    /// A back-quoted operator other than `this` and `parent`.
    #[error("Unknown named operator `{0}`")]
    UnknownOperator(String),
    /// More than 64 levels of operators.
    #[error("the path nests operators more than {MAX_DEPTH} levels deep")]
    TooDeep,
    /// `&`, which `jsonpath_rw` parses but does not implement.
    #[error("the intersection operator '&' is not implemented")]
    Intersection,
    /// The evaluation visited more than 100 000 values.
    #[error("the path matches more than {MAX_MATCHES} values")]
    TooManyMatches,
    /// A lookup that raises in Python (index of a dict or a number, index out of range, slice of null).
    #[error("{0}")]
    Lookup(String),
}

/// A parsed JSONPath.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct JsonPath(Expr);

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Root,
    This,
    Parent,
    /// Named fields; `*` among them means every field.
    Fields(Vec<String>),
    Index(i64),
    Slice {
        start: Option<i64>,
        end: Option<i64>,
    },
    /// `a.b.c`: each step applied to every match of the one before.
    Chain(Vec<Expr>),
    Descendants(Box<Expr>, Box<Expr>),
    Where(Box<Expr>, Box<Expr>),
    Union(Box<Expr>, Box<Expr>),
    Intersect(Box<Expr>, Box<Expr>),
}

impl Expr {
    fn child(self, right: Expr) -> Expr {
        let mut steps = match self {
            Expr::Chain(steps) => steps,
            other => vec![other],
        };
        match right {
            Expr::Chain(more) => steps.extend(more),
            other => steps.push(other),
        }
        Expr::Chain(steps)
    }

    fn depth(&self) -> usize {
        match self {
            Expr::Chain(steps) => 1 + steps.iter().map(Expr::depth).max().unwrap_or(0),
            Expr::Descendants(l, r) | Expr::Where(l, r) | Expr::Union(l, r) | Expr::Intersect(l, r) => {
                1 + l.depth().max(r.depth())
            }
            _ => 1,
        }
    }
}

impl JsonPath {
    /// Parses `text` as `jsonpath_rw` does.
    pub(super) fn parse(text: &str) -> Result<JsonPath, PathError> {
        let tokens = lex(text)?;
        let mut parser = Parser { tokens, pos: 0, depth: 0 };
        let expr = parser.expression(0)?;
        match parser.peek() {
            None => Ok(JsonPath(expr)),
            Some(token) => Err(token.unexpected()),
        }
    }

    /// Every value the path matches in `root`, in `jsonpath_rw`'s order.
    pub(super) fn find(&self, root: &Value) -> Result<Vec<Value>, PathError> {
        let start = Rc::new(Datum { value: Node::Borrowed(root), context: None });
        let mut found = Vec::new();
        let mut budget = MAX_MATCHES;
        find(&self.0, &start, &mut found, &mut budget)?;
        Ok(found.iter().map(|d| d.value.get().clone()).collect())
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Lexer

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// One of `* . [ ] ( ) $ , : | &`.
    Literal(char),
    DoubleDot,
    Where,
    Id(String),
    Number(i64),
    Named(String),
}

#[derive(Debug, Clone)]
struct Token {
    kind: Kind,
    line: usize,
    col: usize,
}

impl Token {
    fn unexpected(&self) -> PathError {
        let (token, kind) = match &self.kind {
            Kind::Literal(c) => (c.to_string(), c.to_string()),
            Kind::DoubleDot => ("..".to_owned(), "DOUBLEDOT".to_owned()),
            Kind::Where => ("where".to_owned(), "WHERE".to_owned()),
            Kind::Id(name) => (name.clone(), "ID".to_owned()),
            Kind::Number(n) => (n.to_string(), "NUMBER".to_owned()),
            Kind::Named(name) => (name.clone(), "NAMED_OPERATOR".to_owned()),
        };
        PathError::UnexpectedToken { line: self.line, col: self.col, token, kind }
    }
}

fn lex(text: &str) -> Result<Vec<Token>, PathError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut pos = 0;
    let mut line = 1;
    let mut latest_newline = 0;
    while let Some(&c) = chars.get(pos) {
        let col = pos - latest_newline;
        let start = pos;
        let kind = match c {
            ' ' | '\t' => {
                pos += 1;
                continue;
            }
            '\n' => {
                line += 1;
                latest_newline = pos;
                pos += 1;
                continue;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == '@' => {
                while chars.get(pos).is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '@' | '-')) {
                    pos += 1;
                }
                let word: String = chars.get(start..pos).unwrap_or_default().iter().collect();
                if word == "where" { Kind::Where } else { Kind::Id(word) }
            }
            c if c.is_ascii_digit() || (c == '-' && chars.get(pos + 1).is_some_and(char::is_ascii_digit)) => {
                pos += 1;
                while chars.get(pos).is_some_and(char::is_ascii_digit) {
                    pos += 1;
                }
                let number: String = chars.get(start..pos).unwrap_or_default().iter().collect();
                // Python's int is unbounded; an index this large matches nothing either way.
                let saturated = if number.starts_with('-') { i64::MIN } else { i64::MAX };
                Kind::Number(number.parse().unwrap_or(saturated))
            }
            '\'' | '"' | '`' => {
                let (content, next) = quoted(&chars, pos, line, latest_newline)?;
                pos = next;
                if c == '`' { Kind::Named(content) } else { Kind::Id(content) }
            }
            '.' if chars.get(pos + 1) == Some(&'.') => {
                pos += 2;
                Kind::DoubleDot
            }
            '*' | '.' | '[' | ']' | '(' | ')' | '$' | ',' | ':' | '|' | '&' => {
                pos += 1;
                Kind::Literal(c)
            }
            other => return Err(PathError::UnexpectedCharacter { line, col, character: other }),
        };
        tokens.push(Token { kind, line, col });
    }
    Ok(tokens)
}

/// Reads a quoted name or operator starting at the quote `chars[open]`; returns its content and the position after
/// the closing quote. A backslash takes the next character literally (but not a newline).
fn quoted(chars: &[char], open: usize, line: usize, latest_newline: usize) -> Result<(String, usize), PathError> {
    let quote = chars.get(open).copied().unwrap_or('\'');
    let mut content = String::new();
    let mut pos = open + 1;
    loop {
        match chars.get(pos) {
            None => return Err(PathError::UnterminatedString),
            Some(&c) if c == quote => return Ok((content, pos + 1)),
            Some('\\') => match chars.get(pos + 1) {
                Some(&escaped) if escaped != '\n' => {
                    content.push(escaped);
                    pos += 2;
                }
                _ => return Err(PathError::BadEscape { line, col: pos - latest_newline }),
            },
            Some(&c) => {
                content.push(c);
                pos += 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Parser: precedence climbing over jsonpath_rw's grammar.

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
}

/// Binding power of the binary operators, as `jsonpath_rw`'s precedence table orders them (loosest first).
fn binding(kind: &Kind) -> Option<usize> {
    match kind {
        Kind::DoubleDot => Some(1),
        Kind::Literal('.') => Some(2),
        Kind::Literal('|') => Some(3),
        Kind::Literal('&') => Some(4),
        Kind::Where => Some(5),
        _ => None,
    }
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Result<Token, PathError> {
        let token = self.tokens.get(self.pos).cloned().ok_or(PathError::UnexpectedEnd)?;
        self.pos += 1;
        Ok(token)
    }

    fn next_is(&self, c: char) -> bool {
        self.peek().is_some_and(|t| t.kind == Kind::Literal(c))
    }

    fn expect(&mut self, c: char) -> Result<(), PathError> {
        let token = self.next()?;
        if token.kind == Kind::Literal(c) { Ok(()) } else { Err(token.unexpected()) }
    }

    /// An expression whose binary operators bind at least as tightly as `min`.
    fn expression(&mut self, min: usize) -> Result<Expr, PathError> {
        let mut left = self.postfix()?;
        while let Some(power) = self.peek().and_then(|t| binding(&t.kind)) {
            if power < min {
                break;
            }
            let op = self.next()?;
            let right = self.expression(power + 1)?;
            left = match op.kind {
                Kind::DoubleDot => Expr::Descendants(Box::new(left), Box::new(right)),
                Kind::Literal('|') => Expr::Union(Box::new(left), Box::new(right)),
                Kind::Literal('&') => Expr::Intersect(Box::new(left), Box::new(right)),
                Kind::Where => Expr::Where(Box::new(left), Box::new(right)),
                _ => left.child(right),
            };
            if left.depth() > MAX_DEPTH {
                return Err(PathError::TooDeep);
            }
        }
        Ok(left)
    }

    /// A primary followed by any number of `[…]`.
    fn postfix(&mut self) -> Result<Expr, PathError> {
        let mut expr = self.primary()?;
        while self.next_is('[') {
            self.pos += 1;
            expr = expr.child(self.bracket()?);
        }
        Ok(expr)
    }

    fn primary(&mut self) -> Result<Expr, PathError> {
        let token = self.next()?;
        match token.kind {
            Kind::Id(name) => self.fields(name),
            Kind::Literal('*') => Ok(Expr::Fields(vec!["*".to_owned()])),
            Kind::Literal('$') => Ok(Expr::Root),
            Kind::Named(name) => match name.as_str() {
                "this" => Ok(Expr::This),
                "parent" => Ok(Expr::Parent),
                _ => Err(PathError::UnknownOperator(name)),
            },
            Kind::Literal('[') => self.bracket(),
            Kind::Literal('(') => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(PathError::TooDeep);
                }
                let inner = self.expression(0)?;
                self.expect(')')?;
                self.depth -= 1;
                Ok(inner)
            }
            _ => Err(token.unexpected()),
        }
    }

    /// `name(,name)*` after its first name.
    fn fields(&mut self, first: String) -> Result<Expr, PathError> {
        let mut names = vec![first];
        while self.next_is(',') {
            self.pos += 1;
            let token = self.next()?;
            match token.kind {
                Kind::Id(name) => names.push(name),
                _ => return Err(token.unexpected()),
            }
        }
        Ok(Expr::Fields(names))
    }

    /// The inside of `[…]` (the `[` is consumed) up to and including the `]`.
    fn bracket(&mut self) -> Result<Expr, PathError> {
        let token = self.next()?;
        let expr = match token.kind {
            Kind::Literal('*') => Expr::Slice { start: None, end: None },
            Kind::Id(name) => self.fields(name)?,
            Kind::Number(n) if self.next_is(':') => {
                self.pos += 1;
                Expr::Slice { start: Some(n), end: self.slice_end() }
            }
            Kind::Number(n) => Expr::Index(n),
            Kind::Literal(':') => Expr::Slice { start: None, end: self.slice_end() },
            _ => return Err(token.unexpected()),
        };
        self.expect(']')?;
        Ok(expr)
    }

    fn slice_end(&mut self) -> Option<i64> {
        match self.peek().map(|t| &t.kind) {
            Some(Kind::Number(n)) => {
                let n = *n;
                self.pos += 1;
                Some(n)
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Evaluation

/// A value with the chain of values it was found in (`jsonpath_rw`'s `DatumInContext`).
#[derive(Debug)]
struct Datum<'a> {
    value: Node<'a>,
    context: Option<Rc<Datum<'a>>>,
}

/// A value of the document, or one made during evaluation (a slice's list of one, a character of a string).
#[derive(Debug, Clone)]
enum Node<'a> {
    Borrowed(&'a Value),
    Owned(Rc<Value>),
}

impl Node<'_> {
    fn get(&self) -> &Value {
        match self {
            Node::Borrowed(v) => v,
            Node::Owned(v) => v,
        }
    }
}

#[derive(Clone, Copy)]
enum Step<'k> {
    Key(&'k str),
    Index(usize),
}

fn pick<'v>(value: &'v Value, step: Step<'_>) -> Option<&'v Value> {
    match step {
        Step::Key(key) => value.as_object().and_then(|m| m.get(key)),
        Step::Index(i) => value.as_array().and_then(|a| a.get(i)),
    }
}

fn child<'a>(parent: &Rc<Datum<'a>>, step: Step<'_>) -> Option<Rc<Datum<'a>>> {
    let value = match &parent.value {
        Node::Borrowed(v) => Node::Borrowed(pick(v, step)?),
        Node::Owned(v) => Node::Owned(Rc::new(pick(v, step)?.clone())),
    };
    Some(Rc::new(Datum { value, context: Some(Rc::clone(parent)) }))
}

fn push<'a>(out: &mut Vec<Rc<Datum<'a>>>, datum: Rc<Datum<'a>>, budget: &mut usize) -> Result<(), PathError> {
    *budget = budget.checked_sub(1).ok_or(PathError::TooManyMatches)?;
    out.push(datum);
    Ok(())
}

fn find<'a>(
    expr: &Expr,
    datum: &Rc<Datum<'a>>,
    out: &mut Vec<Rc<Datum<'a>>>,
    budget: &mut usize,
) -> Result<(), PathError> {
    match expr {
        Expr::Root => {
            let mut top = datum;
            while let Some(up) = &top.context {
                top = up;
            }
            push(out, Rc::new(Datum { value: top.value.clone(), context: None }), budget)
        }
        Expr::This => push(out, Rc::clone(datum), budget),
        Expr::Parent => {
            // jsonpath_rw yields None for the root's parent; it then matches nothing below it.
            let parent = match &datum.context {
                Some(parent) => Rc::clone(parent),
                None => Rc::new(Datum { value: Node::Owned(Rc::new(Value::Null)), context: None }),
            };
            push(out, parent, budget)
        }
        Expr::Fields(names) => {
            let Some(map) = datum.value.get().as_object() else { return Ok(()) };
            if names.iter().any(|n| n == "*") {
                for key in map.keys() {
                    if let Some(found) = child(datum, Step::Key(key)) {
                        push(out, found, budget)?;
                    }
                }
            } else {
                for name in names {
                    if let Some(found) = child(datum, Step::Key(name)) {
                        push(out, found, budget)?;
                    }
                }
            }
            Ok(())
        }
        Expr::Index(index) => find_index(*index, datum, out, budget),
        Expr::Slice { start, end } => find_slice(*start, *end, datum, out, budget),
        Expr::Chain(steps) => {
            let mut current = vec![Rc::clone(datum)];
            for step in steps {
                let mut next = Vec::new();
                for d in &current {
                    find(step, d, &mut next, budget)?;
                }
                current = next;
            }
            out.extend(current);
            Ok(())
        }
        Expr::Descendants(left, right) => {
            let mut tops = Vec::new();
            find(left, datum, &mut tops, budget)?;
            for top in &tops {
                descend(right, top, out, budget)?;
            }
            Ok(())
        }
        Expr::Where(left, right) => {
            let mut candidates = Vec::new();
            find(left, datum, &mut candidates, budget)?;
            for candidate in candidates {
                let mut probe = Vec::new();
                find(right, &candidate, &mut probe, budget)?;
                if !probe.is_empty() {
                    out.push(candidate);
                }
            }
            Ok(())
        }
        Expr::Union(left, right) => {
            find(left, datum, out, budget)?;
            find(right, datum, out, budget)
        }
        Expr::Intersect(..) => Err(PathError::Intersection),
    }
}

/// `right` applied to `datum` and then to every value below it, depth first.
fn descend<'a>(
    right: &Expr,
    datum: &Rc<Datum<'a>>,
    out: &mut Vec<Rc<Datum<'a>>>,
    budget: &mut usize,
) -> Result<(), PathError> {
    find(right, datum, out, budget)?;
    match datum.value.get() {
        Value::Array(items) => {
            for i in 0..items.len() {
                if let Some(below) = child(datum, Step::Index(i)) {
                    descend(right, &below, out, budget)?;
                }
            }
        }
        Value::Object(map) => {
            for key in map.keys() {
                if let Some(below) = child(datum, Step::Key(key)) {
                    descend(right, &below, out, budget)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// `[n]`: nothing for a falsy value or a short one; Python's indexing otherwise (negative counts from the end).
fn find_index<'a>(
    index: i64,
    datum: &Rc<Datum<'a>>,
    out: &mut Vec<Rc<Datum<'a>>>,
    budget: &mut usize,
) -> Result<(), PathError> {
    let value = datum.value.get();
    if !truthy(value) {
        return Ok(());
    }
    let len = match value {
        Value::Array(items) => items.len(),
        Value::String(s) => s.chars().count(),
        Value::Object(map) => map.len(),
        other => return Err(PathError::Lookup(format!("object of type '{}' has no len()", type_name(other)))),
    };
    let len = i64::try_from(len).unwrap_or(i64::MAX);
    if len <= index {
        return Ok(());
    }
    let position = if index < 0 { index + len } else { index };
    let position = usize::try_from(position).ok();
    match value {
        Value::Array(_) => match position.and_then(|p| child(datum, Step::Index(p))) {
            Some(found) => push(out, found, budget),
            None => Err(PathError::Lookup("list index out of range".to_owned())),
        },
        Value::String(s) => match position.and_then(|p| s.chars().nth(p)) {
            Some(c) => {
                let value = Node::Owned(Rc::new(Value::String(c.to_string())));
                push(out, Rc::new(Datum { value, context: Some(Rc::clone(datum)) }), budget)
            }
            None => Err(PathError::Lookup("string index out of range".to_owned())),
        },
        _ => Err(PathError::Lookup(format!("KeyError: {index}"))),
    }
}

/// `[*]` and `[a:b]`: the items of a list; a dict, an int or a string is taken as a list of one.
fn find_slice<'a>(
    start: Option<i64>,
    end: Option<i64>,
    datum: &Rc<Datum<'a>>,
    out: &mut Vec<Rc<Datum<'a>>>,
    budget: &mut usize,
) -> Result<(), PathError> {
    let value = datum.value.get();
    let as_list_of_one = match value {
        Value::Object(_) | Value::Bool(_) | Value::String(_) => true,
        Value::Number(n) => !n.is_f64(),
        _ => false,
    };
    if as_list_of_one {
        let wrapped = Value::Array(vec![value.clone()]);
        let wrapper = Rc::new(Datum { value: Node::Owned(Rc::new(wrapped)), context: datum.context.clone() });
        return find_slice(start, end, &wrapper, out, budget);
    }
    let Value::Array(items) = value else {
        return Err(PathError::Lookup(format!("object of type '{}' has no len()", type_name(value))));
    };
    let len = i64::try_from(items.len()).unwrap_or(i64::MAX);
    let bound = |x: Option<i64>, default: i64| match x {
        None => default,
        Some(v) if v < 0 => (v.saturating_add(len)).max(0),
        Some(v) => v.min(len),
    };
    let (from, to) = (bound(start, 0), bound(end, len));
    for i in from..to {
        if let Some(found) = usize::try_from(i).ok().and_then(|i| child(datum, Step::Index(i))) {
            push(out, found, budget)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn find(path: &str, data: &Value) -> Vec<Value> {
        JsonPath::parse(path).unwrap().find(data).unwrap()
    }

    fn sample() -> Value {
        json!({
            "memory_mb": 1024,
            "inventory": {
                "cpu": {"count": 4},
                "interfaces": [
                    {"name": "eth0", "mac_address": "11:22:33:44:55:66", "ipv4_address": "192.0.2.1"},
                    {"name": "eth1", "mac_address": "66:55:44:33:22:11", "ipv4_address": null}
                ],
                "disks": [{"name": "/dev/sda", "size": 1000}, {"name": "/dev/sdb", "size": 2000}]
            },
            "odd.key": "x",
            "weird-name": 7
        })
    }

    #[test]
    fn plain_names_and_dots() {
        let data = sample();
        assert_eq!(find("memory_mb", &data), vec![json!(1024)]);
        assert_eq!(find("inventory.cpu.count", &data), vec![json!(4)]);
        assert_eq!(find("$.inventory.cpu.count", &data), vec![json!(4)]);
        assert_eq!(find("$", &data), vec![data.clone()]);
        assert_eq!(find("weird-name", &data), vec![json!(7)]);
        assert_eq!(find("'odd.key'", &data), vec![json!("x")]);
        assert_eq!(find("\"odd.key\"", &data), vec![json!("x")]);
        assert!(find("missing.field", &data).is_empty());
        assert!(find("memory_mb.deeper", &data).is_empty());
    }

    #[test]
    fn brackets_and_slices() {
        let data = sample();
        assert_eq!(
            find("inventory.interfaces[*].mac_address", &data),
            vec![json!("11:22:33:44:55:66"), json!("66:55:44:33:22:11")]
        );
        assert_eq!(find("inventory.disks[0].size", &data), vec![json!(1000)]);
        assert_eq!(find("inventory.disks[-1].size", &data), vec![json!(2000)]);
        assert_eq!(find("inventory.disks[1:].name", &data), vec![json!("/dev/sdb")]);
        assert_eq!(find("inventory.disks[:1].name", &data), vec![json!("/dev/sda")]);
        assert!(find("inventory.disks[5].size", &data).is_empty());
        // A name never matches inside a list.
        assert!(find("inventory.interfaces.mac_address", &data).is_empty());
        // A slice of a dict is a list of one.
        assert_eq!(find("inventory.cpu[*].count", &data), vec![json!(4)]);
        assert_eq!(find("inventory['cpu'].count", &data), vec![json!(4)]);
    }

    #[test]
    fn operators() {
        let data = sample();
        assert_eq!(find("inventory..size", &data), vec![json!(1000), json!(2000)]);
        assert_eq!(find("(memory_mb)|(inventory.cpu.count)", &data), vec![json!(1024), json!(4)]);
        // '|' binds tighter than '.': this is (memory_mb|inventory).cpu.count.
        assert_eq!(find("memory_mb|inventory.cpu.count", &data), vec![json!(4)]);
        assert_eq!(find("inventory.cpu.*", &data), vec![json!(4)]);
        assert_eq!(find("inventory.disks[*] where size", &data).len(), 2);
        assert_eq!(
            find("inventory.interfaces[*].ipv4_address.`parent`.name", &data),
            vec![json!("eth0"), json!("eth1")]
        );
        assert_eq!(find("inventory.cpu.`this`.count", &data), vec![json!(4)]);
        assert_eq!(find("inventory.cpu.$.memory_mb", &data), vec![json!(1024)]);
        assert_eq!(find("(memory_mb)", &data), vec![json!(1024)]);
        assert_eq!(find("memory_mb,weird-name", &data), vec![json!(1024), json!(7)]);
    }

    #[test]
    fn precedence_matches_jsonpath_rw() {
        // '|' binds tighter than '.': a.b|c is a.(b|c).
        let data = json!({"a": {"b": 1, "c": 2}, "c": 3});
        assert_eq!(find("a.b|c", &data), vec![json!(1), json!(2)]);
        assert_eq!(find("(a.b)|c", &data), vec![json!(1), json!(3)]);
    }

    #[test]
    fn lookups_that_raise_in_python_are_errors() {
        let data = json!({"d": {"a": 1}, "n": 5, "z": null, "e": [], "l": [1]});
        assert!(JsonPath::parse("d[0]").unwrap().find(&data).is_err());
        assert!(JsonPath::parse("n[0]").unwrap().find(&data).is_err());
        assert!(JsonPath::parse("z[*]").unwrap().find(&data).is_err());
        assert!(JsonPath::parse("l[-5]").unwrap().find(&data).is_err());
        assert!(JsonPath::parse("a & b").unwrap().find(&data).is_err());
        // Falsy values just match nothing.
        assert!(find("z[0]", &data).is_empty());
        assert!(find("e[0]", &data).is_empty());
    }

    #[test]
    fn invalid_paths() {
        for bad in ["!*!", "", "a.", "disks.0", "a..", "[", "a[0", "'open", "`nope`", "a b", "a,*", "x[1:2:3]"] {
            assert!(JsonPath::parse(bad).is_err(), "{bad:?} should not parse");
        }
        assert_eq!(JsonPath::parse("!*!").unwrap_err().to_string(), "Error on line 1, col 0: Unexpected character: ! ");
        assert_eq!(JsonPath::parse("a b").unwrap_err().to_string(), "Parse error at 1:2 near token b (ID)");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let deep = format!("{}a{}", "(".repeat(10_000), ")".repeat(10_000));
        assert_eq!(JsonPath::parse(&deep), Err(PathError::TooDeep));
        let wide = vec!["a"; 10_000].join("..");
        assert_eq!(JsonPath::parse(&wide), Err(PathError::TooDeep));
        let long = vec!["a"; 10_000].join(".");
        assert!(JsonPath::parse(&long).is_ok());
    }

    #[test]
    fn explosive_paths_are_cut_off() {
        let data = json!([[[[1, 2, 3], [4, 5, 6]], [[7, 8, 9]]], [[[1]]], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]);
        let path = JsonPath::parse(&["$"; 8].join("..")).unwrap();
        assert_eq!(path.find(&data), Err(PathError::TooManyMatches));
    }
}
