//! Python's `str.format(data=…)`, which ironic-inspector applies to the `value` of `set-attribute`,
//! `set-capability` and `extend-attribute` (recursively inside lists and dicts, keys included).
//!
//! Supported: `{{`/`}}`, `{data}`, `{data[key][0]}` (an all-digit key is an integer index), the conversions `!s`,
//! `!r`, `!a`, and the format-spec mini-language `[[fill]align][sign][z][#][0][width][,|_][.precision][type]` for
//! strings, ints and floats. Not supported (an error): nested fields inside a format spec (`{data[a]:{data[w]}}`),
//! attribute access (`{data.keys}`), positional fields (`{0}`, `{}`), the `n` type's locale, widths and
//! precisions over 10 000.

use serde_json::{Map, Value};

use super::python::{self, Num};

/// Largest width or precision accepted in a format spec (Python has none; we will not allocate gigabytes).
const MAX_WIDTH: usize = 10_000;

/// Why a string could not be formatted; messages follow Python's exceptions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A key that is not in the data, or a name other than `data` (Python's `KeyError`, shown as the key's repr).
    #[error("invalid formatting variable key {0}")]
    MissingKey(String),
    /// An index past the end of a list or a string, or a positional field (Python's `IndexError`).
    #[error("{0}")]
    Index(String),
    /// A lookup or a format spec the value's type does not support (Python's `TypeError`/`AttributeError`).
    #[error("{0}")]
    Type(String),
    /// A malformed format string or format spec (Python's `ValueError`).
    #[error("{0}")]
    Syntax(String),
    /// Something Python accepts that this implementation does not.
    #[error("{0} is not supported")]
    Unsupported(String),
}

/// A string of `value` that could not be formatted, and why.
#[derive(Debug)]
pub(super) struct FormatFailure {
    /// The string being formatted.
    pub template: String,
    /// Why it failed.
    pub error: FormatError,
}

/// Formats every string inside `value` (dict keys included) with `data`; other values are kept as they are.
pub(super) fn format_value(value: &Value, data: &Value) -> Result<Value, FormatFailure> {
    let format = |template: &str| {
        format_str(template, data).map_err(|error| FormatFailure { template: template.to_owned(), error })
    };
    Ok(match value {
        Value::String(s) => Value::String(format(s)?),
        Value::Array(items) => Value::Array(items.iter().map(|v| format_value(v, data)).collect::<Result<_, _>>()?),
        Value::Object(map) => {
            let mut formatted = Map::new();
            for (key, item) in map {
                formatted.insert(format(key)?, format_value(item, data)?);
            }
            Value::Object(formatted)
        }
        other => other.clone(),
    })
}

/// Python's `template.format(data=data)`.
pub(super) fn format_str(template: &str, data: &Value) -> Result<String, FormatError> {
    let chars: Vec<char> = template.chars().collect();
    let mut out = String::new();
    let mut pos = 0;
    while let Some(&c) = chars.get(pos) {
        pos += 1;
        match c {
            '{' if chars.get(pos) == Some(&'{') => {
                out.push('{');
                pos += 1;
            }
            '}' if chars.get(pos) == Some(&'}') => {
                out.push('}');
                pos += 1;
            }
            '}' => return Err(FormatError::Syntax("Single '}' encountered in format string".to_owned())),
            '{' => {
                let (field, next) = split_field(&chars, pos)?;
                pos = next;
                out.push_str(&render(&field, data)?);
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// One replacement field: `{name!conversion:spec}`.
struct Field {
    name: String,
    conversion: Option<char>,
    spec: String,
}

/// Reads a replacement field starting after its `{`; returns it and the position after its `}`.
fn split_field(chars: &[char], mut pos: usize) -> Result<(Field, usize), FormatError> {
    let unclosed = || FormatError::Syntax("expected '}' before end of string".to_owned());
    let mut name = String::new();
    // The name runs to '!', ':' or '}'; inside [...] those characters belong to the key.
    loop {
        let c = *chars.get(pos).ok_or_else(unclosed)?;
        match c {
            '!' | ':' | '}' => break,
            '{' => return Err(FormatError::Syntax("unexpected '{' in field name".to_owned())),
            '[' => {
                name.push(c);
                pos += 1;
                while let Some(&k) = chars.get(pos) {
                    name.push(k);
                    pos += 1;
                    if k == ']' {
                        break;
                    }
                }
                continue;
            }
            _ => name.push(c),
        }
        pos += 1;
    }
    let mut conversion = None;
    if chars.get(pos) == Some(&'!') {
        let c = *chars.get(pos + 1).ok_or_else(unclosed)?;
        conversion = Some(c);
        pos += 2;
        if !matches!(chars.get(pos), Some(':' | '}')) {
            return Err(FormatError::Syntax("expected ':' after conversion specifier".to_owned()));
        }
    }
    let mut spec = String::new();
    if chars.get(pos) == Some(&':') {
        pos += 1;
        loop {
            let c = *chars.get(pos).ok_or_else(unclosed)?;
            match c {
                '}' => break,
                '{' => return Err(FormatError::Unsupported("a nested replacement field in a format spec".to_owned())),
                c => spec.push(c),
            }
            pos += 1;
        }
    }
    // chars[pos] is the closing '}'.
    Ok((Field { name, conversion, spec }, pos + 1))
}

/// A value during rendering: part of the data, or the string a conversion made.
enum Object<'a> {
    Data(&'a Value),
    Text(String),
}

fn render(field: &Field, data: &Value) -> Result<String, FormatError> {
    let found = lookup(&field.name, data)?;
    let object = match field.conversion {
        None => Object::Data(found),
        Some('s') => Object::Text(python::str(found)),
        Some('r') => Object::Text(python::repr(found)),
        Some('a') => Object::Text(python::ascii(found)),
        Some(other) => return Err(FormatError::Syntax(format!("Unknown conversion specifier {other}"))),
    };
    if field.spec.is_empty() {
        return Ok(match object {
            Object::Data(value) => python::str(value),
            Object::Text(text) => text,
        });
    }
    let spec = Spec::parse(&field.spec)?;
    match object {
        Object::Text(text) => spec.format_str(&text),
        Object::Data(Value::String(s)) => spec.format_str(s),
        Object::Data(value) => match Num::of(value) {
            Some(Num::Int(i)) => spec.format_int(i),
            Some(Num::Float(f)) => spec.format_float(f),
            None => Err(FormatError::Type(format!(
                "unsupported format string passed to {}.__format__",
                python::type_name(value)
            ))),
        },
    }
}

/// Resolves a field name such as `data[inventory][interfaces][0]`.
fn lookup<'a>(name: &str, data: &'a Value) -> Result<&'a Value, FormatError> {
    let first_end = name.find(['.', '[']).unwrap_or(name.len());
    let (first, mut rest) = name.split_at(first_end);
    if first.is_empty() || first.bytes().all(|b| b.is_ascii_digit()) {
        let index = if first.is_empty() { "0" } else { first };
        return Err(FormatError::Index(format!("Replacement index {index} out of range for positional args tuple")));
    }
    if first != "data" {
        return Err(FormatError::MissingKey(python::repr_str(first)));
    }
    let mut current = data;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let attribute = after.get(..end).unwrap_or_default();
            if attribute.is_empty() {
                return Err(FormatError::Syntax("Empty attribute in format string".to_owned()));
            }
            return Err(FormatError::Type(format!(
                "'{}' object has no attribute {} (attribute access)",
                python::type_name(current),
                python::repr_str(attribute)
            )));
        }
        let Some(after) = rest.strip_prefix('[') else {
            return Err(FormatError::Syntax("Only '.' or '[' may follow ']' in format field specifier".to_owned()));
        };
        let Some(close) = after.find(']') else {
            return Err(FormatError::Syntax("Missing ']' in format string".to_owned()));
        };
        let key = after.get(..close).unwrap_or_default();
        if key.is_empty() {
            return Err(FormatError::Syntax("Empty attribute in format string".to_owned()));
        }
        current = item(current, key)?;
        rest = after.get(close + 1..).unwrap_or_default();
        if !rest.is_empty() && !rest.starts_with(['.', '[']) {
            return Err(FormatError::Syntax("Only '.' or '[' may follow ']' in format field specifier".to_owned()));
        }
    }
    Ok(current)
}

/// Python's `value[key]`, with `key` an int when it is all digits.
fn item<'a>(value: &'a Value, key: &str) -> Result<&'a Value, FormatError> {
    let index =
        if key.bytes().all(|b| b.is_ascii_digit()) { Some(key.parse::<usize>().unwrap_or(usize::MAX)) } else { None };
    match (value, index) {
        (Value::Object(map), None) => map.get(key).ok_or_else(|| FormatError::MissingKey(python::repr_str(key))),
        (Value::Object(_), Some(_)) => Err(FormatError::MissingKey(key.to_owned())),
        (Value::Array(items), Some(i)) => {
            items.get(i).ok_or_else(|| FormatError::Index("list index out of range".to_owned()))
        }
        (Value::Array(_), None) => {
            Err(FormatError::Type("list indices must be integers or slices, not str".to_owned()))
        }
        (Value::String(_), Some(_)) => Err(FormatError::Unsupported("indexing a string in a format field".to_owned())),
        (Value::String(_), None) => Err(FormatError::Type("string indices must be integers, not 'str'".to_owned())),
        (other, _) => Err(FormatError::Type(format!("'{}' object is not subscriptable", python::type_name(other)))),
    }
}

/// A parsed format spec: `[[fill]align][sign][z][#][0][width][grouping][.precision][type]`.
#[derive(Debug, Default)]
struct Spec {
    fill: Option<char>,
    align: Option<char>,
    sign: Option<char>,
    no_negative_zero: bool,
    alternate: bool,
    zero: bool,
    width: usize,
    grouping: Option<char>,
    precision: Option<usize>,
    kind: Option<char>,
}

impl Spec {
    fn parse(text: &str) -> Result<Spec, FormatError> {
        let chars: Vec<char> = text.chars().collect();
        let mut spec = Spec::default();
        let mut pos = 0;
        let is_align = |c: Option<&char>| matches!(c, Some('<' | '>' | '=' | '^'));
        if is_align(chars.get(1)) {
            spec.fill = chars.first().copied();
            spec.align = chars.get(1).copied();
            pos = 2;
        } else if is_align(chars.first()) {
            spec.align = chars.first().copied();
            pos = 1;
        }
        if let Some(&c @ ('+' | '-' | ' ')) = chars.get(pos) {
            spec.sign = Some(c);
            pos += 1;
        }
        if chars.get(pos) == Some(&'z') {
            spec.no_negative_zero = true;
            pos += 1;
        }
        if chars.get(pos) == Some(&'#') {
            spec.alternate = true;
            pos += 1;
        }
        if chars.get(pos) == Some(&'0') {
            spec.zero = true;
            pos += 1;
        }
        spec.width = number(&chars, &mut pos)?.unwrap_or(0);
        if let Some(&c @ (',' | '_')) = chars.get(pos) {
            spec.grouping = Some(c);
            pos += 1;
        }
        if chars.get(pos) == Some(&'.') {
            pos += 1;
            spec.precision = Some(
                number(&chars, &mut pos)?
                    .ok_or_else(|| FormatError::Syntax("Format specifier missing precision".to_owned()))?,
            );
        }
        if let Some(&c) = chars.get(pos) {
            spec.kind = Some(c);
            pos += 1;
        }
        if pos < chars.len() {
            return Err(FormatError::Syntax("Invalid format specifier".to_owned()));
        }
        Ok(spec)
    }

    fn format_str(&self, text: &str) -> Result<String, FormatError> {
        if let Some(kind) = self.kind.filter(|k| *k != 's') {
            return Err(FormatError::Syntax(format!("Unknown format code '{kind}' for object of type 'str'")));
        }
        if self.sign.is_some() {
            return Err(FormatError::Syntax("Sign not allowed in string format specifier".to_owned()));
        }
        if self.alternate {
            return Err(FormatError::Syntax("Alternate form (#) not allowed in string format specifier".to_owned()));
        }
        if self.align == Some('=') {
            return Err(FormatError::Syntax("'=' alignment not allowed in string format specifier".to_owned()));
        }
        if let Some(g) = self.grouping {
            return Err(FormatError::Syntax(format!("Cannot specify '{g}' with 's'.")));
        }
        let text: String = match self.precision {
            Some(p) => text.chars().take(p).collect(),
            None => text.to_owned(),
        };
        let fill = self.fill.unwrap_or(if self.zero { '0' } else { ' ' });
        Ok(pad("", &text, self.width, fill, self.align.unwrap_or('<')))
    }

    fn format_int(&self, value: i128) -> Result<String, FormatError> {
        let kind = self.kind.unwrap_or('d');
        if matches!(kind, 'e' | 'E' | 'f' | 'F' | 'g' | 'G' | '%') {
            // Python formats an int with a float presentation type as the float it converts to.
            return self.format_float(value as f64);
        }
        if self.precision.is_some() {
            return Err(FormatError::Syntax("Precision not allowed in integer format specifier".to_owned()));
        }
        let magnitude = value.unsigned_abs();
        let (digits, prefix, group_size) = match kind {
            'd' | 'n' => (magnitude.to_string(), "", 3),
            'b' => (format!("{magnitude:b}"), "0b", 4),
            'o' => (format!("{magnitude:o}"), "0o", 4),
            'x' => (format!("{magnitude:x}"), "0x", 4),
            'X' => (format!("{magnitude:X}"), "0X", 4),
            'c' => {
                if self.sign.is_some() {
                    return Err(FormatError::Syntax("Sign not allowed with integer format specifier 'c'".to_owned()));
                }
                let c = u32::try_from(value)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| FormatError::Syntax("%c arg not in range(0x110000)".to_owned()))?;
                return Ok(pad("", &c.to_string(), self.width, self.fill.unwrap_or(' '), self.align.unwrap_or('<')));
            }
            other => {
                return Err(FormatError::Syntax(format!("Unknown format code '{other}' for object of type 'int'")));
            }
        };
        if self.grouping == Some(',') && kind != 'd' && self.kind.is_some() {
            return Err(FormatError::Syntax(format!("Cannot specify ',' with '{kind}'.")));
        }
        let prefix = if self.alternate { prefix } else { "" };
        let sign = self.sign_for(value < 0);
        Ok(self.finish(&format!("{sign}{prefix}"), &digits, "", group_size))
    }

    fn format_float(&self, value: f64) -> Result<String, FormatError> {
        let kind = self.kind;
        if let Some(k) = kind.filter(|k| !matches!(k, 'e' | 'E' | 'f' | 'F' | 'g' | 'G' | 'n' | '%')) {
            return Err(FormatError::Syntax(format!("Unknown format code '{k}' for object of type 'float'")));
        }
        if let Some(p) = self.precision.filter(|p| *p > MAX_WIDTH) {
            return Err(FormatError::Unsupported(format!("a precision of {p}")));
        }
        let upper = matches!(kind, Some('E' | 'F' | 'G'));
        let magnitude = value.abs();
        let mut negative = value.is_sign_negative() && !value.is_nan();
        let body = if value.is_nan() {
            "nan".to_owned()
        } else if value.is_infinite() {
            "inf".to_owned()
        } else {
            match kind {
                Some('f' | 'F') => fixed(magnitude, self.precision.unwrap_or(6), self.alternate),
                Some('%') => format!("{}%", fixed(magnitude * 100.0, self.precision.unwrap_or(6), self.alternate)),
                Some('e' | 'E') => scientific(magnitude, self.precision.unwrap_or(6), self.alternate),
                Some(_) => general(magnitude, self.precision.unwrap_or(6), self.alternate, false),
                None => match self.precision {
                    Some(p) => general(magnitude, p, self.alternate, true),
                    None => python::float_repr(magnitude),
                },
            }
        };
        if self.no_negative_zero && body.chars().all(|c| matches!(c, '0' | '.' | '%' | 'e' | '+' | '-')) {
            negative = false;
        }
        let body = if upper { body.to_uppercase() } else { body };
        let (int_part, rest) = match body.find(|c: char| !c.is_ascii_digit()) {
            Some(i) if body.starts_with(|c: char| c.is_ascii_digit()) => body.split_at(i),
            _ if body.starts_with(|c: char| c.is_ascii_digit()) => (body.as_str(), ""),
            _ => ("", body.as_str()),
        };
        let sign = self.sign_for(negative);
        Ok(self.finish(sign, int_part, rest, 3))
    }

    fn sign_for(&self, negative: bool) -> &'static str {
        match (negative, self.sign) {
            (true, _) => "-",
            (false, Some('+')) => "+",
            (false, Some(' ')) => " ",
            (false, _) => "",
        }
    }

    /// Groups the integer digits, then pads: `=` (or the `0` flag) pads between the sign and the digits.
    fn finish(&self, sign: &str, int_digits: &str, rest: &str, group_size: usize) -> String {
        let align = self.align.unwrap_or(if self.zero { '=' } else { '>' });
        let fill = self.fill.unwrap_or(if self.zero { '0' } else { ' ' });
        let group = |digits: &str| match self.grouping {
            Some(separator) => group_digits(digits, separator, group_size),
            None => digits.to_owned(),
        };
        let width = self.width.min(MAX_WIDTH);
        if align == '=' && fill == '0' && self.grouping.is_some() {
            // Python groups the zero padding too: format(1234, '010,') == '00,001,234'. Find the fewest digits
            // whose grouped form fills the width.
            let fixed = sign.chars().count() + rest.chars().count();
            let mut count = int_digits.chars().count();
            while fixed + count + count.saturating_sub(1) / group_size < width {
                count += 1;
            }
            let padded = format!("{}{int_digits}", "0".repeat(count - int_digits.chars().count()));
            return format!("{sign}{}{rest}", group(&padded));
        }
        let body = format!("{}{rest}", group(int_digits));
        pad(sign, &body, width, fill, align)
    }
}

/// Reads decimal digits at `pos`.
fn number(chars: &[char], pos: &mut usize) -> Result<Option<usize>, FormatError> {
    let start = *pos;
    while chars.get(*pos).is_some_and(char::is_ascii_digit) {
        *pos += 1;
    }
    if *pos == start {
        return Ok(None);
    }
    let digits: String = chars.get(start..*pos).unwrap_or_default().iter().collect();
    match digits.parse::<usize>() {
        Ok(n) if n <= MAX_WIDTH => Ok(Some(n)),
        _ => Err(FormatError::Unsupported(format!("a width or precision of {digits}"))),
    }
}

/// Inserts `separator` every `size` digits from the right.
fn group_digits(digits: &str, separator: char, size: usize) -> String {
    let count = digits.chars().count();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (count - i) % size == 0 {
            out.push(separator);
        }
        out.push(c);
    }
    out
}

/// Pads `sign` + `body` to `width` with `fill`, aligned by `align` (`=` puts the padding after the sign).
fn pad(sign: &str, body: &str, width: usize, fill: char, align: char) -> String {
    let len = sign.chars().count() + body.chars().count();
    let missing = width.min(MAX_WIDTH).saturating_sub(len);
    let filler = |n: usize| fill.to_string().repeat(n);
    match align {
        '<' => format!("{sign}{body}{}", filler(missing)),
        '^' => format!("{}{sign}{body}{}", filler(missing / 2), filler(missing - missing / 2)),
        '=' => format!("{sign}{}{body}", filler(missing)),
        _ => format!("{}{sign}{body}", filler(missing)),
    }
}

/// `f` with `precision` fraction digits, correctly rounded.
fn fixed(value: f64, precision: usize, alternate: bool) -> String {
    let text = format!("{value:.precision$}");
    if alternate && precision == 0 { format!("{text}.") } else { text }
}

/// `e` with `precision` mantissa fraction digits: "1.500000e+03".
fn scientific(value: f64, precision: usize, alternate: bool) -> String {
    let (_, digits, exponent) = python::split_scientific(&format!("{value:.precision$e}"), false);
    let (first, rest) = digits.split_at(digits.len().min(1));
    let point = if rest.is_empty() && !alternate { "" } else { "." };
    format!("{first}{point}{rest}e{}", python::exponent_suffix(exponent))
}

/// `g` (and the default type when a precision is given, `repr_like`): fixed or scientific by the exponent,
/// trailing zeros removed unless `alternate`.
fn general(value: f64, precision: usize, alternate: bool, repr_like: bool) -> String {
    let precision = precision.max(1);
    let (_, digits, exponent) = python::split_scientific(&format!("{:.*e}", precision - 1, value), false);
    let limit = i64::try_from(precision).unwrap_or(i64::MAX) - i64::from(repr_like);
    let exponent_wide = i64::from(exponent);
    let mut digits = digits;
    if !alternate {
        while digits.len() > 1 && digits.ends_with('0') {
            digits.pop();
        }
    }
    if (-4..limit).contains(&exponent_wide) {
        let min_fraction = if alternate {
            usize::try_from(i64::try_from(precision).unwrap_or(0) - 1 - exponent_wide).unwrap_or(0)
        } else {
            usize::from(repr_like)
        };
        python::fixed_from_digits(&digits, exponent, min_fraction)
    } else {
        python::scientific_from_digits(&digits, exponent)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn data() -> Value {
        json!({
            "inventory": {"bmc_address": "192.0.2.10", "interfaces": [{"name": "eth0"}], "cpu": {"count": 8}},
            "memory_mb": 16384,
            "ratio": 0.125,
            "flag": false,
            "none": null,
        })
    }

    fn fmt(template: &str) -> Result<String, FormatError> {
        format_str(template, &data())
    }

    #[test]
    fn keys_and_indices() {
        assert_eq!(fmt("{data[inventory][bmc_address]}").unwrap(), "192.0.2.10");
        assert_eq!(fmt("ip={data[inventory][bmc_address]}!").unwrap(), "ip=192.0.2.10!");
        assert_eq!(fmt("{data[inventory][interfaces][0][name]}").unwrap(), "eth0");
        assert_eq!(fmt("{data[memory_mb]}").unwrap(), "16384");
        assert_eq!(fmt("{data[flag]}").unwrap(), "False");
        assert_eq!(fmt("{data[none]}").unwrap(), "None");
        assert_eq!(fmt("{data[inventory][cpu]}").unwrap(), "{'count': 8}");
        assert_eq!(fmt("{{literal}} {data[ratio]}").unwrap(), "{literal} 0.125");
        assert_eq!(fmt("no fields").unwrap(), "no fields");
    }

    #[test]
    fn missing_keys_and_bad_templates_are_errors() {
        assert_eq!(fmt("{data[nope]}"), Err(FormatError::MissingKey("'nope'".to_owned())));
        assert_eq!(fmt("{data[inventory][nope]}"), Err(FormatError::MissingKey("'nope'".to_owned())));
        assert_eq!(fmt("{other}"), Err(FormatError::MissingKey("'other'".to_owned())));
        assert!(matches!(fmt("{data[inventory][interfaces][3]}"), Err(FormatError::Index(_))));
        assert!(matches!(fmt("{data[inventory][interfaces][x]}"), Err(FormatError::Type(_))));
        assert!(matches!(fmt("{data[memory_mb][x]}"), Err(FormatError::Type(_))));
        assert!(matches!(fmt("{0}"), Err(FormatError::Index(_))));
        assert!(matches!(fmt("{}"), Err(FormatError::Index(_))));
        assert!(matches!(fmt("{data"), Err(FormatError::Syntax(_))));
        assert!(matches!(fmt("a}b"), Err(FormatError::Syntax(_))));
        assert!(matches!(fmt("{data.keys}"), Err(FormatError::Type(_))));
        assert!(matches!(fmt("{data[memory_mb]!x}"), Err(FormatError::Syntax(_))));
    }

    #[test]
    fn conversions_and_specs() {
        assert_eq!(fmt("{data[inventory][bmc_address]!r}").unwrap(), "'192.0.2.10'");
        assert_eq!(fmt("{data[memory_mb]:>8}").unwrap(), "   16384");
        assert_eq!(fmt("{data[memory_mb]:08d}").unwrap(), "00016384");
        assert_eq!(fmt("{data[memory_mb]:,}").unwrap(), "16,384");
        assert_eq!(fmt("{data[memory_mb]:010,}").unwrap(), "00,016,384");
        assert_eq!(fmt("{data[memory_mb]:#x}").unwrap(), "0x4000");
        assert_eq!(fmt("{data[memory_mb]:+}").unwrap(), "+16384");
        assert_eq!(fmt("{data[memory_mb]:.1f}").unwrap(), "16384.0");
        assert_eq!(fmt("{data[ratio]:.2f}").unwrap(), "0.12");
        assert_eq!(fmt("{data[ratio]:.1%}").unwrap(), "12.5%");
        assert_eq!(fmt("{data[ratio]:e}").unwrap(), "1.250000e-01");
        assert_eq!(fmt("{data[ratio]:g}").unwrap(), "0.125");
        assert_eq!(fmt("{data[memory_mb]:.3g}").unwrap(), "1.64e+04");
        assert_eq!(fmt("{data[ratio]:10}").unwrap(), "     0.125");
        assert_eq!(fmt("{data[inventory][bmc_address]:*^14}").unwrap(), "**192.0.2.10**");
        assert_eq!(fmt("{data[inventory][bmc_address]:.3}").unwrap(), "192");
        assert_eq!(fmt("{data[flag]:d}").unwrap(), "0");
        assert_eq!(fmt("{data[flag]:>5}").unwrap(), "    0");
        assert!(matches!(fmt("{data[none]:>5}"), Err(FormatError::Type(_))));
        assert!(matches!(fmt("{data[memory_mb]:q}"), Err(FormatError::Syntax(_))));
        assert!(matches!(fmt("{data[memory_mb]:99999999}"), Err(FormatError::Unsupported(_))));
        assert!(matches!(fmt("{data[memory_mb]:{data[ratio]}}"), Err(FormatError::Unsupported(_))));
    }

    /// Expected outputs taken from CPython 3's `format(value, spec)`.
    #[test]
    fn float_specs_match_cpython() {
        for (value, spec, expected) in [
            (json!(1234.5), ".4", "1.234e+03"),
            (json!(123.0), ".4", "123.0"),
            (json!(0.5), ".3", "0.5"),
            (json!(1e10), ".4", "1e+10"),
            (json!(1e-5), ".3", "1e-05"),
            (json!(100.0), ".3", "1e+02"),
            (json!(1e16), "", "1e+16"),
            (json!(1234.5), ",.2f", "1,234.50"),
            (json!(-0.0001), "z.2f", "0.00"),
            (json!(-0.0001), ".2f", "-0.00"),
            (json!(2.5), ".0f", "2"),
            (json!(1e22), "f", "10000000000000000000000.000000"),
            (json!(123_456_789.0), "_", "123_456_789.0"),
            (json!(5), "%", "500.000000%"),
            (json!(1.0), "#.0e", "1.e+00"),
            (json!(0.0001), ".2", "0.0001"),
            (json!(12_345_678.9), ".10", "12345678.9"),
            (json!(1.0), ".3", "1.0"),
            (json!(10.0), "#.3g", "10.0"),
            (json!(-1.5), "+08.2f", "-0001.50"),
            (json!(1.5), "+.1E", "+1.5E+00"),
            (json!(1234), "08,", "0,001,234"),
            (json!(1234), "07,", "001,234"),
            (json!(-1234), "09_", "-0_001_234"),
            (json!(1234.5), "012,.1f", "00,001,234.5"),
            (json!(255), "#012_x", "0x0_0000_00ff"),
        ] {
            let data = json!({ "v": value });
            assert_eq!(format_str(&format!("{{data[v]:{spec}}}"), &data).unwrap(), expected, "{value} {spec}");
        }
    }

    #[test]
    fn values_are_formatted_recursively_keys_included() {
        let value = json!({"{data[inventory][cpu][count]}": ["basic", ["{data[inventory][bmc_address]}"], 3.5, true]});
        assert_eq!(format_value(&value, &data()).unwrap(), json!({"8": ["basic", ["192.0.2.10"], 3.5, true]}));
        let failure = format_value(&json!(["ok", ["{data[outer][nonexistent]}"]]), &data()).unwrap_err();
        assert_eq!(failure.template, "{data[outer][nonexistent]}");
        assert_eq!(failure.error, FormatError::MissingKey("'outer'".to_owned()));
    }
}
