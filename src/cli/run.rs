//! `minfer run`: generate text from a prompt or a conversation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::draft_args::DraftArgs;
use super::engine_args::EngineArgs;
use super::{CliError, Out, model_files};
use super::progress::{PREFILL_BAR_TOKENS, Progress};
use crate::generate::{Engine, GenerateParams, Generation, Generator, SamplerParams, SpecError, Speculator, TraceOptions, TraceRecorder, run_speculative};
use crate::chat::{ChatMessage, ChatRequest};
use crate::tokenizer::Tokenizer;

/// Where the prompt comes from.
pub enum Prompt<'a> {
    /// Text from `-p` / `-f`: the user's message in the model's chat template, or with `raw`
    /// (or a model without a template) the text itself.
    Text { text: String, raw: bool, system: Option<String> },
    /// A `--messages` conversation.
    Messages(&'a Path),
}

/// The prompt as the model will see it.
struct Formed {
    text: String,
    /// Special-token text in it is parsed (it came out of a chat template).
    parse_special: bool,
    /// How it was formed, for `--verbose`.
    how: String,
}

/// Renders `prompt`: chat mode when a template is in force (`--chat-template FILE`, else the
/// model's) and `--raw` was not given. A `-p` prompt to a model without a template continues as
/// raw text, said on stderr; a conversation or a system message needs a template.
fn form_prompt(f: &crate::gguf::GgufFile, template: Option<&Path>, tok: &Tokenizer, prompt: Prompt) -> Result<Formed, CliError> {
    let has_template = template.is_some() || f.opt_str("tokenizer.chat_template")?.is_some();
    let how_chat = |n: usize| match template {
        Some(p) => format!("the chat template {} (--chat-template), {n} message(s)", p.display()),
        None => format!("the model's chat template (tokenizer.chat_template), {n} message(s)"),
    };
    match prompt {
        Prompt::Text { text, raw: true, .. } => Ok(Formed { text, parse_special: false, how: "raw text (--raw)".into() }),
        Prompt::Text { system: Some(_), .. } if !has_template => {
            Err(CliError::Usage("--system needs a chat template: this model has none; use --chat-template FILE, or --raw"))
        }
        Prompt::Text { text, .. } if !has_template => {
            eprintln!("minfer: this model has no chat template: continuing the prompt as raw text (--chat-template FILE chats)");
            Ok(Formed { text, parse_special: false, how: "raw text (the model has no chat template)".into() })
        }
        Prompt::Text { text, system, .. } => {
            let mut messages: Vec<ChatMessage> = system.map(ChatMessage::system).into_iter().collect();
            messages.push(ChatMessage::user(text));
            let how = how_chat(messages.len());
            let req = ChatRequest { messages, tools: None };
            Ok(Formed { text: model_files::render_chat(f, template, tok, &req, true)?, parse_special: true, how })
        }
        Prompt::Messages(p) => {
            let req = model_files::read_messages(p)?;
            let how = format!("{} from {}", how_chat(req.messages.len()), p.display());
            Ok(Formed { text: model_files::render_chat(f, template, tok, &req, true)?, parse_special: true, how })
        }
    }
}

/// Everything `run` was asked for besides the prompt.
pub struct RunArgs {
    /// `--chat-template FILE`: the template instead of the model's.
    pub chat_template: Option<PathBuf>,
    pub engine: EngineArgs,
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// `--json-schema`, `--json-object`, `--grammar`.
    pub grammar: super::grammar_args::GrammarArgs,
    pub stop: Vec<String>,
    pub json: bool,
    pub dump_graph: Option<PathBuf>,
    pub dump_graph_json: Option<PathBuf>,
    pub draft: DraftArgs,
    pub verbose: bool,
}

/// Generation from `ids`, speculative when `spec` is given, with a prefill bar on a terminal for
/// long prompts (evaluated in chunks of [`PREFILL_BAR_TOKENS`] then, unless `--ubatch` says
/// otherwise; chunking does not change the logits).
fn generate_with_bar(
    engine: &mut Engine,
    spec: Option<&mut Speculator>,
    tok: &Tokenizer,
    ids: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<Generation, SpecError> {
    let bar = Progress::tokens(ids.len(), "prefill");
    let params = if bar.shown() && ids.len() >= PREFILL_BAR_TOKENS {
        GenerateParams { ubatch: Some(params.ubatch.unwrap_or(PREFILL_BAR_TOKENS)), ..params.clone() }
    } else {
        params.clone()
    };
    let mut g = Generator::new(engine, tok, ids, &params)?;
    while g.prompt_left() > 0 {
        g.step(engine)?;
        bar.set((ids.len() - g.prompt_left()) as u64);
    }
    bar.finish();
    match spec {
        Some(spec) => run_speculative(g, engine, spec, on_text),
        None => Ok(g.run_to_end(engine, on_text)?),
    }
}

pub fn run(out: &mut Out, model: &Path, prompt: Prompt, a: &RunArgs) -> Result<(), CliError> {
    let (f, tok) = model_files::open_with_tokenizer(model)?;
    let tok = Arc::new(tok);
    // Before anything is evaluated: a bad schema or grammar is an error at once.
    let grammar = a.grammar.compile(&tok)?;
    let Formed { text, parse_special, how } = form_prompt(&f, a.chat_template.as_deref(), &tok, prompt)?;
    let ids = tok.encode_prompt(&text, parse_special);
    if a.verbose {
        eprintln!("minfer: prompt: {how}, {} tokens:", ids.len());
        eprintln!("{text}");
        eprintln!("minfer: end of prompt");
    }
    let mut engine = a.engine.engine(Arc::new(f), ids.len())?;
    if a.dump_graph.is_some() || a.dump_graph_json.is_some() {
        return super::dump::dump_graphs(&engine, ids.len(), a.dump_graph.as_deref(), a.dump_graph_json.as_deref());
    }
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampler: a.sampler.clone(),
        stop: a.stop.clone(),
        ubatch: a.engine.ubatch,
        n_probs: None,
        post_sampling_probs: false,
        grammar,
    };
    let json = a.json;
    let mut spec = a.draft.speculator(&a.engine, &engine, &tok)?;
    let trace = match TraceOptions::from_env()? {
        Some(t) => Some((t.create()?, t)),
        None => None,
    };
    if let Some((_, t)) = &trace {
        engine.set_tracer(Some(TraceRecorder::new(t.max_values)));
    }
    let g = generate_with_bar(&mut engine, spec.as_mut(), &tok, &ids, &params, &mut |s| {
        if json {
            return Ok(());
        }
        out.write(s).and_then(|_| out.flush()).map_err(|e| e.to_string())
    });
    // The trace is written even when generation failed: it shows what ran up to the failure.
    let mut trace_note = None;
    if let (Some((file, t)), Some(rec)) = (trace, engine.take_tracer()) {
        let steps: usize = rec.phases().iter().map(|p| p.steps.len()).sum();
        trace_note = Some(match rec.write(file, &engine.model().display_name(), &text, &tok) {
            Ok(()) => format!("minfer: trace of {steps} evaluations in {} phases written to {}", rec.phases().len(), t.path.display()),
            // Generation's own error, if any, is the one reported; this one is said too.
            Err(e) if g.is_err() => format!("minfer: also: {e}"),
            Err(e) => return Err(e.into()),
        });
    }
    let g = g.inspect_err(|_| trace_note.iter().for_each(|n| eprintln!("{n}")))?;
    if json {
        let v = json!({
            "prompt_ids": g.prompt_ids,
            "generated_ids": g.generated_ids,
            "text": g.text,
            "prompt_tokens_per_s": g.prompt_tokens_per_s(),
            "gen_tokens_per_s": g.gen_tokens_per_s(),
            "gen_secs": g.gen_secs,
            "draft": spec.as_ref().map(|s| s.stats().to_json()),
        });
        trace_note.iter().for_each(|n| eprintln!("{n}"));
        return out.line(v.to_string());
    }
    out.line("")?;
    out.flush()?;
    trace_note.iter().for_each(|n| eprintln!("{n}"));
    eprintln!(
        "minfer: prompt {} tokens in {:.2} s ({:.1} t/s), generated {} tokens in {:.2} s ({:.1} t/s)",
        g.prompt_ids.len(),
        g.prompt_secs,
        g.prompt_tokens_per_s(),
        g.generated_ids.len(),
        g.gen_secs,
        g.gen_tokens_per_s()
    );
    if let Some(s) = spec.as_ref().filter(|_| a.verbose) {
        let st = s.stats();
        eprintln!(
            "minfer: draft: {} rounds, drafted {} tokens, accepted {} ({:.1}%), {:.2} s drafting, {:.2} s verifying",
            st.rounds,
            st.drafted,
            st.accepted,
            100.0 * st.acceptance(),
            st.draft_secs,
            st.verify_secs
        );
    }
    Ok(())
}
