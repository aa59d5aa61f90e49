//! Python methods on template values (`'x'.strip()`, `d.items()`, ...).
//!
//! MiniJinja's pycompat callback supplies them. Its `str.format` allocates whatever width a
//! format spec asks for before the engine can charge fuel for the result, so
//! `'{:>10000000000}'.format(x)` would abort the process on a failed 10 GB allocation; the
//! width and precision numbers of a format string are therefore paid for up front.

use minijinja::value::ValueKind;
use minijinja::{Error, State, Value};

/// Bytes a `str.format` call may be asked to pad to: the sum of the numbers that appear in
/// the format specs (`{:>40}`, `{0:.3f}`) of `format`.
fn requested_width(format: &str) -> u64 {
    let mut total: u64 = 0;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '{' {
            continue;
        }
        if chars.peek() == Some(&'{') {
            chars.next();
            continue;
        }
        // Inside a replacement field: numbers after the ':' are widths and precisions.
        let mut in_spec = false;
        let mut number: u64 = 0;
        for c in chars.by_ref() {
            match c {
                '}' => break,
                ':' if !in_spec => in_spec = true,
                d if in_spec && d.is_ascii_digit() => {
                    number = number
                        .saturating_mul(10)
                        .saturating_add(u64::from(d as u8 - b'0'));
                }
                _ => {
                    total = total.saturating_add(number);
                    number = 0;
                }
            }
        }
        total = total.saturating_add(number);
    }
    total
}

/// The unknown-method callback: pycompat, with `str.format` paid for before it allocates.
pub(crate) fn python_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if method == "format"
        && value.kind() == ValueKind::String
        && let Some(format) = value.as_str()
    {
        // One unit of fuel per 64 bytes, as the engine charges for results.
        state.consume_fuel(requested_width(format) / 64)?;
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::requested_width;

    #[test]
    fn widths_in_format_specs_are_summed() {
        assert_eq!(requested_width("{} and {0}"), 0);
        assert_eq!(requested_width("{:>40}|{1:.3f}|{{:999}}"), 43);
        assert_eq!(requested_width("{:>99999999999999999999999}"), u64::MAX);
    }
}
