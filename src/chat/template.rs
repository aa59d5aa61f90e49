//! A compiled chat template and its render.
//!
//! The environment reproduces the one HF's `apply_chat_template` builds (and llama.cpp's
//! jinja engine imitates):
//!
//! ```python
//! ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//!                               extensions=[AssistantTracker, jinja2.ext.loopcontrols])
//! env.filters["tojson"] = tojson              # json.dumps, see pyjson.rs
//! env.globals["raise_exception"] = raise_exception
//! env.globals["strftime_now"] = strftime_now
//! ```
//!
//! plus what Python gives for free: string/dict/list methods (`.strip()`, `.items()`, ...)
//! through MiniJinja's pycompat callback, and Python's `str()` for printed values (`None`,
//! `True`). Note `trim_blocks` and `lstrip_blocks` are on, as HF and llama.cpp set them, not
//! jinja2's defaults; `keep_trailing_newline` stays off (jinja2's default); auto-escaping is
//! off whatever the template's name; undefined values are lenient like jinja2's `Undefined`.
//! Not supported: HF's `{% generation %}` tag (assistant-token masks for training).
//!
//! Templates come from model files, so they are untrusted: every render runs on a fuel budget
//! (instructions and allocated bytes) and a recursion limit, on its own thread with a stack
//! sized to what the fuel lets a template nest, and printing or serializing nested data stops
//! at a fixed depth.

use std::error::Error as _;
use std::time::SystemTime;

use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, UndefinedBehavior, Value};

use super::convert::json_to_value;
use super::error::{Limit, TemplateError};
use super::message::{ChatMessage, check_tools};
use super::methods::python_methods;
use super::options::RenderOptions;
use super::pyjson::tojson_filter;
use super::pyrepr::{DepthExceeded, pprint_filter, py_str};
use super::strftime::{strftime_unix, unix_secs};

/// Hidden variable through which a render hands its clock to `strftime_now`.
const NOW_VAR: &str = "__minfer_now_unix";

/// Variables the renderer sets itself; `RenderOptions::extra` may not redefine them.
const RESERVED: [&str; 6] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    NOW_VAR,
];

/// Resource limits of one render.
///
/// Fuel bounds time and memory, and with them how deeply a template can nest data it builds
/// (about one level per unit). Printing, comparing or dropping nested data recurses inside
/// MiniJinja, so a render runs on its own thread whose stack grows with the fuel budget
/// ([`Limits::stack_size`]): a hostile template gets an error, not a hang or a stack overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// MiniJinja fuel: about one unit per instruction plus one per 64 bytes of results. The
    /// Qwen2.5 template spends 100 000 to 200 000 on 2 000 messages (1.4 MB of prompt), so
    /// the default covers prompts of a few MB; raise it for more.
    pub fuel: u64,
    /// MiniJinja's recursion budget (a macro call costs several units); at most 500.
    pub recursion: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 500_000,
            recursion: 500,
        }
    }
}

impl Limits {
    /// Stack bytes reserved per unit of fuel. Recursion in MiniJinja over nested data
    /// (display, comparison, hashing, drop) measured under 540 bytes per level (500 000
    /// levels ran in 256 MiB), and a level costs at least one unit; twice that, for margin.
    const STACK_PER_FUEL: u64 = 1024;
    const MIN_STACK: u64 = 16 << 20;
    const MAX_STACK: u64 = 4 << 30;

    /// The stack of the render thread: 1 KiB per unit of fuel (512 MiB by default), between
    /// 16 MiB and 4 GiB. Address space only: pages are committed as they are touched.
    pub fn stack_size(&self) -> usize {
        let bytes = self
            .fuel
            .saturating_mul(Self::STACK_PER_FUEL)
            .clamp(Self::MIN_STACK, Self::MAX_STACK);
        usize::try_from(bytes).unwrap_or(usize::MAX / 2)
    }
}

/// Marks the error `raise_exception` produces.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// `raise_exception(message)`: the template rejects its input.
fn raise_exception(message: Option<Value>) -> Result<Value, Error> {
    let mut text = String::new();
    if let Some(message) = message {
        py_str(&message, &mut text)?;
    }
    Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
}

/// `strftime_now(format)`: the render's clock, formatted.
fn strftime_now(state: &State, format: &str) -> Result<Value, Error> {
    let secs = state
        .lookup(NOW_VAR)
        .and_then(|v| v.as_i64())
        .unwrap_or_else(|| unix_secs(SystemTime::now()));
    Ok(Value::from(strftime_unix(format, secs)))
}

/// Python's `str()` for `{{ value }}`.
fn formatter(out: &mut minijinja::Output, _state: &mut State, value: &Value) -> Result<(), Error> {
    let write_err = |_| Error::new(ErrorKind::WriteFailure, "could not write template output");
    if let Some(s) = value.as_str() {
        return out.write_str(s).map_err(write_err);
    }
    let mut text = String::new();
    py_str(value, &mut text)?;
    out.write_str(&text).map_err(write_err)
}

fn build_environment(limits: Limits) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_unknown_method_callback(python_methods);
    env.set_fuel(Some(limits.fuel));
    env.set_recursion_limit(limits.recursion);
    env.set_formatter(formatter);
    env.add_filter("tojson", tojson_filter);
    env.add_filter("pprint", pprint_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    Ok(env)
}

/// The limit behind one of MiniJinja's own refusals, which it reports as plain syntax or
/// invalid-operation errors: its parser's nesting bound, its runtime recursion limit, and its
/// caps on `range` and on repetition (`'x' * 10**12`). Matched by message, as MiniJinja has no
/// error kind for them; should a message change, the error stays an error, only classified as
/// [`TemplateError::Syntax`] / [`TemplateError::Render`] (tests/reliability_templates.rs would
/// notice).
fn engine_limit(message: &str) -> Option<Limit> {
    const RECURSION: [&str; 2] = ["recursion limit exceeded", "template exceeds maximum recursion limits"];
    const SIZE: [&str; 3] = ["range has too many elements", "repeated string is too large", "repeated sequence is too large"];
    if RECURSION.iter().any(|m| message.contains(m)) {
        Some(Limit::Recursion)
    } else if SIZE.iter().any(|m| message.contains(m)) {
        Some(Limit::Size)
    } else {
        None
    }
}

/// Turns an engine error into a [`TemplateError`] that names the template and line.
fn convert_error(name: &str, err: &Error) -> TemplateError {
    let template = err.name().unwrap_or(name).to_string();
    let line = err.line();
    let detail = err.detail().unwrap_or_default().to_string();

    let mut source = err.source();
    while let Some(cause) = source {
        if let Some(raised) = cause.downcast_ref::<Raised>() {
            return TemplateError::Raised {
                template,
                line,
                message: raised.0.clone(),
            };
        }
        if cause.downcast_ref::<DepthExceeded>().is_some() {
            return TemplateError::LimitExceeded {
                template,
                line,
                limit: Limit::Recursion,
                message: detail,
            };
        }
        source = cause.source();
    }

    let kind = err.kind().to_string();
    let with_kind = if detail.is_empty() {
        kind.clone()
    } else {
        format!("{kind}: {detail}")
    };
    let detail_or_kind = if detail.is_empty() { kind } else { detail };
    if let Some(limit) = engine_limit(&detail_or_kind) {
        return TemplateError::LimitExceeded {
            template,
            line,
            limit,
            message: detail_or_kind,
        };
    }
    match err.kind() {
        ErrorKind::SyntaxError => TemplateError::Syntax {
            template,
            line,
            message: detail_or_kind,
        },
        ErrorKind::OutOfFuel => TemplateError::LimitExceeded {
            template,
            line,
            limit: Limit::Fuel,
            message: detail_or_kind,
        },
        _ => TemplateError::Render {
            template,
            line,
            message: with_kind,
        },
    }
}

/// A chat template (`tokenizer.chat_template`), compiled once and rendered per request.
#[derive(Debug)]
pub struct ChatTemplate {
    name: String,
    /// The Jinja text (llama-server's `/props` shows it).
    source: String,
    env: Environment<'static>,
    limits: Limits,
}

impl ChatTemplate {
    /// Compiles `source` under `name` (used in error messages) with the default [`Limits`].
    /// A syntax error names the template and the line.
    pub fn new(name: &str, source: &str) -> Result<ChatTemplate, TemplateError> {
        ChatTemplate::with_limits(name, source, Limits::default())
    }

    /// Compiles `source` with explicit resource limits.
    pub fn with_limits(
        name: &str,
        source: &str,
        limits: Limits,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = build_environment(limits).map_err(|e| convert_error(name, &e))?;
        env.add_template_owned(name.to_string(), source.to_string())
            .map_err(|e| convert_error(name, &e))?;
        Ok(ChatTemplate {
            name: name.to_string(),
            source: source.to_string(),
            env,
            limits,
        })
    }

    /// The name given at compile time.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Jinja text it was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. A runtime error (undefined method, `raise_exception`, an
    /// exhausted limit) names the template and the line.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, TemplateError> {
        let ctx = self.context(messages, opts)?;
        let tmpl = self
            .env
            .get_template(&self.name)
            .map_err(|e| convert_error(&self.name, &e))?;
        let internal = |message: String| TemplateError::Render {
            template: self.name.clone(),
            line: None,
            message,
        };
        std::thread::scope(|scope| {
            let handle = std::thread::Builder::new()
                .name("chat-template".to_string())
                .stack_size(self.limits.stack_size())
                .spawn_scoped(scope, move || tmpl.render(ctx))
                .map_err(|e| internal(format!("could not start the render thread: {e}")))?;
            match handle.join() {
                Ok(result) => result.map_err(|e| convert_error(&self.name, &e)),
                Err(_) => Err(internal("the template engine panicked".to_string())),
            }
        })
    }

    /// The limits the template was compiled with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The template's variables, in the order HF passes them.
    fn context(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<Value, TemplateError> {
        let messages = messages
            .iter()
            .map(ChatMessage::to_value)
            .collect::<Result<Vec<Value>, _>>()?;
        let tools = match &opts.tools {
            None | Some(serde_json::Value::Null) => Value::from(()),
            Some(tools) => {
                check_tools(tools)?;
                json_to_value(tools)?
            }
        };
        let now = unix_secs(opts.now.unwrap_or_else(SystemTime::now));
        let mut pairs: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            ("tools".into(), tools),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(opts.add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(opts.bos_token.as_str())),
            ("eos_token".into(), Value::from(opts.eos_token.as_str())),
            (NOW_VAR.into(), Value::from(now)),
        ];
        for (key, v) in &opts.extra {
            if RESERVED.contains(&key.as_str()) {
                return Err(TemplateError::bad_input(format!(
                    "extra template variable `{key}` collides with one the renderer sets"
                )));
            }
            let v = json_to_value(v)?;
            match pairs.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = v,
                None => pairs.push((key.clone(), v)),
            }
        }
        Ok(Value::from_pairs(pairs))
    }
}
