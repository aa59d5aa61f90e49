//! `minfer bench`: llama-bench's tests on minfer. Random token ids; each test runs once untimed
//! (warm-up), then `-r` timed repetitions. pp: one prefill of `-p` tokens; tg: `-n` single-token
//! decodes. Both start from an empty KV, or with `-d N` from a KV holding `N` tokens (prefilled
//! once, untimed, and restored before every repetition, as llama-bench's `-d` does). The markdown table has llama-bench's columns; the
//! JSON objects carry its field names (`n_prompt`, `n_gen`, `avg_ts`, `stddev_ts`, …).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::engine_args::EngineArgs;
use super::{CliError, Out};
use crate::generate::{Engine, KvSnapshot, SampleRng, default_threads};
use crate::gguf::GgufFile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchOutput {
    Md,
    Json,
}

pub struct BenchArgs {
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens in the KV before each test (llama-bench's `n_depth`).
    pub n_depth: usize,
    pub reps: usize,
    pub output: BenchOutput,
    pub engine: EngineArgs,
}

/// One test's timings.
struct TestResult {
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    /// Tokens per second of each repetition.
    ts: Vec<f64>,
}

impl TestResult {
    /// llama-bench's test name: `pp512`, `tg128`, `tg128 @ d4096`.
    fn name(&self) -> String {
        let test = if self.n_gen == 0 { format!("pp{}", self.n_prompt) } else { format!("tg{}", self.n_gen) };
        if self.n_depth == 0 { test } else { format!("{test} @ d{}", self.n_depth) }
    }

    fn mean(&self) -> f64 {
        self.ts.iter().sum::<f64>() / self.ts.len().max(1) as f64
    }

    /// Sample standard deviation, as llama-bench reports it.
    fn stddev(&self) -> f64 {
        if self.ts.len() < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.ts.iter().map(|t| (t - m).powi(2)).sum::<f64>() / (self.ts.len() - 1) as f64).sqrt()
    }
}

fn random_tokens(rng: &mut SampleRng, n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|_| (rng.next_u64() % n_vocab as u64) as u32).collect()
}

/// Empties the KV, then puts the depth's tokens back (if any).
fn start_at(e: &mut Engine, depth: Option<&KvSnapshot>) -> Result<(), CliError> {
    e.reset();
    if let Some(snap) = depth {
        e.kv_restore(snap)?;
    }
    Ok(())
}

/// Seconds for one prefill of `tokens` after `depth`.
fn time_pp(e: &mut Engine, depth: Option<&KvSnapshot>, tokens: &[u32], ubatch: Option<usize>) -> Result<f64, CliError> {
    start_at(e, depth)?;
    let t = Instant::now();
    e.prefill(tokens, ubatch)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds for `tokens.len()` single-token decodes after `depth`.
fn time_tg(e: &mut Engine, depth: Option<&KvSnapshot>, tokens: &[u32]) -> Result<f64, CliError> {
    start_at(e, depth)?;
    let t = Instant::now();
    for tok in tokens {
        e.eval(std::slice::from_ref(tok), 1)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

pub fn run(out: &mut Out, model: &Path, a: &BenchArgs) -> Result<(), CliError> {
    if a.reps == 0 {
        return Err(CliError::Usage("-r must be at least 1"));
    }
    if a.n_prompt == 0 && a.n_gen == 0 {
        return Err(CliError::Usage("nothing to measure: -p and -n are both 0"));
    }
    let file = Arc::new(GgufFile::open(model)?);
    let size = file.tensors().iter().map(|t| t.n_bytes).sum::<u64>();
    let params = file.n_params();
    // Context as llama-bench sizes it: the depth plus the longer test.
    let needed = a.n_depth + a.n_prompt.max(a.n_gen);
    let mut engine_args = a.engine.clone();
    engine_args.ctx = Some(engine_args.ctx.unwrap_or(needed).max(needed));
    let mut e = engine_args.engine(file, a.n_prompt.max(a.n_gen).max(a.n_depth))?;
    let threads = a.engine.threads.unwrap_or_else(default_threads);
    let n_vocab = e.n_vocab();
    let mut rng = SampleRng::new(1234);
    let depth = if a.n_depth > 0 {
        let tokens = random_tokens(&mut rng, a.n_depth, n_vocab);
        e.reset();
        e.prefill(&tokens, a.engine.ubatch)?;
        Some(e.kv_snapshot()?)
    } else {
        None
    };
    let depth = depth.as_ref();
    let mut results = Vec::new();
    if a.n_prompt > 0 {
        let tokens = random_tokens(&mut rng, a.n_prompt, n_vocab);
        time_pp(&mut e, depth, &tokens, a.engine.ubatch)?; // warm-up
        let ts = (0..a.reps)
            .map(|_| time_pp(&mut e, depth, &tokens, a.engine.ubatch).map(|s| a.n_prompt as f64 / s))
            .collect::<Result<Vec<_>, _>>()?;
        results.push(TestResult { n_prompt: a.n_prompt, n_gen: 0, n_depth: a.n_depth, ts });
    }
    if a.n_gen > 0 {
        let tokens = random_tokens(&mut rng, a.n_gen, n_vocab);
        time_tg(&mut e, depth, &tokens)?; // warm-up
        let ts = (0..a.reps)
            .map(|_| time_tg(&mut e, depth, &tokens).map(|s| a.n_gen as f64 / s))
            .collect::<Result<Vec<_>, _>>()?;
        results.push(TestResult { n_prompt: 0, n_gen: a.n_gen, n_depth: a.n_depth, ts });
    }
    let hp = e.model().hparams();
    let model_name = format!("{} {:.2}M", hp.arch, params as f64 / 1e6);
    let backends = backends_label(&e);
    match a.output {
        BenchOutput::Json => {
            let rows: Vec<serde_json::Value> = results
                .iter()
                .map(|r| {
                    json!({
                        "model_filename": model.display().to_string(),
                        "model_type": model_name,
                        "model_size": size,
                        "model_n_params": params,
                        "backends": backends,
                        "n_threads": threads,
                        "n_prompt": r.n_prompt,
                        "n_gen": r.n_gen,
                        "n_depth": r.n_depth,
                        "avg_ts": r.mean(),
                        "stddev_ts": r.stddev(),
                        "samples_ts": r.ts,
                    })
                })
                .collect();
            out.line(serde_json::to_string_pretty(&rows).unwrap_or_default())
        }
        BenchOutput::Md => {
            out.line("| model | size | params | backend | threads | test | t/s |")?;
            out.line("| --- | ---: | ---: | --- | ---: | ---: | ---: |")?;
            for r in &results {
                out.line(format!(
                    "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {:.2} ± {:.2} |",
                    model_name,
                    size as f64 / (1024.0 * 1024.0),
                    params as f64 / 1e6,
                    backends,
                    threads,
                    r.name(),
                    r.mean(),
                    r.stddev()
                ))?;
            }
            Ok(())
        }
    }
}

/// llama-bench's `backends` column: the devices the model runs on ("CUDA"), or "CPU" when it
/// runs on the CPU alone (the CPU backend is always present, for the nodes a device declines).
fn backends_label(e: &crate::generate::Engine) -> String {
    let registry = crate::backends::registry();
    let names: Vec<String> = e
        .backends()
        .into_iter()
        .map(|b| registry.entry(b).map_or_else(|| b.to_string(), |x| x.name.to_string()).to_uppercase())
        .collect();
    let devices: Vec<&String> = names.iter().filter(|n| n.as_str() != "CPU").collect();
    if devices.is_empty() { "CPU".to_string() } else { devices.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_stddev() {
        let r = TestResult { n_prompt: 512, n_gen: 0, n_depth: 0, ts: vec![2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0] };
        assert_eq!(r.mean(), 5.0);
        // Σ(x-5)² = 32 over n-1 = 7.
        assert!((r.stddev() - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(r.name(), "pp512");
        let g = TestResult { n_prompt: 0, n_gen: 128, n_depth: 0, ts: vec![3.0] };
        assert_eq!((g.name().as_str(), g.stddev()), ("tg128", 0.0));
        let d = TestResult { n_prompt: 0, n_gen: 128, n_depth: 4096, ts: vec![3.0] };
        assert_eq!(d.name(), "tg128 @ d4096");
    }
}
