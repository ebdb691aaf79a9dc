//! The few Python value semantics that ironic-inspector's rules depend on, over JSON values: `str()`, `repr()`,
//! truthiness, `==`, ordering, `int()` and `float()`.
//!
//! JSON maps onto Python as `json.loads` does: `null` is `None`, integers are `int`, numbers with a fraction or an
//! exponent are `float`, and `bool` is a subclass of `int` (so `true == 1`).

use std::cmp::Ordering;

use serde_json::Value;

/// A Python number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    /// The number a JSON value is in Python, if it is one (`bool` included).
    pub(super) fn of(value: &Value) -> Option<Num> {
        match value {
            Value::Bool(b) => Some(Num::Int(i128::from(*b))),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Some(Num::Int(i.into()))
                } else if let Some(u) = n.as_u64() {
                    Some(Num::Int(u.into()))
                } else {
                    n.as_f64().map(Num::Float)
                }
            }
            _ => None,
        }
    }

    /// Python's numeric comparison: exact between `int` and `float`; `None` when a NaN is involved.
    pub(super) fn compare(self, other: Num) -> Option<Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(&b)),
            (Num::Float(a), Num::Float(b)) => a.partial_cmp(&b),
            (Num::Int(a), Num::Float(b)) => int_vs_float(a, b),
            (Num::Float(a), Num::Int(b)) => int_vs_float(b, a).map(Ordering::reverse),
        }
    }
}

/// Compares an integer with a float exactly, as Python does (no rounding of the integer to a float).
fn int_vs_float(int: i128, float: f64) -> Option<Ordering> {
    // 2^127: every finite float at or beyond it is outside i128.
    const LIMIT: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    if float.is_nan() {
        return None;
    }
    if float >= LIMIT {
        return Some(Ordering::Less);
    }
    if float < -LIMIT {
        return Some(Ordering::Greater);
    }
    let floor = float.floor();
    // In range and integral, so the conversion is exact.
    let whole = floor as i128;
    match int.cmp(&whole) {
        Ordering::Equal if float > floor => Some(Ordering::Less),
        order => Some(order),
    }
}

/// Python's name for a JSON value's type, as error messages show it.
pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's `bool(value)`.
pub(super) fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

/// Python's `a == b`.
pub(super) fn equal(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (Num::of(a), Num::of(b)) {
        return x.compare(y) == Some(Ordering::Equal);
    }
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| equal(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => false,
    }
}

/// Python's ordering of `a` and `b` (as `<`, `<=`, `>` and `>=` see it): `Ok(None)` when unordered (NaN), an error
/// (Python's `TypeError`) when the types cannot be ordered. `symbol` is the operator, for the message.
pub(super) fn order(a: &Value, b: &Value, symbol: &str) -> Result<Option<Ordering>, String> {
    if let (Some(x), Some(y)) = (Num::of(a), Num::of(b)) {
        return Ok(x.compare(y));
    }
    match (a, b) {
        (Value::String(x), Value::String(y)) => Ok(Some(x.cmp(y))),
        (Value::Array(x), Value::Array(y)) => {
            // The first pair of items that differ decides; otherwise the shorter list is the smaller.
            match x.iter().zip(y).find(|(p, q)| !equal(p, q)) {
                Some((p, q)) => order(p, q, symbol),
                None => Ok(Some(x.len().cmp(&y.len()))),
            }
        }
        _ => Err(format!("'{symbol}' not supported between instances of '{}' and '{}'", type_name(a), type_name(b))),
    }
}

/// Python's `int(value)`.
pub(super) fn to_int(value: &Value) -> Result<i128, String> {
    match value {
        Value::Bool(b) => Ok(i128::from(*b)),
        Value::Number(_) => match Num::of(value) {
            Some(Num::Int(i)) => Ok(i),
            Some(Num::Float(f)) => float_to_int(f),
            None => Err("not a number".to_owned()),
        },
        Value::String(s) => {
            parse_int(s).ok_or_else(|| format!("invalid literal for int() with base 10: {}", repr_str(s)))
        }
        other => Err(format!(
            "int() argument must be a string, a bytes-like object or a real number, not '{}'",
            type_name(other)
        )),
    }
}

fn float_to_int(f: f64) -> Result<i128, String> {
    const LIMIT: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0;
    if f.is_nan() {
        Err("cannot convert float NaN to integer".to_owned())
    } else if f.is_infinite() {
        Err("cannot convert float infinity to integer".to_owned())
    } else if f.trunc().abs() >= LIMIT {
        Err(format!("the integer part of {} is too large", float_repr(f)))
    } else {
        // Finite and within range: truncation toward zero is Python's int().
        Ok(f.trunc() as i128)
    }
}

/// Python's `float(value)`.
pub(super) fn to_float(value: &Value) -> Result<f64, String> {
    match value {
        Value::Bool(b) => Ok(if *b { 1.0 } else { 0.0 }),
        Value::Number(_) => match Num::of(value) {
            // Python rounds an int to the nearest float the same way.
            Some(Num::Int(i)) => Ok(i as f64),
            Some(Num::Float(f)) => Ok(f),
            None => Err("not a number".to_owned()),
        },
        Value::String(s) => parse_float(s).ok_or_else(|| format!("could not convert string to float: {}", repr_str(s))),
        other => Err(format!("float() argument must be a string or a real number, not '{}'", type_name(other))),
    }
}

/// Digits with single underscores between them, as Python's numeric literals in strings allow.
fn without_underscores(digits: &str) -> Option<String> {
    let bytes = digits.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'_' {
            let before = i.checked_sub(1).and_then(|j| bytes.get(j));
            let after = bytes.get(i + 1);
            if !before.is_some_and(u8::is_ascii_digit) || !after.is_some_and(u8::is_ascii_digit) {
                return None;
            }
        }
    }
    Some(digits.replace('_', ""))
}

/// Python's `int(str)` in base 10 (ASCII digits only).
fn parse_int(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return None;
    }
    let magnitude: i128 = without_underscores(digits)?.parse().ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// Python's `float(str)`.
fn parse_float(text: &str) -> Option<f64> {
    let text = text.trim();
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let lower = unsigned.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return text.parse().ok();
    }
    // Rust accepts the same decimal forms as Python ("1.", ".5", "1e5"); only the underscores differ.
    if !unsigned.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'e' | b'E' | b'+' | b'-')) {
        return None;
    }
    without_underscores(text)?.parse().ok()
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed notation for exponents -4..16.
pub(super) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let (negative, digits, exponent) = shortest_digits(f);
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        format!("{sign}{}", fixed_from_digits(&digits, exponent, 1))
    } else {
        format!("{sign}{}", scientific_from_digits(&digits, exponent))
    }
}

/// The shortest round-trip decimal digits of `f` (without a sign) and the decimal exponent of the first digit.
pub(super) fn shortest_digits(f: f64) -> (bool, String, i32) {
    split_scientific(&format!("{:e}", f.abs()), f.is_sign_negative())
}

/// Splits Rust's `{:e}` output ("1.25e-7") into its digits ("125") and exponent (-7).
pub(super) fn split_scientific(text: &str, negative: bool) -> (bool, String, i32) {
    let (mantissa, exponent) = text.split_once('e').unwrap_or((text, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    (negative, digits, exponent.parse().unwrap_or(0))
}

/// `digits` (first digit at 10^exponent) in fixed notation with at least `min_fraction` fraction digits.
pub(super) fn fixed_from_digits(digits: &str, exponent: i32, min_fraction: usize) -> String {
    let (int_part, mut fraction) = if exponent < 0 {
        let zeros = usize::try_from(-exponent - 1).unwrap_or(0);
        ("0".to_owned(), format!("{}{digits}", "0".repeat(zeros)))
    } else {
        let int_len = usize::try_from(exponent).unwrap_or(0) + 1;
        if digits.len() <= int_len {
            (format!("{digits}{}", "0".repeat(int_len - digits.len())), String::new())
        } else {
            let (i, f) = digits.split_at(int_len);
            (i.to_owned(), f.to_owned())
        }
    };
    while fraction.len() < min_fraction {
        fraction.push('0');
    }
    if fraction.is_empty() { int_part } else { format!("{int_part}.{fraction}") }
}

/// `digits` (first digit at 10^exponent) as Python writes a float in scientific notation: "1.5e-07", "1e+16".
pub(super) fn scientific_from_digits(digits: &str, exponent: i32) -> String {
    let (first, rest) = digits.split_at(digits.len().min(1));
    let mantissa = if rest.is_empty() { first.to_owned() } else { format!("{first}.{rest}") };
    format!("{mantissa}e{}", exponent_suffix(exponent))
}

/// Python's exponent: a sign and at least two digits.
pub(super) fn exponent_suffix(exponent: i32) -> String {
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{sign}{:02}", exponent.unsigned_abs())
}

/// Python's `str(value)`.
pub(super) fn str(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => repr(other),
    }
}

/// Python's `repr(value)`.
pub(super) fn repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(value, &mut out, false);
    out
}

/// Python's `ascii(value)`: `repr` with every non-ASCII character escaped.
pub(super) fn ascii(value: &Value) -> String {
    let mut out = String::new();
    write_repr(value, &mut out, true);
    out
}

/// Python's `repr(str)`.
pub(super) fn repr_str(s: &str) -> String {
    let mut out = String::new();
    write_str_repr(s, &mut out, false);
    out
}

fn write_repr(value: &Value, out: &mut String, ascii_only: bool) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => match Num::of(value) {
            Some(Num::Float(f)) => out.push_str(&float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_str_repr(s, out, ascii_only),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(item, out, ascii_only);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str_repr(key, out, ascii_only);
                out.push_str(": ");
                write_repr(item, out, ascii_only);
            }
            out.push('}');
        }
    }
}

fn write_str_repr(s: &str, out: &mut String, ascii_only: bool) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii() && (c.is_ascii_control()) => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c if !c.is_ascii() && (ascii_only || !printable(c)) => {
                let code = u32::from(c);
                if code <= 0xff {
                    out.push_str(&format!("\\x{code:02x}"));
                } else if code <= 0xffff {
                    out.push_str(&format!("\\u{code:04x}"));
                } else {
                    out.push_str(&format!("\\U{code:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An approximation of Python's `str.isprintable` for non-ASCII characters: controls, separators other than
/// the space and the common format characters are not printable.
fn printable(c: char) -> bool {
    !(c.is_control()
        || c.is_whitespace()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn str_and_repr_follow_python() {
        assert_eq!(str(&json!(null)), "None");
        assert_eq!(str(&json!(true)), "True");
        assert_eq!(str(&json!(42)), "42");
        assert_eq!(str(&json!(4.0)), "4.0");
        assert_eq!(str(&json!(1e16)), "1e+16");
        assert_eq!(str(&json!(1.5e-7)), "1.5e-07");
        assert_eq!(str(&json!(0.0001)), "0.0001");
        assert_eq!(str(&json!(123_456.789)), "123456.789");
        assert_eq!(str(&json!("it's")), "it's");
        assert_eq!(repr(&json!("it's")), "\"it's\"");
        assert_eq!(repr(&json!("a\nb")), "'a\\nb'");
        assert_eq!(str(&json!([1, "a", null, {"k": false}])), "[1, 'a', None, {'k': False}]");
        assert_eq!(ascii(&json!("é")), "'\\xe9'");
        assert_eq!(repr(&json!("é")), "'é'");
    }

    #[test]
    fn numbers_compare_exactly_across_int_and_float() {
        assert_eq!(Num::Int(1).compare(Num::Float(1.0)), Some(Ordering::Equal));
        assert_eq!(Num::Int(1).compare(Num::Float(1.5)), Some(Ordering::Less));
        assert_eq!(Num::Float(-1.5).compare(Num::Int(-1)), Some(Ordering::Less));
        assert_eq!(
            Num::Int(9_007_199_254_740_993).compare(Num::Float(9_007_199_254_740_992.0)),
            Some(Ordering::Greater)
        );
        assert_eq!(Num::Int(1).compare(Num::Float(f64::NAN)), None);
        assert!(equal(&json!(true), &json!(1)));
        assert!(equal(&json!([1, {"a": 2.0}]), &json!([1.0, {"a": 2}])));
        assert!(!equal(&json!("1"), &json!(1)));
    }

    #[test]
    fn ordering_follows_python() {
        assert_eq!(order(&json!("a"), &json!("b"), "<"), Ok(Some(Ordering::Less)));
        assert_eq!(order(&json!([1, 2]), &json!([1, 3]), "<"), Ok(Some(Ordering::Less)));
        assert_eq!(order(&json!([1, 2]), &json!([1]), "<"), Ok(Some(Ordering::Greater)));
        assert_eq!(
            order(&json!("a"), &json!(1), "<"),
            Err("'<' not supported between instances of 'str' and 'int'".to_owned())
        );
    }

    #[test]
    fn int_and_float_conversions_follow_python() {
        assert_eq!(to_int(&json!("42")), Ok(42));
        assert_eq!(to_int(&json!(" -1_000 ")), Ok(-1000));
        assert_eq!(to_int(&json!(4.7)), Ok(4));
        assert_eq!(to_int(&json!(true)), Ok(1));
        assert_eq!(to_int(&json!("4.2")), Err("invalid literal for int() with base 10: '4.2'".to_owned()));
        assert!(to_int(&json!(null)).is_err());
        assert_eq!(to_float(&json!("4.2")), Ok(4.2));
        assert_eq!(to_float(&json!("1_0.5")), Ok(10.5));
        assert_eq!(to_float(&json!(42)), Ok(42.0));
        assert!(to_float(&json!("Infinity")).is_ok_and(f64::is_infinite));
        assert_eq!(to_float(&json!("abc")), Err("could not convert string to float: 'abc'".to_owned()));
        assert!(to_float(&json!("1__0")).is_err());
        assert!(to_float(&json!([])).is_err());
    }
}
