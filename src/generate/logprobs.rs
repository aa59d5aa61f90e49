//! Log-probabilities of a sampled token and of the most likely alternatives, from the raw
//! logits of its step (before penalties and truncation), as llama-server reports them by
//! default and the OpenAI API's `logprobs` / `top_logprobs` ask for.

/// The log-probability of one chosen token and the `n` most likely tokens of its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f32,
    /// The most likely tokens, most likely first (ties: lower id first), with their
    /// log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// `log softmax(logits)[id]` and the `n_top` largest entries of the same distribution.
/// Non-finite logits have probability 0 (log-probability -inf) and never enter `top`.
pub fn token_logprobs(logits: &[f32], id: u32, n_top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let log_z = if max.is_finite() {
        let sum: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| f64::from(l - max).exp()).sum();
        f64::from(max) + sum.ln()
    } else {
        f64::INFINITY
    };
    let lp = |l: f32| if l.is_finite() { (f64::from(l) - log_z) as f32 } else { f32::NEG_INFINITY };
    let logprob = logits.get(id as usize).map_or(f32::NEG_INFINITY, |&l| lp(l));
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n_top + 1);
    if n_top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if !l.is_finite() || (best.len() == n_top && l <= best[n_top - 1].1) {
                continue;
            }
            // Insert after every entry >= l, so equal logits keep id order.
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (i as u32, l));
            best.truncate(n_top);
        }
    }
    let top = best.into_iter().map(|(i, l)| (i, lp(l))).collect();
    TokenLogprobs { id, logprob, top }
}

/// The same from the distribution a token was drawn from (after the sampler's filters): its
/// candidates' probabilities as natural logarithms, the `n_top` most likely first (ties: lower
/// id first); a token outside it has -inf.
pub fn dist_logprobs(dist: &super::sampler::TokenDist, id: u32, n_top: usize) -> TokenLogprobs {
    let ln = |p: f32| if p > 0.0 { p.ln() } else { f32::NEG_INFINITY };
    let mut cands = dist.cands.clone();
    cands.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    cands.truncate(n_top);
    TokenLogprobs { id, logprob: ln(dist.prob(id)), top: cands.into_iter().map(|(i, p)| (i, ln(p))).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_sampling_logprobs_follow_the_distribution() {
        let dist = super::super::sampler::TokenDist { cands: vec![(7, 0.25), (3, 0.5), (9, 0.25)] };
        let l = dist_logprobs(&dist, 9, 2);
        assert_eq!(l.logprob, 0.25f32.ln());
        assert_eq!(l.top, vec![(3, 0.5f32.ln()), (7, 0.25f32.ln())]);
        assert_eq!(dist_logprobs(&dist, 1, 5).logprob, f32::NEG_INFINITY);
        assert_eq!(dist_logprobs(&dist, 3, 5).top.len(), 3);
    }

    #[test]
    fn matches_a_hand_computed_softmax() {
        // probabilities 1/6, 2/6, 3/6
        let logits = [1.0f32.ln(), 2.0f32.ln(), 3.0f32.ln()];
        let t = token_logprobs(&logits, 1, 2);
        assert!((t.logprob - (2.0f32 / 6.0).ln()).abs() < 1e-6);
        assert_eq!(t.top.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((t.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn ties_keep_id_order_and_non_finite_is_excluded() {
        let logits = [0.0, f32::NAN, 0.0, f32::NEG_INFINITY, 0.0];
        let t = token_logprobs(&logits, 3, 5);
        assert_eq!(t.logprob, f32::NEG_INFINITY);
        assert_eq!(t.top.iter().map(|p| p.0).collect::<Vec<_>>(), vec![0, 2, 4]);
        assert!((t.top[0].1 - (1.0f32 / 3.0).ln()).abs() < 1e-6);
        assert!(token_logprobs(&logits, 0, 0).top.is_empty());
    }
}
