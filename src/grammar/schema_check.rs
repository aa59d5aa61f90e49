//! JSON schemas checked keyword by keyword before compiling, so that a schema the engine
//! cannot enforce is refused with the place and the name of what is wrong, never silently
//! loosened: llguidance ignores keywords it does not know, and its own errors do not say
//! where they are.
//!
//! Rules:
//! * every keyword is either enforced ([`ENFORCED`]), an annotation that constrains nothing
//!   ([`ANNOTATIONS`]), or refused — known JSON-schema keywords that cannot be enforced
//!   ([`NOT_ENFORCED`]) by name, anything else as unknown;
//! * keyword values have the types the specification gives them, bounds are ordered;
//! * what only the compiler finds (an invalid `pattern`, an unsatisfiable combination) is
//!   placed by [`locate`]: the deepest sub-schema that fails to compile on its own.

use serde_json::{Map, Value as Json};

use super::error::GrammarError;
use crate::chat::message::kind_of as kind;
use super::spec::compile_schema;
use super::vocab::GrammarVocab;

/// Keywords the engine enforces.
const ENFORCED: &[&str] = &[
    "type", "properties", "additionalProperties", "patternProperties", "required", "minProperties", "maxProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf",
    "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
    "pattern", "format",
];

/// Keywords that describe and constrain nothing (and `$defs`, which holds sub-schemas).
const ANNOTATIONS: &[&str] = &[
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly",
    "$defs", "definitions", "x-guidance",
];

/// JSON-schema keywords that the engine cannot enforce: refused by name.
const NOT_ENFORCED: &[&str] = &[
    "not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "dependentRequired",
    "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "$anchor",
    "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "$vocabulary", "contentEncoding",
    "contentMediaType", "contentSchema",
];

/// String formats the engine enforces.
pub const FORMATS: &[&str] = &["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"];

const TYPES: &[&str] = &["null", "boolean", "object", "array", "number", "integer", "string"];

fn err(path: &str, message: impl Into<String>) -> GrammarError {
    GrammarError::Schema { path: path.to_string(), message: message.into() }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

/// Checks `schema` (the root); the error names the first problem found and its place.
/// Draft 4's tuple form read as 2020-12's, as llama-server reads it: `items: [A, B]` is
/// `prefixItems: [A, B]`, and its `additionalItems` (the items after them) is then `items`.
/// Everywhere in the schema; other keys unchanged.
pub fn upgrade_tuples(schema: &Json) -> Json {
    match schema {
        Json::Object(m) => {
            let tuple = matches!(m.get("items"), Some(Json::Array(_))) && !m.contains_key("prefixItems");
            let mut out = serde_json::Map::with_capacity(m.len());
            for (k, v) in m {
                let key = match k.as_str() {
                    "items" if tuple => "prefixItems",
                    "additionalItems" if tuple => "items",
                    other => other,
                };
                out.insert(key.to_string(), upgrade_tuples(v));
            }
            Json::Object(out)
        }
        Json::Array(a) => Json::Array(a.iter().map(upgrade_tuples).collect()),
        other => other.clone(),
    }
}

pub fn check(schema: &Json) -> Result<(), GrammarError> {
    if schema == &Json::Bool(false) {
        return Err(err("", "the schema `false` accepts no value"));
    }
    node(schema, "")
}

fn node(v: &Json, path: &str) -> Result<(), GrammarError> {
    let m = match v {
        Json::Bool(_) => return Ok(()),
        Json::Object(m) => m,
        other => return Err(err(path, format!("a schema must be an object or a boolean, got {}", kind(other)))),
    };
    for (key, value) in m {
        let at = join(path, key);
        if NOT_ENFORCED.contains(&key.as_str()) {
            return Err(err(&at, format!("the keyword '{key}' cannot be enforced by this server")));
        }
        if !ENFORCED.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
            return Err(err(&at, format!("unknown keyword '{key}' (it would constrain nothing, so it is refused)")));
        }
        if key == "x-guidance" && !path.is_empty() {
            return Err(err(&at, "is only allowed at the schema's root"));
        }
        keyword(key, value, &at)?;
    }
    bounds(m, path)
}

fn schema_map(v: &Json, at: &str) -> Result<(), GrammarError> {
    let Json::Object(m) = v else { return Err(err(at, format!("must be an object of schemas, got {}", kind(v)))) };
    m.iter().try_for_each(|(k, s)| node(s, &join(at, k)))
}

fn schema_list(v: &Json, at: &str) -> Result<(), GrammarError> {
    match v {
        Json::Array(items) if !items.is_empty() => items.iter().enumerate().try_for_each(|(i, s)| node(s, &format!("{at}[{i}]"))),
        _ => Err(err(at, format!("must be a non-empty array of schemas, got {}", kind(v)))),
    }
}

fn keyword(key: &str, v: &Json, at: &str) -> Result<(), GrammarError> {
    match key {
        "type" => {
            let names: Vec<&Json> = match v {
                Json::Array(a) if !a.is_empty() => a.iter().collect(),
                Json::String(_) => vec![v],
                _ => return Err(err(at, format!("must be a type name or a non-empty array of them, got {}", kind(v)))),
            };
            for n in names {
                match n.as_str() {
                    Some(t) if TYPES.contains(&t) => {}
                    Some(t) => return Err(err(at, format!("unknown type '{t}' (expected one of {})", TYPES.join(", ")))),
                    None => return Err(err(at, format!("type names must be strings, got {}", kind(n)))),
                }
            }
            Ok(())
        }
        "properties" | "patternProperties" | "$defs" | "definitions" => schema_map(v, at),
        "additionalProperties" | "additionalItems" => node(v, at),
        // The old tuple form is read as `prefixItems` by `upgrade_tuples` before the check.
        "items" => match v {
            Json::Array(_) => Err(err(at, "an array of schemas is the old tuple form: use 'prefixItems'")),
            _ => node(v, at),
        },
        "prefixItems" | "anyOf" | "oneOf" | "allOf" => schema_list(v, at),
        "required" => match v {
            Json::Array(a) if a.iter().all(Json::is_string) => Ok(()),
            _ => Err(err(at, "must be an array of property names")),
        },
        "enum" => match v {
            Json::Array(a) if !a.is_empty() => Ok(()),
            _ => Err(err(at, "must be a non-empty array")),
        },
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => match v {
            Json::Number(_) => Ok(()),
            _ => Err(err(at, format!("must be a number, got {}", kind(v)))),
        },
        "multipleOf" => match v.as_f64() {
            Some(x) if x > 0.0 => Ok(()),
            _ => Err(err(at, "must be a number greater than 0")),
        },
        "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" => match v.as_u64() {
            Some(_) => Ok(()),
            None => Err(err(at, format!("must be a non-negative integer, got {v}"))),
        },
        "pattern" | "$ref" | "$schema" | "$id" | "$comment" => match v {
            Json::String(_) => Ok(()),
            _ => Err(err(at, format!("must be a string, got {}", kind(v)))),
        },
        "format" => match v.as_str() {
            Some(f) if FORMATS.contains(&f) => Ok(()),
            Some(f) => Err(err(at, format!("the format '{f}' cannot be enforced (supported: {})", FORMATS.join(", ")))),
            None => Err(err(at, format!("must be a string, got {}", kind(v)))),
        },
        "x-guidance" => {
            let Json::Object(opts) = v else { return Err(err(at, format!("must be an object, got {}", kind(v)))) };
            match opts.keys().find(|k| !X_GUIDANCE.contains(&k.as_str())) {
                Some(k) => Err(err(&join(at, k), format!("only the output's white space can be set here ({}): '{k}' would change what is enforced", X_GUIDANCE.join(", ")))),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// The `x-guidance` options a schema may set: how JSON is written, not what is accepted.
const X_GUIDANCE: &[&str] = &["whitespace_flexible", "whitespace_pattern", "item_separator", "key_separator"];

/// Lower bounds above their upper bounds, reported at the lower bound.
fn bounds(m: &Map<String, Json>, path: &str) -> Result<(), GrammarError> {
    let num = |k: &str| m.get(k).and_then(Json::as_f64);
    for (lo, hi) in [("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"), ("minimum", "maximum")] {
        if let (Some(a), Some(b)) = (num(lo), num(hi))
            && a > b
        {
            return Err(err(&join(path, lo), format!("{lo} ({a}) is greater than {hi} ({b}): no value fits")));
        }
    }
    for (lo, hi) in [("exclusiveMinimum", "maximum"), ("minimum", "exclusiveMaximum"), ("exclusiveMinimum", "exclusiveMaximum")] {
        if let (Some(a), Some(b)) = (num(lo), num(hi))
            && a >= b
        {
            return Err(err(&join(path, lo), format!("{lo} ({a}) is not below {hi} ({b}): no value fits")));
        }
    }
    if let (Some(Json::Array(req)), Some(Json::Object(props)), Some(Json::Bool(false))) =
        (m.get("required"), m.get("properties"), m.get("additionalProperties"))
        && let Some(missing) = req.iter().filter_map(Json::as_str).find(|r| !props.contains_key(*r))
    {
        return Err(err(&join(path, "required"), format!("'{missing}' is required but not among the properties, and no other property is allowed")));
    }
    Ok(())
}

/// Most sub-schemas [`locate`] compiles: each costs up to the size of the schema, so a large
/// deep schema is searched only this far (the error is then placed at the deepest failing
/// sub-schema found so far).
const LOCATE_BUDGET: usize = 64;

/// Places an error the compiler found in a schema that passed [`check`]: the deepest
/// sub-schema that fails to compile on its own (with the root's `$defs` beside it, so that
/// references resolve), with its own message; the root when none does.
pub fn locate(vocab: &GrammarVocab, root: &Json, message: String) -> GrammarError {
    let defs: Map<String, Json> = match root {
        Json::Object(m) => m.iter().filter(|(k, _)| *k == "$defs" || *k == "definitions").map(|(k, v)| (k.clone(), v.clone())).collect(),
        _ => Map::new(),
    };
    let fails = |s: &Json| -> Option<String> {
        let mut s = s.clone();
        if let Json::Object(m) = &mut s {
            for (k, v) in &defs {
                m.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        compile_schema(vocab, &s).err()
    };
    let mut path = String::new();
    let mut msg = message;
    let mut at = root;
    let mut budget = LOCATE_BUDGET;
    'down: loop {
        for (key, child) in children(at) {
            if budget == 0 {
                break;
            }
            budget -= 1;
            if let Some(m) = fails(child) {
                path = join(&path, &key);
                msg = m;
                at = child;
                continue 'down;
            }
        }
        return err(&path, msg);
    }
}

/// The sub-schemas of `v` with their relative paths (`$defs` included).
fn children(v: &Json) -> Vec<(String, &Json)> {
    let Json::Object(m) = v else { return Vec::new() };
    let mut out = Vec::new();
    for (k, val) in m {
        match (k.as_str(), val) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Json::Object(sub)) => {
                out.extend(sub.iter().map(|(name, s)| (format!("{k}.{name}"), s)));
            }
            ("prefixItems" | "anyOf" | "oneOf" | "allOf", Json::Array(items)) => {
                out.extend(items.iter().enumerate().map(|(i, s)| (format!("{k}[{i}]"), s)));
            }
            ("items" | "additionalProperties" | "additionalItems", s @ Json::Object(_)) => out.push((k.clone(), s)),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuple_items_become_prefix_items() {
        let s = serde_json::json!({"type": "array", "items": [{"type": "integer"}], "additionalItems": false,
                                   "properties": {"p": {"items": [{"const": 1}]}}, "anyOf": [{"items": {"type": "string"}}]});
        let u = upgrade_tuples(&s);
        assert_eq!(u, serde_json::json!({"type": "array", "prefixItems": [{"type": "integer"}], "items": false,
                                          "properties": {"p": {"prefixItems": [{"const": 1}]}}, "anyOf": [{"items": {"type": "string"}}]}));
        assert!(check(&u).is_ok());
        assert!(check(&s).is_err(), "the check itself still names the old form");
    }
}
