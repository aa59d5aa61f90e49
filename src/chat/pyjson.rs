//! The `tojson` filter as HF registers it: Python's `json.dumps` with HF's defaults.
//!
//! HF overrides jinja2's own `tojson` (which HTML-escapes and sorts keys) with
//!
//! ```python
//! def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
//!     return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
//!                       separators=separators, sort_keys=sort_keys)
//! ```
//!
//! so the default output is `{"a": 1, "b": [1, 2]}`: `", "` and `": "` separators, keys in
//! insertion order, non-ASCII characters kept, floats in Python's `repr`. Tool schemas and
//! tool-call arguments go through this filter, so its bytes end up in the prompt and must match.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

use super::pyrepr::{MAX_DEPTH, depth_error, float_repr};

/// The arguments of Python's `json.dumps` that HF's filter passes on.
#[derive(Debug, Clone)]
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: everything on one line; `Some(s)`: one item per line, `s` per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".to_string(),
            key_separator: ": ".to_string(),
            sort_keys: false,
        }
    }
}

fn type_error(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {what} is not JSON serializable"),
    )
}

/// Python's `json` string encoder (`ensure_ascii` picks `py_encode_basestring_ascii`).
fn write_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A finite float as `repr`, non-finite ones as Python's `json` spells them (`allow_nan=True`).
fn write_float(f: f64, out: &mut String) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&float_repr(f));
    }
}

fn write_number(value: &Value, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) => write_float(f, out),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        }
    }
}

/// A dict key as `json.dumps` converts it: str as is, numbers, bools and None to their JSON
/// spelling, anything else refused.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(key, &mut s);
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

/// Sorts `(key, value)` entries the way Python's `sorted(dct.items())` does: str keys by code
/// point, numeric keys by value; mixing the two is a `TypeError` in Python and an error here.
fn sort_entries(entries: &mut [(Value, Value)]) -> Result<(), Error> {
    let all_str = entries.iter().all(|(k, _)| k.kind() == ValueKind::String);
    let all_num = entries
        .iter()
        .all(|(k, _)| matches!(k.kind(), ValueKind::Number | ValueKind::Bool));
    if all_str {
        entries.sort_by(|a, b| a.0.as_str().cmp(&b.0.as_str()));
        Ok(())
    } else if all_num {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            "'<' not supported between the key types of this dict (sort_keys)",
        ))
    }
}

fn newline_indent(opts: &DumpOptions, level: usize, out: &mut String) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn write_value(
    value: &Value,
    opts: &DumpOptions,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    if level > MAX_DEPTH {
        return Err(depth_error());
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(value, out),
        ValueKind::String => write_str(value.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline_indent(opts, level + 1, out);
                write_value(item, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                sort_entries(&mut entries)?;
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline_indent(opts, level + 1, out);
                write_str(&key_string(key)?, opts.ensure_ascii, out);
                out.push_str(&opts.key_separator);
                write_value(item, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push('}');
        }
        ValueKind::Undefined => return Err(type_error("Undefined")),
        ValueKind::Bytes => return Err(type_error("bytes")),
        kind => return Err(type_error(kind)),
    }
    Ok(())
}

/// `json.dumps(value, ...)`.
pub(crate) fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(value, opts, 0, &mut out)?;
    Ok(out)
}

/// Python's `indent` argument: an int is that many spaces (none below 1, but still one item
/// per line), a string is used as is, `None` keeps everything on one line.
fn indent_arg(value: &Value) -> Result<Option<String>, Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => Ok(None),
        ValueKind::String => Ok(Some(value.as_str().unwrap_or_default().to_string())),
        ValueKind::Number if value.is_integer() => {
            let n = value.as_i64().unwrap_or(0).clamp(0, 64) as usize;
            Ok(Some(" ".repeat(n)))
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: indent must be an int, a string or none",
        )),
    }
}

/// Python's `separators` argument: a pair `(item_separator, key_separator)`.
fn separators_arg(value: &Value) -> Result<Option<(String, String)>, Error> {
    if value.is_none() || value.is_undefined() {
        return Ok(None);
    }
    let bad = || {
        Error::new(
            ErrorKind::InvalidOperation,
            "tojson: separators must be a pair of strings",
        )
    };
    if value.kind() != ValueKind::Seq {
        return Err(bad());
    }
    let parts: Vec<Value> = value.try_iter()?.collect();
    match parts.as_slice() {
        [item, key] => match (item.as_str(), key.as_str()) {
            (Some(item), Some(key)) => Ok(Some((item.to_string(), key.to_string()))),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// `tojson`'s parameters after the value, in Python's order.
const PARAMS: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];

/// Takes a parameter given either positionally or by keyword, as Python would bind it.
fn bind(positional: Option<Value>, kwargs: &Kwargs, name: &str) -> Result<Option<Value>, Error> {
    let keyword: Option<Value> = kwargs.get(name)?;
    match (positional, keyword) {
        (Some(_), Some(_)) => Err(Error::new(
            ErrorKind::TooManyArguments,
            format!("tojson got multiple values for argument '{name}'"),
        )),
        (p, k) => Ok(p.or(k)),
    }
}

/// The `tojson` filter: `value | tojson(ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, positional arguments in Python's order.
pub(crate) fn tojson_filter(
    state: &State,
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    if args.len() > PARAMS.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            format!("tojson takes at most {} arguments", PARAMS.len()),
        ));
    }
    let mut bound = [None, None, None, None];
    for (i, slot) in bound.iter_mut().enumerate() {
        *slot = bind(args.get(i).cloned(), &kwargs, PARAMS[i])?;
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = bound;

    let mut opts = DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..DumpOptions::default()
    };
    if let Some(indent) = indent {
        opts.indent = indent_arg(&indent)?;
    }
    if opts.indent.is_some() {
        // json.dumps: with an indent and no explicit separators the item separator loses its
        // trailing space.
        opts.item_separator = ",".to_string();
    }
    if let Some(seps) = separators
        && let Some((item, key)) = separators_arg(&seps)?
    {
        opts.item_separator = item;
        opts.key_separator = key;
    }
    let out = dumps(value, &opts)?;
    // The engine charges one unit per 64 bytes of results; pay for this one the same way.
    state.consume_fuel((out.len() / 64) as u64)?;
    Ok(Value::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(v: &Value) -> String {
        dumps(v, &DumpOptions::default()).unwrap()
    }

    #[test]
    fn default_matches_python_json_dumps() {
        let v = Value::from_pairs([
            ("z", Value::from(1)),
            (
                "a",
                Value::from(vec![Value::from(1.0), Value::from(()), Value::from(false)]),
            ),
            ("s", Value::from("é \"q\" \\ \n \u{1}")),
            ("e", Value::from(Vec::<Value>::new())),
        ]);
        // json.dumps({"z": 1, "a": [1.0, None, False], "s": "é \"q\" \\ \n \x01", "e": []})
        assert_eq!(
            dump(&v),
            r#"{"z": 1, "a": [1.0, null, false], "s": "é \"q\" \\ \n \u0001", "e": []}"#
        );
    }

    #[test]
    fn ensure_ascii_escapes_like_python() {
        let opts = DumpOptions {
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        // json.dumps("é😀\x7f", ensure_ascii=True)
        assert_eq!(
            dumps(&Value::from("é😀\u{7f}"), &opts).unwrap(),
            r#""\u00e9\ud83d\ude00\u007f""#
        );
    }

    #[test]
    fn non_finite_floats() {
        assert_eq!(dump(&Value::from(f64::NAN)), "NaN");
        assert_eq!(dump(&Value::from(f64::NEG_INFINITY)), "-Infinity");
        assert_eq!(dump(&Value::from(1e-7)), "1e-07");
    }

    #[test]
    fn undefined_is_refused() {
        assert!(dumps(&Value::UNDEFINED, &DumpOptions::default()).is_err());
    }
}
