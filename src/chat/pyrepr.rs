//! Python's `str()` / `repr()` of template values.
//!
//! HF renders chat templates with Python's jinja2, so `{{ x }}` prints what Python's `str(x)`
//! prints: `None`, `True`, `1e+16`, `['a', 'b']`, `{'k': 1}`. MiniJinja's own display differs
//! (`none`, `true`, `["a", "b"]`), so the environment's formatter goes through this module.

use std::fmt::Write as _;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// Containers nested deeper than this are refused instead of recursing further.
pub(crate) const MAX_DEPTH: usize = 256;

/// Marks an error raised because data nested deeper than [`MAX_DEPTH`].
#[derive(Debug)]
pub(crate) struct DepthExceeded;

impl std::fmt::Display for DepthExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "data nested deeper than {MAX_DEPTH} levels")
    }
}

impl std::error::Error for DepthExceeded {}

pub(crate) fn depth_error() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("value nested deeper than {MAX_DEPTH} levels"),
    )
    .with_source(DepthExceeded)
}

/// Python's `repr(float)` (which is also `str(float)` and what `json.dumps` prints for finite
/// floats): the shortest digits that round-trip, positional when the decimal exponent is in
/// (-4, 16], scientific with a signed two-digit-minimum exponent otherwise.
pub(crate) fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    // Rust's `{:e}` prints the shortest round-trip digits as `d.ddde[-]N`. When two strings
    // of that length round-trip, Python (David Gay's dtoa) takes the one nearest the exact
    // value, ties to even; the correctly rounded string of the same length is that one
    // whenever it round-trips.
    let shortest = format!("{:e}", x.abs());
    let ndigits = shortest
        .split_once('e')
        .map_or(1, |(m, _)| m.chars().filter(char::is_ascii_digit).count());
    let nearest = format!("{:.*e}", ndigits.saturating_sub(1), x.abs());
    let sci = if nearest.parse::<f64>() == Ok(x.abs()) {
        nearest
    } else {
        shortest
    };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let ndigits = digits.len() as i32;
    // Python's `decpt`: value = 0.DIGITS * 10^decpt.
    let decpt = exp + 1;
    let mut out = String::from(sign);
    if decpt <= -4 || decpt > 16 {
        let (first, rest) = digits.split_at(digits.len().min(1));
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let esign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{esign}{:02}", exp.unsigned_abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-decpt) as usize));
        out.push_str(&digits);
    } else if decpt >= ndigits {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (decpt - ndigits) as usize));
        out.push_str(".0");
    } else {
        let (int, frac) = digits.split_at((decpt as usize).min(digits.len()));
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// Whether Python's `str.isprintable()` would call this non-ASCII character printable.
///
/// An approximation of the Unicode tables Python uses: C1 controls, the format characters and
/// separators that turn up in practice, surrogates and private use are not printable.
fn is_printable_non_ascii(c: char) -> bool {
    !matches!(c as u32,
        0x80..=0xA0
        | 0xAD
        | 0x0600..=0x0605
        | 0x061C
        | 0x06DD
        | 0x070F
        | 0x1680
        | 0x180E
        | 0x2000..=0x200F
        | 0x2028..=0x202F
        | 0x205F..=0x2064
        | 0x2066..=0x206F
        | 0x3000
        | 0xD800..=0xF8FF
        | 0xFEFF
        | 0xFFF9..=0xFFFB
        | 0xFFFE..=0xFFFF
        | 0xE0001
        | 0xE0020..=0xE007F
        | 0xF0000..=0x10FFFF)
}

/// Python's `repr(str)`.
pub(crate) fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_ascii() || is_printable_non_ascii(c) => out.push(c),
            c => {
                let n = c as u32;
                let _ = if n <= 0xff {
                    write!(out, "\\x{n:02x}")
                } else if n <= 0xffff {
                    write!(out, "\\u{n:04x}")
                } else {
                    write!(out, "\\U{n:08x}")
                };
            }
        }
    }
    out.push(quote);
}

/// Writes a number the way Python prints it.
fn number(value: &Value, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&float_repr(f)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        }
    }
}

/// Python's `repr()` of a value, as used for the items of a printed list or dict.
fn repr_into(value: &Value, out: &mut String, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(depth_error());
    }
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => number(value, out),
        ValueKind::String => str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr_into(&item, out, depth + 1)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr_into(&key, out, depth + 1)?;
                out.push_str(": ");
                repr_into(&value.get_item(&key)?, out, depth + 1)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// Python's `str()` of a value: what jinja2 prints for `{{ value }}` (undefined prints nothing).
pub(crate) fn py_str(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::String => {
            out.push_str(value.as_str().unwrap_or_default());
            Ok(())
        }
        _ => repr_into(value, out, 0),
    }
}

/// The `pprint` filter: Python's `repr` of the value.
///
/// jinja2's `pprint` is `pprint.pformat`, which also wraps values wider than 80 columns over
/// several lines; that wrapping is not reproduced. MiniJinja's own `pprint` is replaced because
/// its indentation makes the output quadratic in the nesting depth.
pub(crate) fn pprint_filter(value: &Value) -> Result<String, Error> {
    let mut out = String::new();
    repr_into(value, &mut out, 0)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (123.456, "123.456"),
            (1e100, "1e+100"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            // Two 17-digit strings round-trip; Python takes the nearer, ties to even.
            // (the value is -1626731369897237.25 exactly)
            (f64::from_bits(0xc317_1e03_a5ca_7455), "-1626731369897237.2"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x:e}");
        }
    }

    #[test]
    fn strings_repr_like_python() {
        let cases = [
            ("abc", "'abc'"),
            ("it's", "\"it's\""),
            ("both ' and \"", "'both \\' and \"'"),
            ("tab\tnl\n\\", "'tab\\tnl\\n\\\\'"),
            ("\u{1}\u{7f}", "'\\x01\\x7f'"),
            ("héllo 世界", "'héllo 世界'"),
            ("\u{a0}\u{2028}", "'\\xa0\\u2028'"),
        ];
        for (s, want) in cases {
            let mut out = String::new();
            str_repr(s, &mut out);
            assert_eq!(out, want);
        }
    }

    #[test]
    fn containers_print_like_python_str() {
        let v = Value::from_pairs([
            ("a", Value::from(vec![Value::from(1), Value::from(2.5)])),
            ("b", Value::from(())),
            ("c", Value::from(true)),
            ("d", Value::from("x'y")),
        ]);
        let mut out = String::new();
        py_str(&v, &mut out).unwrap();
        assert_eq!(out, "{'a': [1, 2.5], 'b': None, 'c': True, 'd': \"x'y\"}");
    }
}
