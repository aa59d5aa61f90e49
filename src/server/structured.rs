//! Structured output in requests: OpenAI's `response_format` (`json_object`, `json_schema`),
//! llama-server's `json_schema` and `grammar` (GBNF), and forced tool calls (`tool_choice`
//! `"required"` or a named function, whose arguments follow the function's parameter schema).
//!
//! Everything is checked and compiled before the request reaches a slot: a schema or grammar
//! that cannot be enforced is a 400 whose `param` is the place (for a schema, the path inside
//! the request, `response_format.json_schema.schema.properties.age`).

use serde_json::{Map, Value as Json, json};

use super::error::ApiError;
use super::fields::{Fields, kind_of};
use crate::grammar::{Grammar, GrammarError, GrammarSpec, GrammarVocab};

/// A constraint a request asks for, and the request field it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Structured {
    pub spec: GrammarSpec,
    /// Where it came from (`response_format.json_schema.schema`, `grammar`, `tools`): errors
    /// are placed under it.
    pub field: String,
}

impl Structured {
    /// Checks and compiles against the model's vocabulary.
    pub fn compile(&self, vocab: &std::sync::Arc<GrammarVocab>) -> Result<Grammar, ApiError> {
        self.spec.compile(vocab).map_err(|e| placed(e, &self.field))
    }
}

/// A grammar error as a 400 naming its place.
fn placed(e: GrammarError, field: &str) -> ApiError {
    match e.under(field) {
        GrammarError::Schema { path, message } => ApiError::param(path, format!("is invalid: {message}")),
        GrammarError::Gbnf { line, column, message } => ApiError::param(field, format!("line {line}, column {column}: {message}")),
        other => ApiError::param(field, other.to_string()),
    }
}

/// `json_schema` and `grammar` (both endpoints, llama-server's fields).
pub fn llama_fields(f: &Fields) -> Result<Option<Structured>, ApiError> {
    let schema = f.get("json_schema").map(|s| match s {
        Json::Object(_) | Json::Bool(true) => Ok(Structured { spec: GrammarSpec::JsonSchema(s.clone()), field: "json_schema".into() }),
        v => Err(ApiError::param("json_schema", format!("must be a JSON schema (an object), got {}", kind_of(v)))),
    });
    // An empty grammar is no grammar, as in llama-server.
    let grammar = f.str("grammar")?.filter(|g| !g.trim().is_empty()).map(|g| Ok(Structured { spec: GrammarSpec::Gbnf(g.to_string()), field: "grammar".into() }));
    match (schema, grammar) {
        (Some(_), Some(_)) => Err(ApiError::param("grammar", "cannot be combined with 'json_schema': give one constraint")),
        (Some(s), None) | (None, Some(s)) => s.map(Some),
        (None, None) => Ok(None),
    }
}

/// Keys of `m` outside `known`, as a 400 at `at.key`.
fn only(m: &Map<String, Json>, known: &[&str], at: &str) -> Result<(), ApiError> {
    match m.iter().find(|(k, v)| !v.is_null() && !known.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::param(format!("{at}.{}", super::error::bounded(&k.escape_debug().to_string())), "is not a known field")),
        None => Ok(()),
    }
}

/// OpenAI's `response_format`: `text`, `json_object` (llama-server also takes a `schema`
/// beside it), or `json_schema` with `{name, schema, strict, description}`.
pub fn response_format(f: &Fields) -> Result<Option<Structured>, ApiError> {
    let Some(rf) = f.object("response_format")? else { return Ok(None) };
    let r = Fields::new(rf);
    let kind = r.str("type").map_err(|_| ApiError::param("response_format.type", "must be a string"))?;
    match kind {
        Some("text") => {
            only(rf, &["type"], "response_format")?;
            Ok(None)
        }
        Some("json_object") => {
            only(rf, &["type", "schema"], "response_format")?;
            Ok(Some(match r.get("schema") {
                None => Structured { spec: GrammarSpec::JsonObject, field: "response_format".into() },
                Some(s) => Structured { spec: GrammarSpec::JsonSchema(s.clone()), field: "response_format.schema".into() },
            }))
        }
        Some("json_schema") => {
            only(rf, &["type", "json_schema"], "response_format")?;
            let js = r.object("json_schema").map_err(|_| ApiError::param("response_format.json_schema", "must be an object"))?;
            let js = js.ok_or_else(|| ApiError::param("response_format.json_schema", "is required when the type is json_schema"))?;
            only(js, &["name", "schema", "strict", "description"], "response_format.json_schema")?;
            let j = Fields::new(js);
            let at = |k: &str| format!("response_format.json_schema.{k}");
            // OpenAI requires a name; llama-server does not, and its clients leave it out.
            let name = j.str("name").map_err(|_| ApiError::param(at("name"), "must be a string"))?.unwrap_or("response");
            if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(ApiError::param(at("name"), "must be 1 to 64 letters, digits, underscores or dashes"));
            }
            j.bool("strict").map_err(|_| ApiError::param(at("strict"), "must be a boolean"))?;
            j.str("description").map_err(|_| ApiError::param(at("description"), "must be a string"))?;
            // OpenAI's schema is optional (any JSON then); an object or `true` otherwise.
            let schema = match j.get("schema") {
                None => json!({}),
                Some(s @ (Json::Object(_) | Json::Bool(_))) => s.clone(),
                Some(v) => return Err(ApiError::param(at("schema"), format!("must be a JSON schema (an object), got {}", kind_of(v)))),
            };
            Ok(Some(Structured { spec: GrammarSpec::JsonSchema(schema), field: at("schema") }))
        }
        Some(other) => Err(ApiError::param("response_format.type", format!("must be text, json_object or json_schema, got '{}'", super::error::bounded(other)))),
        None => Err(ApiError::param("response_format.type", "is required")),
    }
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    /// At least one tool call.
    Required,
    /// A call of this function.
    Named(String),
}

pub fn tool_choice(f: &Fields) -> Result<ToolChoice, ApiError> {
    let what = "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
    match f.get("tool_choice") {
        None => Ok(ToolChoice::Auto),
        Some(Json::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(ApiError::param("tool_choice", what)),
        },
        Some(Json::Object(o)) => match (o.get("type").and_then(Json::as_str), o.get("function").and_then(|f| f.get("name")).and_then(Json::as_str)) {
            (Some("function"), Some(name)) => Ok(ToolChoice::Named(name.to_string())),
            _ => Err(ApiError::param("tool_choice", what)),
        },
        Some(_) => Err(ApiError::param("tool_choice", what)),
    }
}

/// The grammar of tool calls in the Hermes format Qwen's templates teach
/// (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, see `tools.rs`):
///
/// * `required`: one or more calls of any offered function, from the first token;
/// * a named function: one call of it, from the first token;
/// * `auto` when some function is `strict`: the answer is free until it writes `<tool_call>`,
///   then one or more calls follow (OpenAI's strict function calling); the strict functions'
///   arguments follow their schemas, the others' are any JSON object.
///
/// Without these, nothing is constrained. The arguments of a forced call follow each
/// function's `parameters` schema.
pub fn tool_calls(tools: &Json, choice: &ToolChoice) -> Result<Option<Structured>, ApiError> {
    let Json::Array(list) = tools else { return Ok(None) };
    for (i, t) in list.iter().enumerate() {
        if t.pointer("/function/strict").is_some_and(|v| !v.is_boolean() && !v.is_null()) {
            return Err(ApiError::param(format!("tools[{i}].function.strict"), "must be a boolean"));
        }
    }
    let strict = |t: &Json| t.pointer("/function/strict") == Some(&Json::Bool(true));
    let lazy = match choice {
        ToolChoice::Required | ToolChoice::Named(_) => false,
        ToolChoice::Auto if list.iter().any(strict) => true,
        _ => return Ok(None),
    };
    let mut alts = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}].function");
        let Some(func) = t.get("function").filter(|f| f.is_object()) else {
            return Err(ApiError::param(format!("tools[{i}]"), "must be {\"type\": \"function\", \"function\": {...}}"));
        };
        let Some(name) = func.get("name").and_then(Json::as_str) else { return Err(ApiError::param(format!("{at}.name"), "must be a string")) };
        if matches!(choice, ToolChoice::Named(n) if n != name) {
            continue;
        }
        let params = match func.get("parameters") {
            _ if lazy && !strict(t) => json!({"type": "object"}),
            None | Some(Json::Null) => json!({"type": "object", "properties": {}}),
            Some(p) => p.clone(),
        };
        GrammarSpec::check_schema(&params).map_err(|e| placed(e, &format!("{at}.parameters")))?;
        if params.get("x-guidance").is_some() {
            return Err(ApiError::param(format!("{at}.parameters.x-guidance"), "is not allowed in a function's parameters"));
        }
        let call = call_schema(name, params);
        alts.push(format!("tool_{i}"));
        alts.push(GrammarSpec::lark_json(&call));
    }
    if alts.is_empty() {
        let ToolChoice::Named(n) = choice else { return Err(ApiError::param("tools", "must offer at least one function when tool_choice is \"required\"")) };
        return Err(ApiError::param("tool_choice", format!("names the function '{}', which is not among the tools", super::error::bounded(n))));
    }
    let (names, defs): (Vec<&String>, Vec<&String>) = (alts.iter().step_by(2).collect(), alts.iter().skip(1).step_by(2).collect());
    let mut lark = String::new();
    lark.push_str(if matches!(choice, ToolChoice::Named(_)) { "start: call\n" } else { "start: call (\"\\n\" call)*\n" });
    lark.push_str("call: \"<tool_call>\\n\" body \"\\n</tool_call>\"\n");
    lark.push_str(&format!("body: {}\n", names.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" | ")));
    for (n, d) in names.iter().zip(defs) {
        lark.push_str(&format!("{n}: {d}\n"));
    }
    let spec = GrammarSpec::Lark(lark);
    let spec = if lazy { GrammarSpec::Triggered { trigger: super::tools::OPEN.into(), then: Box::new(spec) } } else { spec };
    Ok(Some(Structured { spec, field: "tools".into() }))
}

/// The schema of one call, `{"name": NAME, "arguments": PARAMS}`. References inside the
/// parameters are relative to the parameters' own root: their `$defs` / `definitions` move to
/// the call's root, and `#...` references other than into those are rewritten to point under
/// `arguments`, so that every reference means what it meant.
fn call_schema(name: &str, mut params: Json) -> Json {
    let mut call = json!({
        "type": "object",
        "properties": {"name": {"const": name}},
        "required": ["name", "arguments"],
        "additionalProperties": false,
    });
    if let Json::Object(p) = &mut params {
        for key in ["$defs", "definitions"] {
            if let Some(defs) = p.remove(key) {
                call[key] = defs;
            }
        }
    }
    rewrite_refs(&mut params);
    call["properties"]["arguments"] = params;
    call
}

fn rewrite_refs(v: &mut Json) {
    match v {
        Json::Object(m) => {
            for (k, x) in m.iter_mut() {
                match (k.as_str(), &*x) {
                    ("$ref", Json::String(r)) if r.starts_with('#') && !r.starts_with("#/$defs") && !r.starts_with("#/definitions") => {
                        *x = Json::String(format!("#/properties/arguments{}", &r[1..]));
                    }
                    // `const` and `enum` values are data, not schemas.
                    ("const" | "enum" | "default" | "examples", _) => {}
                    _ => rewrite_refs(x),
                }
            }
        }
        Json::Array(a) => a.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}
