//! `minfer bench --batch 1,2,4,8`: llama-batched-bench's measurement on minfer. For each B, B
//! sequences (random token ids) start from an empty KV: their prompts of `-p` tokens are
//! prefilled (several sequences per forward pass, `--ubatch` tokens at most), then `-n` decode
//! steps evaluate one token of every sequence in one pass. Each B runs once untimed (warm-up),
//! then `-r` times; the row is the median repetition by total time. Columns and JSON field
//! names are llama-batched-bench's: PP, TG, B, N_KV = B·(PP+TG), T_PP, S_PP = B·PP / T_PP,
//! T_TG, S_TG = B·TG / T_TG, T = T_PP + T_TG, S = N_KV / T.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::bench::{BenchArgs, BenchOutput};
use super::{CliError, Out};
use crate::generate::{Engine, SampleRng, SeqChunk, default_threads};
use crate::gguf::GgufFile;

/// One row of the table.
#[derive(Debug, Clone, Copy)]
struct Row {
    pp: usize,
    tg: usize,
    b: usize,
    t_pp: f64,
    t_tg: f64,
}

impl Row {
    fn n_kv(&self) -> usize {
        self.b * (self.pp + self.tg)
    }
    fn speed_pp(&self) -> f64 {
        rate(self.b * self.pp, self.t_pp)
    }
    fn speed_tg(&self) -> f64 {
        rate(self.b * self.tg, self.t_tg)
    }
    fn t(&self) -> f64 {
        self.t_pp + self.t_tg
    }
    fn speed(&self) -> f64 {
        rate(self.n_kv(), self.t())
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// The passes that prefill `prompts` (one per sequence `0..`): each pass takes sequences' next
/// chunks in order until `ubatch` tokens, a sequence at most once per pass.
fn prefill_passes(prompts: &[Vec<u32>], ubatch: usize) -> Vec<Vec<(usize, std::ops::Range<usize>)>> {
    let mut done = vec![0usize; prompts.len()];
    let mut passes = Vec::new();
    while done.iter().zip(prompts).any(|(d, p)| *d < p.len()) {
        let mut budget = ubatch.max(1);
        let mut pass = Vec::new();
        for (s, p) in prompts.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let n = (p.len() - done[s]).min(budget);
            if n > 0 {
                pass.push((s, done[s]..done[s] + n));
                done[s] += n;
                budget -= n;
            }
        }
        passes.push(pass);
    }
    passes
}

/// Times one run of `b` sequences.
fn run_once(e: &mut Engine, b: usize, (prompts, decode): (&[Vec<u32>], &[Vec<u32>]), ubatch: usize) -> Result<(f64, f64), CliError> {
    for s in 0..b {
        e.seq_truncate(s, 0)?;
    }
    let t0 = Instant::now();
    for pass in prefill_passes(&prompts[..b], ubatch) {
        let chunks: Vec<SeqChunk> = pass.into_iter().map(|(s, r)| SeqChunk { seq: s, tokens: &prompts[s][r] }).collect();
        e.eval_batch(&chunks)?;
    }
    let t_pp = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for i in 0..decode.first().map_or(0, Vec::len) {
        let chunks: Vec<SeqChunk> = (0..b).map(|s| SeqChunk { seq: s, tokens: std::slice::from_ref(&decode[s][i]) }).collect();
        e.eval_batch(&chunks)?;
    }
    Ok((t_pp, t1.elapsed().as_secs_f64()))
}

pub fn run(out: &mut Out, model: &Path, a: &BenchArgs, batches: &[usize]) -> Result<(), CliError> {
    if a.reps == 0 {
        return Err(CliError::Usage("-r must be at least 1"));
    }
    if a.n_prompt == 0 && a.n_gen == 0 {
        return Err(CliError::Usage("nothing to measure: -p and -n are both 0"));
    }
    if a.n_depth > 0 {
        return Err(CliError::Usage("-d does not apply to --batch"));
    }
    let max_b = batches.iter().copied().max().unwrap_or(1);
    let file = Arc::new(GgufFile::open(model)?);
    let needed = a.n_prompt + a.n_gen;
    let mut engine_args = a.engine.clone();
    engine_args.ctx = Some(engine_args.ctx.unwrap_or(needed).max(needed));
    let mut e = engine_args.engine_seqs(file, needed, max_b)?;
    let threads = a.engine.threads.unwrap_or_else(default_threads);
    let ubatch = e.n_ubatch();
    let n_vocab = e.n_vocab() as u64;
    let mut rng = SampleRng::new(1234);
    let mut tokens = |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next_u64() % n_vocab) as u32).collect() };
    let prompts: Vec<Vec<u32>> = (0..max_b).map(|_| tokens(a.n_prompt)).collect();
    let decode: Vec<Vec<u32>> = (0..max_b).map(|_| tokens(a.n_gen)).collect();
    let mut rows = Vec::new();
    for &b in batches {
        run_once(&mut e, b, (&prompts, &decode), ubatch)?; // warm-up
        let mut runs = (0..a.reps).map(|_| run_once(&mut e, b, (&prompts, &decode), ubatch)).collect::<Result<Vec<_>, _>>()?;
        runs.sort_by(|x, y| (x.0 + x.1).total_cmp(&(y.0 + y.1)));
        let (t_pp, t_tg) = runs[runs.len() / 2];
        rows.push(Row { pp: a.n_prompt, tg: a.n_gen, b, t_pp, t_tg });
    }
    let n_kv_max = e.n_ctx() * e.n_seq();
    match a.output {
        BenchOutput::Json => {
            let rows: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    json!({
                        "n_kv_max": n_kv_max, "n_batch": ubatch, "n_ubatch": ubatch, "flash_attn": 0, "is_pp_shared": 0,
                        "n_gpu_layers": 0, "n_threads": threads, "n_threads_batch": threads,
                        "pp": r.pp, "tg": r.tg, "pl": r.b, "n_kv": r.n_kv(),
                        "t_pp": r.t_pp, "speed_pp": r.speed_pp(), "t_tg": r.t_tg, "speed_tg": r.speed_tg(),
                        "t": r.t(), "speed": r.speed(),
                    })
                })
                .collect();
            out.line(serde_json::to_string_pretty(&rows).unwrap_or_default())
        }
        BenchOutput::Md => {
            out.line(format!("n_kv_max = {n_kv_max}, n_ubatch = {ubatch}, n_threads = {threads}, median of {} repetitions", a.reps))?;
            out.line("")?;
            out.line("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |")?;
            out.line("|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|")?;
            for r in &rows {
                out.line(format!(
                    "| {:5} | {:6} | {:4} | {:6} | {:8.3} | {:8.2} | {:8.3} | {:8.2} | {:8.3} | {:8.2} |",
                    r.pp,
                    r.tg,
                    r.b,
                    r.n_kv(),
                    r.t_pp,
                    r.speed_pp(),
                    r.t_tg,
                    r.speed_tg(),
                    r.t(),
                    r.speed()
                ))?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_passes_fill_the_ubatch_with_each_sequence_once() {
        let prompts = vec![vec![0u32; 5], vec![0; 3], vec![0; 4]];
        let passes = prefill_passes(&prompts, 6);
        // 12 tokens in passes of at most 6: [s0 0..5, s1 0..1], [s1 1..3, s2 0..4].
        assert_eq!(passes, vec![vec![(0, 0..5), (1, 0..1)], vec![(1, 1..3), (2, 0..4)]]);
    }

    #[test]
    fn speeds_follow_llama_batched_bench() {
        let r = Row { pp: 128, tg: 128, b: 4, t_pp: 2.0, t_tg: 8.0 };
        assert_eq!(r.n_kv(), 1024);
        assert_eq!((r.speed_pp(), r.speed_tg(), r.t(), r.speed()), (256.0, 64.0, 10.0, 102.4));
    }
}
