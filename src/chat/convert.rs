//! JSON data (messages, tools, extra variables) to template values.
//!
//! Object keys keep their order (serde_json and MiniJinja are both built with
//! `preserve_order`), as Python dicts do, so `tools | tojson` prints a schema's keys in the
//! order the caller wrote them.

use minijinja::Value;
use serde_json::Value as Json;

use super::error::TemplateError;
use super::pyrepr::MAX_DEPTH;

fn convert(v: &Json, depth: usize) -> Result<Value, TemplateError> {
    if depth > MAX_DEPTH {
        return Err(TemplateError::bad_input(format!(
            "JSON value nested deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(
            items
                .iter()
                .map(|item| convert(item, depth + 1))
                .collect::<Result<Vec<Value>, _>>()?,
        ),
        Json::Object(map) => {
            let mut pairs = Vec::with_capacity(map.len());
            for (k, item) in map {
                pairs.push((Value::from(k.as_str()), convert(item, depth + 1)?));
            }
            Value::from_pairs(pairs)
        }
    })
}

/// Converts a JSON value; refuses nesting deeper than the renderer will walk.
pub(crate) fn json_to_value(v: &Json) -> Result<Value, TemplateError> {
    convert(v, 0)
}
