//! The sampler chain, in llama.cpp's order: repetition / presence / frequency penalties over the
//! recent tokens, then top-k, top-p, min-p, temperature, and a draw (or the argmax when the
//! temperature is 0). Reproducible for a seed.

use std::collections::HashMap;

use super::rng::SampleRng;

/// Sampling settings; the defaults are llama.cpp's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// 0 (or less) means greedy: the argmax, no randomness.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p; 1.0 disables.
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one; 0 disables.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens; 1.0 disables.
    pub repeat_penalty: f32,
    /// Subtract from the logit of every recent token once; 0 disables.
    pub presence_penalty: f32,
    /// Subtract from the logit of a recent token once per occurrence; 0 disables.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
    /// Added to the logits of these tokens before anything else (OpenAI's `logit_bias`;
    /// `-inf` bans a token).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0xC0FFEE,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerParams {
    pub fn greedy() -> SamplerParams {
        SamplerParams { temperature: 0.0, ..SamplerParams::default() }
    }

    /// Rejects settings no sampler can honour (NaN, negative probabilities, …).
    pub fn validate(&self) -> Result<(), SamplerError> {
        let bad = |name: &'static str, value: f32, why: &'static str| Err(SamplerError::BadParam { name, value, why });
        if !self.temperature.is_finite() {
            return bad("temperature", self.temperature, "must be a finite number");
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("top_p", self.top_p, "must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "must be in [0, 1]");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", self.repeat_penalty, "must be positive");
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", self.presence_penalty, "must be a finite number");
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", self.frequency_penalty, "must be a finite number");
        }
        if let Some(&(_, b)) = self.logit_bias.iter().find(|(_, b)| b.is_nan() || *b == f32::INFINITY) {
            return bad("logit_bias", b, "must be a number or -inf");
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplerError {
    #[error("{name} = {value} is invalid: {why}")]
    BadParam { name: &'static str, value: f32, why: &'static str },
    #[error("no logits to sample from")]
    Empty,
    #[error("the logits contain no finite value")]
    NoFiniteLogit,
}

/// A stateful sampler: holds its random stream and the recent tokens for the penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    rng: SampleRng,
    recent: Vec<u32>,
}

/// A distribution over tokens: `(id, probability)` pairs, most likely first, every other token
/// at probability 0. Never empty.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenDist {
    pub cands: Vec<(u32, f32)>,
}

impl TokenDist {
    /// The probability of `id`.
    pub fn prob(&self, id: u32) -> f32 {
        self.cands.iter().find(|c| c.0 == id).map_or(0.0, |c| c.1)
    }

    /// The token where the cumulative probability passes `r` (in [0, 1)); the last one when
    /// rounding leaves the sum short of `r`.
    pub fn pick(&self, r: f32) -> u32 {
        let mut cum = 0.0f32;
        for &(id, p) in &self.cands {
            cum += p;
            if r < cum {
                return id;
            }
        }
        self.cands[self.cands.len() - 1].0
    }
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
    p: f32,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Result<Sampler, SamplerError> {
        params.validate()?;
        let rng = SampleRng::new(params.seed);
        Ok(Sampler { params, rng, recent: Vec::new() })
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Records a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, id: u32) {
        self.recent.push(id);
        let keep = self.params.penalty_last_n.max(1) * 4;
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - self.params.penalty_last_n.max(1));
        }
    }

    /// Picks the next token from one row of logits: [`Sampler::distribution`], then
    /// [`Sampler::draw`].
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplerError> {
        let dist = self.distribution(logits)?;
        Ok(self.draw(&dist))
    }

    /// The distribution the next token is drawn from, given one row of logits and the tokens
    /// accepted so far: bias, penalties, then greedy (all mass on the argmax) or top-k, top-p,
    /// min-p and the temperature. Changes no state.
    pub fn distribution(&self, logits: &[f32]) -> Result<TokenDist, SamplerError> {
        if logits.is_empty() {
            return Err(SamplerError::Empty);
        }
        let mut logits = std::borrow::Cow::Borrowed(logits);
        if !self.params.logit_bias.is_empty() {
            let l = logits.to_mut();
            for &(id, bias) in &self.params.logit_bias {
                if let Some(x) = l.get_mut(id as usize) {
                    *x += bias;
                }
            }
        }
        if self.penalties_active() {
            self.apply_penalties(logits.to_mut());
        }
        if self.params.temperature <= 0.0 {
            let id = argmax(&logits).ok_or(SamplerError::NoFiniteLogit)?;
            return Ok(TokenDist { cands: vec![(id, 1.0)] });
        }
        let mut c: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &logit)| Candidate { id: i as u32, logit, p: 0.0 })
            .collect();
        if c.is_empty() {
            return Err(SamplerError::NoFiniteLogit);
        }
        // Sorted by logit, best first; ties by id so the order is total and reproducible.
        let order = |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
        let k = self.params.top_k;
        if k > 0 && k < c.len() {
            // The k best by selection, then only they are sorted (a vocabulary of 150k sorted
            // in full per token costs milliseconds).
            c.select_nth_unstable_by(k - 1, order);
            c.truncate(k);
        }
        c.sort_by(order);
        softmax(&mut c, 1.0);
        if self.params.top_p < 1.0 {
            let mut cum = 0.0f32;
            let mut keep = c.len();
            for (i, x) in c.iter().enumerate() {
                cum += x.p;
                if cum >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
        if self.params.min_p > 0.0 {
            let threshold = c[0].p * self.params.min_p;
            let keep = c.iter().take_while(|x| x.p >= threshold).count();
            c.truncate(keep.max(1));
        }
        softmax(&mut c, self.params.temperature);
        Ok(TokenDist { cands: c.into_iter().map(|x| (x.id, x.p)).collect() })
    }

    /// A token drawn from `dist` with this sampler's random stream (a greedy sampler takes the
    /// most likely token and draws nothing).
    pub fn draw(&mut self, dist: &TokenDist) -> u32 {
        if self.params.temperature <= 0.0 {
            return dist.cands[0].0;
        }
        let r = self.uniform() as f32;
        dist.pick(r)
    }

    /// The next number of the random stream, uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    fn penalties_active(&self) -> bool {
        !self.recent.is_empty()
            && (self.params.repeat_penalty != 1.0 || self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0)
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let start = self.recent.len().saturating_sub(self.params.penalty_last_n);
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.recent[start..] {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(l) = logits.get_mut(t as usize) else { continue };
            if *l > 0.0 {
                *l /= self.params.repeat_penalty;
            } else {
                *l *= self.params.repeat_penalty;
            }
            *l -= n as f32 * self.params.frequency_penalty + self.params.presence_penalty;
        }
    }
}

/// The `k` largest of the logits that `keep` accepts, `(id, logit)` best first; ties by id
/// (`minfer logits --top` keeps all, traces leave NaN out).
pub fn top_logits(logits: &[f32], k: usize, keep: impl Fn(f32) -> bool) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).filter(|&i| keep(logits[i as usize])).collect();
    let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, logits[i as usize])).collect()
}

/// Index of the largest finite logit (the lowest index on ties), as llama.cpp's greedy sampler.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

fn softmax(c: &mut [Candidate], temperature: f32) {
    let max = c.iter().map(|x| x.logit).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for x in c.iter_mut() {
        x.p = ((x.logit - max) / temperature).exp();
        sum += f64::from(x.p);
    }
    for x in c.iter_mut() {
        x.p = (f64::from(x.p) / sum) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logits_are_the_largest_best_first() {
        let l = [0.5, 3.0, f32::NAN, -1.0, 3.0, 2.0];
        assert_eq!(top_logits(&l, 3, |v| !v.is_nan()), vec![(1, 3.0), (4, 3.0), (5, 2.0)]);
        assert_eq!(top_logits(&l, 10, |v| !v.is_nan()).len(), 5);
        assert_eq!(top_logits(&l, 10, |_| true).len(), 6);
        assert!(top_logits(&l, 0, |_| true).is_empty());
    }

    fn params(f: impl FnOnce(&mut SamplerParams)) -> SamplerParams {
        let mut p = SamplerParams { top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplerParams::default() };
        f(&mut p);
        p
    }

    #[test]
    fn greedy_is_argmax_lowest_index_on_ties() {
        let mut s = Sampler::new(SamplerParams::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]).unwrap(), 1);
        assert_eq!(s.sample(&[f32::NAN, -5.0, f32::NEG_INFINITY]).unwrap(), 1);
        assert_eq!(s.sample(&[f32::NAN]), Err(SamplerError::NoFiniteLogit));
        assert_eq!(s.sample(&[]), Err(SamplerError::Empty));
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(params(|p| {
            p.top_k = 1;
            p.temperature = 5.0;
        }))
        .unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 0.5, 0.4]).unwrap(), 1);
        }
    }

    #[test]
    fn seed_reproduces_and_frequencies_follow_softmax() {
        // logits ln(1), ln(3): probabilities 1/4 and 3/4 at temperature 1.
        let logits = [0.0f32, 3.0f32.ln()];
        let run = |seed| {
            let mut s = Sampler::new(params(|p| {
                p.temperature = 1.0;
                p.seed = seed;
            }))
            .unwrap();
            (0..20_000).map(|_| s.sample(&logits).unwrap()).collect::<Vec<_>>()
        };
        let a = run(42);
        assert_eq!(a, run(42));
        assert_ne!(a, run(43));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.015, "{ones}");
    }

    #[test]
    fn temperature_sharpens() {
        // At temperature 0.5 the odds 1:3 become 1:9, so p(1) = 0.9.
        let logits = [0.0f32, 3.0f32.ln()];
        let mut s = Sampler::new(params(|p| p.temperature = 0.5)).unwrap();
        let n = 20_000;
        let ones = (0..n).filter(|_| s.sample(&logits).unwrap() == 1).count() as f64 / n as f64;
        assert!((ones - 0.9).abs() < 0.012, "{ones}");
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // probabilities ~ [0.6, 0.3, 0.1]: top_p 0.8 keeps two, min_p 0.4 keeps those >= 0.24.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        for f in [
            Box::new(|p: &mut SamplerParams| p.top_p = 0.8) as Box<dyn Fn(&mut SamplerParams)>,
            Box::new(|p: &mut SamplerParams| p.min_p = 0.4),
        ] {
            let mut s = Sampler::new(params(|p| {
                p.temperature = 1.0;
                f(p)
            }))
            .unwrap();
            let seen: std::collections::HashSet<u32> = (0..2000).map(|_| s.sample(&logits).unwrap()).collect();
            assert_eq!(seen, [0, 1].into_iter().collect());
        }
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.repeat_penalty = 2.0;
            p.frequency_penalty = 0.5;
            p.presence_penalty = 0.25;
        }))
        .unwrap();
        let mut logits = vec![4.0, -1.0, 3.0];
        for t in [0, 0, 1] {
            s.accept(t);
        }
        s.apply_penalties(&mut logits);
        // token 0: 4/2 - 2*0.5 - 0.25 = 0.75; token 1: -1*2 - 0.5 - 0.25 = -2.75; token 2 untouched.
        assert_eq!(logits, vec![0.75, -2.75, 3.0]);
        assert_eq!(s.sample(&[4.0, -1.0, 3.0]).unwrap(), 2);
    }

    #[test]
    fn logit_bias_comes_first_and_can_ban() {
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.logit_bias = vec![(0, f32::NEG_INFINITY), (2, 1.5)];
        }))
        .unwrap();
        // token 0 is banned, token 2 rises from 3.0 to 4.5 past token 1's 4.0.
        assert_eq!(s.sample(&[9.0, 4.0, 3.0]).unwrap(), 2);
    }

    #[test]
    fn bad_params_are_refused() {
        assert!(matches!(Sampler::new(params(|p| p.top_p = 1.5)), Err(SamplerError::BadParam { name: "top_p", .. })));
        assert!(matches!(Sampler::new(params(|p| p.temperature = f32::NAN)), Err(SamplerError::BadParam { .. })));
        assert!(matches!(Sampler::new(params(|p| p.repeat_penalty = 0.0)), Err(SamplerError::BadParam { .. })));
    }
}
