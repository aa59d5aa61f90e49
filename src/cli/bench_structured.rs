//! `minfer bench --json-schema S` (or `--json-object`, `--grammar`): the cost of structured
//! output. Greedy decoding of one prompt under the constraint, and unconstrained for as many
//! tokens, alternating, `-r` times after an untimed warm-up of each; the decode rates include
//! the sampler and the wait for each mask. Also the one-off costs: building the vocabulary's
//! token trie (once per model) and compiling the schema (once per request).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::bench::{BenchArgs, BenchOutput};
use super::grammar_args::GrammarArgs;
use super::{CliError, Out, model_files};
use crate::generate::{Engine, GenerateParams, SamplerParams, default_threads, generate};
use crate::grammar::{Grammar, GrammarVocab};

/// The prompt every run continues (raw text: no chat template, so any model can be measured).
const PROMPT: &str = "Here is the requested JSON document, following the schema exactly:\n";

/// One greedy generation of at most `n` tokens: (tokens decoded, seconds decoding).
fn decode(e: &mut Engine, tok: &crate::tokenizer::Tokenizer, ids: &[u32], n: usize, grammar: Option<&Grammar>) -> Result<(usize, f64), CliError> {
    e.reset();
    let p = GenerateParams { max_tokens: n, sampler: SamplerParams::greedy(), stop: Vec::new(), ubatch: None, n_probs: None, post_sampling_probs: false, grammar: grammar.cloned() };
    let g = generate(e, tok, ids, &p, &mut |_| Ok(()))?;
    Ok((g.n_decoded, g.gen_secs))
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let m = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let sd = if xs.len() < 2 { 0.0 } else { (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt() };
    (m, sd)
}

pub fn run(out: &mut Out, model: &Path, a: &BenchArgs, g: &GrammarArgs) -> Result<(), CliError> {
    if a.reps == 0 || a.n_gen == 0 {
        return Err(CliError::Usage("the structured-output bench needs -r and -n of at least 1"));
    }
    let Some((spec, flag)) = g.spec()? else { return Err(CliError::Usage("give --json-schema, --json-object or --grammar")) };
    let (f, tok) = model_files::open_with_tokenizer(model)?;
    let tok = Arc::new(tok);
    let t = Instant::now();
    let vocab = Arc::new(GrammarVocab::new(tok.clone()).map_err(|e| CliError::Grammar(e.to_string()))?);
    let trie_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut compile_ms = Vec::with_capacity(a.reps);
    let mut grammar = None;
    for _ in 0..a.reps {
        let t = Instant::now();
        grammar = Some(spec.compile(&vocab).map_err(|e| CliError::Grammar(format!("{flag}: {e}")))?);
        compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let grammar = grammar.ok_or(CliError::Usage("-r must be at least 1"))?;
    let ids = tok.encode_prompt(PROMPT, false);
    let mut e = a.engine.engine(Arc::new(f), ids.len() + a.n_gen)?;
    // Warm-up: the constrained run decides how many tokens both sides decode.
    let (n, _) = decode(&mut e, &tok, &ids, a.n_gen, Some(&grammar))?;
    decode(&mut e, &tok, &ids, n.max(1), None)?;
    let (mut constrained, mut free) = (Vec::new(), Vec::new());
    for _ in 0..a.reps {
        let (nc, sc) = decode(&mut e, &tok, &ids, a.n_gen, Some(&grammar))?;
        constrained.push(nc as f64 / sc);
        let (nf, sf) = decode(&mut e, &tok, &ids, n.max(1), None)?;
        free.push(nf as f64 / sf);
    }
    let (cm, cs) = mean_sd(&constrained);
    let (fm, fs) = mean_sd(&free);
    let (km, _) = mean_sd(&compile_ms);
    let threads = a.engine.threads.unwrap_or_else(default_threads);
    match a.output {
        BenchOutput::Json => out.line(
            serde_json::to_string_pretty(&json!({
                "model_filename": model.display().to_string(),
                "n_threads": threads,
                "constraint": flag,
                "n_gen": n,
                "free_avg_ts": fm, "free_stddev_ts": fs, "free_samples_ts": free,
                "constrained_avg_ts": cm, "constrained_stddev_ts": cs, "constrained_samples_ts": constrained,
                "ratio": cm / fm,
                "token_trie_ms": trie_ms,
                "compile_ms": km,
            }))
            .unwrap_or_default(),
        ),
        BenchOutput::Md => {
            out.line("| threads | test | tokens | t/s |")?;
            out.line("| ---: | --- | ---: | ---: |")?;
            out.line(format!("| {threads} | tg free | {n} | {fm:.2} ± {fs:.2} |"))?;
            out.line(format!("| {threads} | tg {flag} | {n} | {cm:.2} ± {cs:.2} |"))?;
            out.line(format!(
                "constrained / free: {:.3}; token trie built in {trie_ms:.0} ms (once per model); {flag} compiled in {km:.2} ms (once per request)",
                cm / fm
            ))
        }
    }
}
