//! Speculative decoding with a draft model (design record §11.4, D5-R).
//!
//! Each round, the target's next token `t0` is chosen as usual; the draft model (same
//! vocabulary, much smaller) then proposes up to `n_draft` tokens `d1..dn` with single-token
//! forwards on its own engine (its own `GraphCache` and KV), and the target evaluates
//! `[t0, d1..dn]` in one forward with `n + 1` logit rows. Row `i` is the target's distribution
//! `p_i` after `d_i`'s predecessors; the drafts are checked in order by rejection sampling
//! (Leviathan et al. 2023, Chen et al. 2023):
//!
//! * `d_i` is accepted with probability `min(1, p_i(d_i) / q_i(d_i))`, `q_i` being the
//!   distribution the draft drew it from;
//! * at the first rejection the token is drawn from the residual `max(0, p_i - q_i)`
//!   (normalized) instead, and the round ends; it is the next round's `t0`;
//! * when every draft is accepted, the next round's `t0` is drawn from row `n`.
//!
//! Every emitted token is therefore distributed exactly as plain sampling from the target would
//! draw it. Greedy decoding is the special case where `p_i` and `q_i` put all their mass on one
//! token: a draft is accepted iff it is the target's argmax, the residual is the argmax, and no
//! random number is drawn. Rows of a multi-token pass are bit-identical to single-token passes
//! (prefill equals decode, see `vec_ops::matmul`), so greedy output is the target's plain
//! greedy output, token for token.
//!
//! The draft stops early when its own probability for the token it proposes falls below
//! `p_min` (the token is not proposed): an unsure draft wastes target work. The number of
//! drafts varies per round, so the target's verify graph is rebuilt when it changes; a rebuild
//! costs a few milliseconds against a verify pass of ~100 (measured on the 1.5B), so the set of
//! depths is left free.
//!
//! Rejected cells are removed from the target's KV with `kv_rm`. Before drafting, the draft's
//! KV is brought to the target's tokens (longest common prefix kept, the rest evaluated), so
//! the draft follows whatever the caller did to the target's KV in between (a conversation's
//! next turn, a context shift).

use std::time::Instant;

use super::conversation::common_prefix;
use super::engine::{Engine, EngineError};
use super::run::{GenerateError, GenerateParams, Generation, Generator, StepOutput, StopReason};
use super::sampler::{Sampler, SamplerError, SamplerParams, TokenDist};
use crate::tokenizer::Tokenizer;

/// How the draft proposes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftParams {
    /// Most tokens proposed per round.
    pub n_draft: usize,
    /// Stop proposing when the draft gives its next token a lower probability than this.
    pub p_min: f32,
}

impl DraftParams {
    /// At least one token per round, `p_min` in [0, 1].
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.n_draft == 0 {
            return Err(SpecError::NoDraftTokens);
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(SpecError::BadMinP(self.p_min));
        }
        Ok(())
    }
}

impl Default for DraftParams {
    fn default() -> Self {
        DraftParams { n_draft: 12, p_min: 0.0 }
    }
}

/// What the draft did, summed over rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Proposed tokens the target accepted.
    pub accepted: usize,
    /// Verify passes of the target.
    pub rounds: usize,
    /// Seconds in the draft's forwards (catching up with the target and proposing).
    pub draft_secs: f64,
    /// Seconds in the target's verify passes.
    pub verify_secs: f64,
}

impl SpecStats {
    /// Accepted / drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }

    /// The statistics as JSON (`--json`, the server's timings).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance(),
            "rounds": self.rounds,
            "draft_secs": self.draft_secs,
            "verify_secs": self.verify_secs,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error("the draft model cannot draft for this target: {0}")]
    Vocab(String),
    #[error("--draft-n must be at least 1")]
    NoDraftTokens,
    #[error("--draft-min-p = {0} is invalid: it must be in [0, 1]")]
    BadMinP(f32),
}

/// Whether `draft`'s tokenizer is `target`'s: the same tokens with the same texts, the same
/// BOS and end-of-generation tokens. Drafts are token ids, so anything else would be verified
/// against the wrong text.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), SpecError> {
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt != nd {
        return Err(SpecError::Vocab(format!("the target has {nt} tokens, the draft {nd}")));
    }
    for id in 0..nt as u32 {
        let (a, b) = (target.token_bytes(id), draft.token_bytes(id));
        if a.ok() != b.ok() {
            let show = |t: &Tokenizer| t.token_text(id).map(|s| format!("{s:?}")).unwrap_or_else(|_| "?".into());
            return Err(SpecError::Vocab(format!("token {id} is {} in the target, {} in the draft", show(target), show(draft))));
        }
    }
    if target.bos_id() != draft.bos_id() {
        return Err(SpecError::Vocab(format!("BOS is {:?} in the target, {:?} in the draft", target.bos_id(), draft.bos_id())));
    }
    if target.eog_ids() != draft.eog_ids() {
        return Err(SpecError::Vocab("their end-of-generation tokens differ".into()));
    }
    Ok(())
}

/// The draft side of speculative decoding: the draft engine, its sampler and the statistics.
/// One per sequence (a CLI run, a chat, a server slot).
pub struct Speculator {
    draft: Engine,
    params: DraftParams,
    sampler: Sampler,
    /// The next token when the last round ended in a rejection (drawn from the residual).
    next: Option<u32>,
    stats: SpecStats,
    backoff: Backoff,
    /// The draft's own sampling settings, instead of the target's.
    draft_sampling: Option<SamplerParams>,
}

/// Acceptance below which drafting costs more than it saves. A verify pass of `n + 1` tokens
/// costs about 2.5 decode steps plus a little per token on the CPU (the weights are unpacked
/// once per pass), and each draft token about 0.4 of a target step (0.5B for 1.5B), so a round
/// of 12 drafts gains only when about 9 of them are accepted.
const MIN_ACCEPTANCE: f64 = 0.8;

/// Chunk of the draft's catch-up prefill when the generation sets none.
const CATCH_UP_CHUNK: usize = 512;

/// Drafts of a probe round (see [`Backoff`]).
const PROBE_DEPTH: usize = 4;

/// The longest pause of drafting, in rounds.
const MAX_PAUSE: usize = 128;

/// Adaptive drafting: an exponential average of the acceptance rate; when it falls below
/// [`MIN_ACCEPTANCE`] the next `skip` rounds are plain decode steps (no draft work at all),
/// then one round drafts a few tokens again as a probe; each failed probe doubles the pause
/// (from 4 up to [`MAX_PAUSE`] rounds), a good one halves it (full-depth drafting resumes once
/// it is back at 4).
#[derive(Debug, Clone, Copy)]
struct Backoff {
    rate: f64,
    skip: usize,
    pause: usize,
}

impl Backoff {
    const FRESH: Backoff = Backoff { rate: 1.0, skip: 0, pause: 4 };

    /// How many tokens this round may draft, of `n`: none during a pause, a few in the probe
    /// that ends one (the draft must first catch up with the tokens it missed).
    fn depth(&mut self, n: usize) -> usize {
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        if self.pause > Backoff::FRESH.pause { n.min(PROBE_DEPTH) } else { n }
    }

    /// A round that drafted `n` tokens, `k` of them accepted.
    fn record(&mut self, n: usize, k: usize) {
        if n == 0 {
            return;
        }
        let r = k as f64 / n as f64;
        self.rate = 0.6 * self.rate + 0.4 * r;
        if self.rate >= MIN_ACCEPTANCE {
            // Trust comes back gradually: a lucky probe only halves the pause.
            self.pause = (self.pause / 2).max(Backoff::FRESH.pause);
        } else {
            self.skip = self.pause;
            self.pause = (self.pause * 2).min(MAX_PAUSE);
            // A probe must see good acceptance again to end the pause.
            self.rate = MIN_ACCEPTANCE - 0.1 * (1.0 - MIN_ACCEPTANCE);
        }
    }
}

impl Speculator {
    /// `draft` must share the target's vocabulary ([`check_vocab`]).
    pub fn new(draft: Engine, params: DraftParams) -> Result<Speculator, SpecError> {
        params.validate()?;
        Ok(Speculator {
            draft,
            params,
            sampler: Sampler::new(SamplerParams::greedy())?,
            next: None,
            stats: SpecStats::default(),
            backoff: Backoff::FRESH,
            draft_sampling: None,
        })
    }

    pub fn params(&self) -> DraftParams {
        self.params
    }

    pub fn draft_engine(&self) -> &Engine {
        &self.draft
    }

    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The draft proposes with `sampling`'s truncation and temperature instead of the
    /// target's (a draft tuned apart; the tests use it to make proposals the target rejects).
    /// Greedy targets ignore it: their drafts are always the draft's argmax.
    pub fn with_draft_sampling(mut self, sampling: SamplerParams) -> Speculator {
        self.draft_sampling = Some(sampling);
        self
    }

    /// Starts a generation sampled with `sampling` (the target's settings): the draft draws
    /// from the same truncation and temperature, without penalties (its proposals need not
    /// follow them: rejection sampling corrects any proposal), on its own random stream.
    /// Statistics start again from zero.
    pub fn begin(&mut self, sampling: &SamplerParams) -> Result<(), SpecError> {
        let greedy = sampling.temperature <= 0.0;
        let mut p = match &self.draft_sampling {
            Some(d) if !greedy => d.clone(),
            _ => sampling.clone(),
        };
        p.repeat_penalty = 1.0;
        p.presence_penalty = 0.0;
        p.frequency_penalty = 0.0;
        p.seed = sampling.seed ^ 0x5eed_d7af_7000_0001;
        self.sampler = Sampler::new(p)?;
        self.next = None;
        self.stats = SpecStats::default();
        self.backoff = Backoff::FRESH;
        Ok(())
    }

    /// The draft's KV made to hold `ctx` (its longest common prefix kept, the rest evaluated
    /// in chunks of `ubatch`); the logits after `ctx`'s last token.
    fn sync_draft(&mut self, ctx: &[u32], ubatch: Option<usize>) -> Result<Vec<f32>, SpecError> {
        let common = common_prefix(self.draft.tokens(), ctx);
        // The last token is evaluated again when the draft has it: its logits are needed.
        let keep = common.min(ctx.len() - 1);
        self.draft.kv_rm(keep, self.draft.n_past())?;
        Ok(self.draft.prefill(&ctx[keep..], ubatch)?)
    }

    /// Up to `n_max` draft tokens after the target's context and `t0`, each with the
    /// distribution it was drawn from.
    fn propose(&mut self, target: &Engine, t0: u32, n_max: usize, ubatch: Option<usize>) -> Result<Vec<(u32, TokenDist)>, SpecError> {
        let mut ctx = target.tokens().to_vec();
        ctx.push(t0);
        if n_max == 0 || ctx.len() + n_max > self.draft.n_ctx() {
            return Ok(Vec::new());
        }
        let mut logits = self.sync_draft(&ctx, ubatch.or(Some(CATCH_UP_CHUNK)))?;
        let greedy = self.sampler.params().temperature <= 0.0;
        let mut drafts = Vec::with_capacity(n_max);
        for _ in 0..n_max {
            let q = self.sampler.distribution(&logits)?;
            // Whether to go on is decided from q alone, before drawing: a rule that looked at
            // the drawn token would propose from q truncated, not from the q `judge` divides by.
            // The confidence is q's best probability (greedy: the argmax's softmax probability
            // at temperature 1).
            if self.params.p_min > 0.0 {
                let confidence = if greedy { softmax_prob(&logits, q.cands[0].0) } else { q.cands[0].1 };
                if confidence < self.params.p_min {
                    break;
                }
            }
            let d = self.sampler.draw(&q);
            drafts.push((d, q));
            // The last draft is evaluated too (its logits unused): the next round's catch-up is
            // then one token, so the draft runs single-token passes only and its graph is never
            // rebuilt for another batch size.
            logits = self.draft.eval(&[d], 1)?;
        }
        Ok(drafts)
    }

    /// One round on `g`, whose prompt must be evaluated: emits `t0` and the accepted drafts (at
    /// most `n_draft + 1` steps; the last one `finished` when generation ends). The target's
    /// KV holds every emitted token but the last afterwards, as after plain decode steps.
    pub fn round(&mut self, g: &mut Generator, target: &mut Engine) -> Result<Vec<StepOutput>, SpecError> {
        let start = Instant::now();
        if g.generation().generated_ids.len() >= g.params().max_tokens {
            return Ok(vec![g.end(StopReason::MaxTokens)]);
        }
        let t0 = match self.next.take() {
            Some(t) => t,
            None => {
                let p = g.distribution()?;
                g.draw(&p)
            }
        };
        let first = g.take(t0)?;
        if first.finished.is_some() {
            return Ok(vec![first]);
        }
        let base = target.n_past();
        if base >= target.n_ctx() {
            // The held-back text goes out with t0, as plain decoding flushes it.
            return Ok(vec![g.end_with(first, StopReason::ContextFull)]);
        }
        let mut out = vec![first];
        let budget = g.params().max_tokens.saturating_sub(g.generation().generated_ids.len());
        let n_max = self.backoff.depth(self.params.n_draft).min(target.n_ctx() - base - 1).min(budget);
        let t_draft = Instant::now();
        let drafts = self.propose(target, t0, n_max, g.params().ubatch)?;
        self.stats.draft_secs += t_draft.elapsed().as_secs_f64();

        let t_verify = Instant::now();
        let batch: Vec<u32> = std::iter::once(t0).chain(drafts.iter().map(|d| d.0)).collect();
        let rows = target.eval(&batch, batch.len())?;
        self.stats.verify_secs += t_verify.elapsed().as_secs_f64();
        let judged = self.judge_all(g, &rows, target.n_vocab(), &drafts, &mut out);
        let (k, finished) = match judged {
            Ok(kf) => kf,
            Err(e) => {
                // Never leave unchecked drafts in the KV.
                target.kv_rm(base, target.n_past())?;
                return Err(e);
            }
        };
        // Keep t0 and the accepted drafts, except a last token that ended the generation (never
        // evaluated after plain decode steps either).
        let keep = if finished { base + k } else { base + 1 + k };
        target.kv_rm(keep, target.n_past())?;
        // Drafts cut off by the end of the generation were neither accepted nor rejected.
        let considered = if finished { k } else { drafts.len() };
        self.backoff.record(considered, k);
        self.stats.drafted += considered;
        self.stats.accepted += k;
        self.stats.rounds += 1;
        g.record_decode(start.elapsed().as_secs_f64(), keep - base);
        Ok(out)
    }

    /// Judges the drafts in order against the target's rows (`rows[i]` the distribution after
    /// `t0, d1..di`), appending the accepted ones to `out`; sets the logits and `next` for the
    /// following round. Returns (accepted, whether the generation ended).
    fn judge_all(
        &mut self,
        g: &mut Generator,
        rows: &[f32],
        n_vocab: usize,
        drafts: &[(u32, TokenDist)],
        out: &mut Vec<StepOutput>,
    ) -> Result<(usize, bool), SpecError> {
        let row = |i: usize| rows[i * n_vocab..(i + 1) * n_vocab].to_vec();
        let greedy = g.params().sampler.temperature <= 0.0;
        for (i, (d, q)) in drafts.iter().enumerate() {
            g.set_logits(row(i));
            let p = g.distribution()?;
            if let Verdict::Replace(x) = judge(&p, q, *d, greedy, &mut || g.uniform()) {
                self.next = Some(x);
                return Ok((i, false));
            }
            let step = g.take(*d)?;
            let finished = step.finished.is_some();
            out.push(step);
            if finished {
                return Ok((i + 1, true));
            }
        }
        g.set_logits(row(drafts.len()));
        Ok((drafts.len(), false))
    }
}

/// What checking a draft token against the target's distribution decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Accept,
    /// Rejected: this token (drawn from the residual) takes its place.
    Replace(u32),
}

/// Rejection sampling of draft token `d`, drawn from `q`, against the target's `p`: accept
/// with probability `min(1, p(d) / q(d))`, else draw from `max(0, p - q)` normalized.
/// `uniform` is called only when a random number decides something (never when `greedy`).
fn judge(p: &TokenDist, q: &TokenDist, d: u32, greedy: bool, uniform: &mut dyn FnMut() -> f64) -> Verdict {
    let (pd, qd) = (p.prob(d), q.prob(d));
    let accept = if pd >= qd {
        true
    } else if pd <= 0.0 {
        false
    } else {
        uniform() < f64::from(pd / qd)
    };
    if accept {
        return Verdict::Accept;
    }
    let qs: std::collections::HashMap<u32, f32> = q.cands.iter().copied().collect();
    let cands: Vec<(u32, f32)> = p.cands.iter().map(|&(id, pp)| (id, (pp - qs.get(&id).copied().unwrap_or(0.0)).max(0.0))).collect();
    let sum: f32 = cands.iter().map(|c| c.1).sum();
    if greedy || sum <= 0.0 {
        // Greedy, or p == q up to rounding (then the draft would have been accepted): p's best.
        return Verdict::Replace(p.cands[0].0);
    }
    let residual = TokenDist { cands: cands.into_iter().filter(|c| c.1 > 0.0).map(|(id, w)| (id, w / sum)).collect() };
    Verdict::Replace(residual.pick(uniform() as f32))
}

/// `softmax(logits)[id]` at temperature 1.
fn softmax_prob(logits: &[f32], id: u32) -> f32 {
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| f64::from(l - max).exp()).sum();
    logits.get(id as usize).map_or(0.0, |&l| (f64::from(l - max).exp() / sum) as f32)
}

/// Generation from `prompt` on `target` with `spec` drafting; the same result as
/// [`generate`](super::generate) (token for token when greedy, in distribution when sampling).
pub fn generate_speculative(
    target: &mut Engine,
    spec: &mut Speculator,
    tok: &Tokenizer,
    prompt: &[u32],
    p: &GenerateParams,
    on_text: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<Generation, SpecError> {
    let mut g = Generator::new(target, tok, prompt, p)?;
    while g.prompt_left() > 0 {
        g.step(target)?;
    }
    run_speculative(g, target, spec, on_text)
}

/// Speculative rounds on `g` (its prompt evaluated) until generation ends; `on_text` gets the
/// text as it becomes final. Starts `spec` with `g`'s sampler settings.
pub fn run_speculative(
    mut g: Generator,
    target: &mut Engine,
    spec: &mut Speculator,
    on_text: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<Generation, SpecError> {
    spec.begin(&g.params().sampler)?;
    loop {
        for step in spec.round(&mut g, target)? {
            if !step.text.is_empty() {
                on_text(&step.text).map_err(GenerateError::Sink)?;
            }
            if step.finished.is_some() {
                return Ok(g.into_generation());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::SampleRng;

    fn dist(c: &[(u32, f32)]) -> TokenDist {
        TokenDist { cands: c.to_vec() }
    }

    /// Emitted tokens follow `p` whatever `q` proposes: 200k draws per case, a chi-square test
    /// at the 0.1 % level, for a `q` flatter than `p` on a subset (residual-only tokens), one
    /// sharper than `p`, and one with tokens `p` excludes.
    #[test]
    fn judged_tokens_follow_the_target_distribution() {
        let p = dist(&[(7, 0.34), (3, 0.19), (9, 0.14), (1, 0.13), (4, 0.11), (8, 0.09)]);
        let cases = [
            dist(&[(7, 0.39), (3, 0.32), (9, 0.29)]),
            dist(&[(7, 0.9), (3, 0.05), (9, 0.03), (1, 0.02)]),
            dist(&[(5, 0.3), (7, 0.2), (8, 0.2), (2, 0.3)]),
        ];
        // Upper 0.1 % point of chi-square with 5 degrees of freedom.
        const CRIT: f64 = 20.52;
        for q in &cases {
            let mut rng = SampleRng::new(42);
            let n = 200_000;
            let mut counts = [0usize; 10];
            let mut accepted = 0;
            for _ in 0..n {
                let d = q.pick(rng.next_f64() as f32);
                let tok = match judge(&p, q, d, false, &mut || rng.next_f64()) {
                    Verdict::Accept => {
                        accepted += 1;
                        d
                    }
                    Verdict::Replace(x) => x,
                };
                counts[tok as usize] += 1;
            }
            let stat: f64 = p.cands.iter().map(|&(id, pi)| {
                let e = f64::from(pi) * n as f64;
                (counts[id as usize] as f64 - e).powi(2) / e
            }).sum();
            let outside: usize = (0..10u32).filter(|id| p.prob(*id) == 0.0).map(|id| counts[id as usize]).sum();
            assert_eq!(outside, 0, "tokens p excludes were emitted");
            assert!(stat < CRIT, "q {q:?}: chi2 {stat:.2}, counts {counts:?}");
            // Acceptance is sum_x min(p, q), as the theory says.
            let expect: f32 = q.cands.iter().map(|&(id, qi)| qi.min(p.prob(id))).sum();
            let got = accepted as f32 / n as f32;
            assert!((got - expect).abs() < 0.005, "acceptance {got} vs {expect}");
        }
    }

    #[test]
    fn greedy_judging_draws_nothing() {
        let p = dist(&[(4, 1.0)]);
        let mut never = || -> f64 { panic!("greedy judging drew a random number") };
        assert_eq!(judge(&p, &dist(&[(4, 1.0)]), 4, true, &mut never), Verdict::Accept);
        assert_eq!(judge(&p, &dist(&[(6, 1.0)]), 6, true, &mut never), Verdict::Replace(4));
    }
}
