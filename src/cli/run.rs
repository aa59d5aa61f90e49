//! `minfer run`: generate text from a prompt or a conversation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::engine_args::EngineArgs;
use super::{CliError, Out, model_files};
use super::progress::{PREFILL_BAR_TOKENS, Progress};
use crate::generate::{Engine, GenerateError, GenerateParams, Generation, Generator, SamplerParams, generate};
use crate::tokenizer::Tokenizer;

/// Where the prompt comes from.
pub enum Prompt<'a> {
    Text(&'a str),
    Messages(&'a Path),
}

/// Everything `run` was asked for besides the prompt.
pub struct RunArgs {
    pub engine: EngineArgs,
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    pub stop: Vec<String>,
    pub json: bool,
    pub dump_graph: Option<PathBuf>,
    pub dump_graph_json: Option<PathBuf>,
    /// Draft model and tokens per round.
    pub draft: Option<(PathBuf, usize)>,
}

/// [`generate`], with a prefill bar on a terminal for long prompts (evaluated in chunks of
/// [`PREFILL_BAR_TOKENS`] then, unless `--ubatch` says otherwise; chunking does not change the
/// logits).
fn generate_with_bar(
    engine: &mut Engine,
    tok: &Tokenizer,
    ids: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<Generation, GenerateError> {
    let bar = Progress::tokens(ids.len(), "prefill");
    if !bar.shown() || ids.len() < PREFILL_BAR_TOKENS {
        return generate(engine, tok, ids, params, on_text);
    }
    let params = GenerateParams { ubatch: Some(params.ubatch.unwrap_or(PREFILL_BAR_TOKENS)), ..params.clone() };
    let mut g = Generator::new(engine, tok, ids, &params)?;
    while g.prompt_left() > 0 {
        g.step(engine)?;
        bar.set((ids.len() - g.prompt_left()) as u64);
    }
    bar.finish();
    g.run_to_end(engine, on_text)
}

pub fn run(out: &mut Out, model: &Path, prompt: Prompt, a: &RunArgs) -> Result<(), CliError> {
    let (f, tok) = model_files::open_with_tokenizer(model)?;
    let (text, parse_special) = match prompt {
        Prompt::Text(t) => (t.to_string(), false),
        Prompt::Messages(p) => {
            let req = model_files::read_messages(p)?;
            (model_files::render_chat(&f, &tok, &req, true)?, true)
        }
    };
    let ids = tok.encode_prompt(&text, parse_special);
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
    };
    let json = a.json;
    if let Some((draft_path, n_draft)) = &a.draft {
        let mut draft = a.engine.engine_beside(Arc::new(crate::gguf::GgufFile::open(draft_path)?), &engine)?;
        let (g, stats) = crate::generate::generate_speculative(&mut engine, &mut draft, &tok, &ids, &params, *n_draft, &mut |s| {
            if json {
                return Ok(());
            }
            out.write(s).and_then(|_| out.flush()).map_err(|e| e.to_string())
        })?;
        if json {
            let v = json!({
                "prompt_ids": g.prompt_ids, "generated_ids": g.generated_ids, "text": g.text,
                "gen_tokens_per_s": g.gen_tokens_per_s(),
                "draft": {"drafted": stats.drafted, "accepted": stats.accepted, "acceptance": stats.acceptance(), "target_passes": stats.target_passes},
            });
            return out.line(v.to_string());
        }
        out.line("")?;
        eprintln!("minfer: speculative: drafted {}, accepted {} ({:.1}%), {} target passes for {} tokens", stats.drafted, stats.accepted, 100.0 * stats.acceptance(), stats.target_passes, g.generated_ids.len());
        return Ok(());
    }
    let g = generate_with_bar(&mut engine, &tok, &ids, &params, &mut |s| {
        if json {
            return Ok(());
        }
        out.write(s).and_then(|_| out.flush()).map_err(|e| e.to_string())
    })?;
    if json {
        let v = json!({
            "prompt_ids": g.prompt_ids,
            "generated_ids": g.generated_ids,
            "text": g.text,
            "prompt_tokens_per_s": g.prompt_tokens_per_s(),
            "gen_tokens_per_s": g.gen_tokens_per_s(),
        });
        return out.line(v.to_string());
    }
    out.line("")?;
    out.flush()?;
    eprintln!(
        "minfer: prompt {} tokens in {:.2} s ({:.1} t/s), generated {} tokens in {:.2} s ({:.1} t/s)",
        g.prompt_ids.len(),
        g.prompt_secs,
        g.prompt_tokens_per_s(),
        g.generated_ids.len(),
        g.gen_secs,
        g.gen_tokens_per_s()
    );
    Ok(())
}
