//! Speculative decoding against plain decoding of the target:
//!
//! * greedy: for every prompt of the llama.cpp reference set (raw and chat), the 1.5B target
//!   drafted by the 0.5B gives the target's plain greedy tokens, one for one;
//! * sampling: the tokens rejection sampling emits follow the target's distribution (a
//!   chi-square test over seeded draws, with a draft that proposes from another distribution
//!   so that rejections and residual draws happen);
//! * a draft with another vocabulary, or bad draft settings, is refused.

mod common;

use std::sync::Arc;

use minfer::generate::{
    DraftParams, Engine, EngineParams, EngineShared, GenerateParams, SamplerParams, SpecError, Speculator, check_vocab, generate,
    generate_speculative,
};
use minfer::gguf::GgufFile;
use minfer::models::{Model, load_model};
use minfer::tokenizer::{Tokenizer, TokenizerData};

const TARGET: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const DRAFT: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const TINY: &str = "qwen3-tiny.gguf";

fn load(name: &str) -> (Arc<Model>, Tokenizer) {
    let f = GgufFile::open(common::model_path(name)).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    (Arc::new(load_model(Arc::new(f)).unwrap()), tok)
}

fn engine(model: &Arc<Model>, n_ctx: usize) -> Engine {
    Engine::new(model.clone(), &EngineParams { n_ctx, n_threads: 2, ..EngineParams::default() }).unwrap()
}

/// A draft engine on `target`'s worker threads.
fn draft_beside(model: &Arc<Model>, target: &Engine) -> Engine {
    let shared = EngineShared::with_pool(model, target.pool().clone()).unwrap();
    let p = EngineParams { n_seq: 1, n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx: target.n_ctx(), n_threads: 1, ..EngineParams::default() };
    Engine::with_shared(model.clone(), &p, &shared).unwrap()
}

fn params(max_tokens: usize, sampler: SamplerParams) -> GenerateParams {
    GenerateParams { max_tokens, sampler, stop: vec![], ubatch: None, n_probs: None, post_sampling_probs: false, grammar: None }
}

struct Record {
    id: String,
    kind: String,
    prompt_ids: Vec<u32>,
}

fn reference_records() -> Vec<Record> {
    let text = std::fs::read_to_string(common::data_path("qwen2.5-0.5b.greedy.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Record {
                id: v["id"].as_str().unwrap().to_string(),
                kind: v["kind"].as_str().unwrap().to_string(),
                prompt_ids: v["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect(),
            }
        })
        .collect()
}

#[test]
fn greedy_speculative_equals_plain_greedy_on_the_reference_prompts() {
    let (target_model, tok) = load(TARGET);
    let (draft_model, draft_tok) = load(DRAFT);
    check_vocab(&tok, &draft_tok).unwrap();
    let records = reference_records();
    assert!(records.iter().any(|r| r.kind == "raw") && records.iter().any(|r| r.kind == "chat"));
    let mut target = engine(&target_model, 1024);
    let mut spec = Speculator::new(draft_beside(&draft_model, &target), DraftParams::default()).unwrap();
    // A second setting on a few prompts: shallow drafts cut by the draft's confidence.
    let mut shallow = Speculator::new(draft_beside(&draft_model, &target), DraftParams { n_draft: 3, p_min: 0.5 }).unwrap();
    let p = params(64, SamplerParams::greedy());
    let (mut drafted, mut accepted) = (0, 0);
    for (i, r) in records.iter().enumerate() {
        target.reset();
        let plain = generate(&mut target, &tok, &r.prompt_ids, &p, &mut |_| Ok(())).unwrap();
        let s = if i % 4 == 1 { &mut shallow } else { &mut spec };
        target.reset();
        let mut streamed = String::new();
        let fast = generate_speculative(&mut target, s, &tok, &r.prompt_ids, &p, &mut |t| {
            streamed.push_str(t);
            Ok(())
        })
        .unwrap();
        let st = s.stats();
        println!(
            "{:<14} {:<4} {} tokens, drafted {:>3}, accepted {:>3} ({:.0}%), {} rounds",
            r.id,
            r.kind,
            fast.generated_ids.len(),
            st.drafted,
            st.accepted,
            100.0 * st.acceptance(),
            st.rounds
        );
        assert_eq!(fast.generated_ids, plain.generated_ids, "{}: speculative tokens differ from plain greedy", r.id);
        assert_eq!(fast.text, plain.text, "{}", r.id);
        assert_eq!(streamed, plain.text, "{}: streamed text", r.id);
        assert_eq!(fast.stop, plain.stop, "{}", r.id);
        // Every round emits t0 plus its accepted drafts (a last t0 that ends the generation
        // needs no verify pass).
        let emitted = fast.generated_ids.len() - (st.rounds + st.accepted);
        assert!(emitted <= 1, "{}: {st:?}", r.id);
        drafted += st.drafted;
        accepted += st.accepted;
    }
    println!("all: drafted {drafted}, accepted {accepted}");
    assert!(accepted > 0 && accepted < drafted, "the drafts must be both accepted and rejected somewhere: {accepted}/{drafted}");
}

/// The upper 0.1 % point of the chi-square distribution with `df` degrees of freedom.
fn chi2_critical_001(df: usize) -> f64 {
    [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59][df - 1]
}

/// Pearson's statistic of `counts` against probabilities `p` (categories with expected counts
/// under 5 pooled into one).
fn chi2(counts: &[usize], p: &[f64]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&o, &pi) in counts.iter().zip(p) {
        let e = pi * n as f64;
        if e < 5.0 {
            pool_o += o as f64;
            pool_e += e;
        } else {
            stat += (o as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e.max(1e-9);
        cells += 1;
    }
    (stat, cells - 1)
}

/// The target's exact sampling distribution after `ctx` (its penalties see `ctx`).
fn target_dist(target: &mut Engine, sampling: &SamplerParams, ctx: &[u32]) -> (minfer::generate::TokenDist, Vec<f32>) {
    let mut sampler = minfer::generate::Sampler::new(sampling.clone()).unwrap();
    ctx.iter().for_each(|&t| sampler.accept(t));
    target.reset();
    let logits = target.prefill(ctx, None).unwrap();
    (sampler.distribution(&logits).unwrap(), logits)
}

#[test]
fn rejection_sampling_preserves_the_target_distribution() {
    // The tiny random model as both target and draft. The target samples at temperature 1 from
    // its 6 best tokens with top-p 0.97 and a repetition penalty; the draft proposes at
    // temperature 3 from its 3 best, so proposals are often rejected and some of the target's
    // candidates come only from residual draws. The draft's best probability after the six
    // possible first tokens lies between 0.74 and 0.84 on this fixture: `--draft-min-p 0.755`
    // cuts some rounds short and not others.
    // Three tokens per generation, two drafts per round: the second token is judged at depth
    // 1, the third at depth 2 (or drawn after a rejection).
    let (model, tok) = load(TINY);
    let target_sampling =
        SamplerParams { temperature: 1.0, top_k: 6, top_p: 0.97, min_p: 0.0, repeat_penalty: 1.3, penalty_last_n: 64, ..SamplerParams::greedy() };
    let draft_sampling = SamplerParams { temperature: 3.0, top_k: 3, top_p: 1.0, repeat_penalty: 1.0, ..target_sampling.clone() };
    let prompt = tok.encode("The weather today", false);
    let mut target = engine(&model, 64);
    let mut spec = Speculator::new(draft_beside(&model, &target), DraftParams { n_draft: 2, p_min: 0.755 })
        .unwrap()
        .with_draft_sampling(draft_sampling.clone());

    // The exact distributions of the first token, of the second after the likeliest first, of
    // the third after the two likeliest.
    let (first, _) = target_dist(&mut target, &target_sampling, &prompt);
    let ctx2: Vec<u32> = prompt.iter().copied().chain([first.cands[0].0]).collect();
    let (second, logits2) = target_dist(&mut target, &target_sampling, &ctx2);
    let ctx3: Vec<u32> = ctx2.iter().copied().chain([second.cands[0].0]).collect();
    let (third, _) = target_dist(&mut target, &target_sampling, &ctx3);
    // What the draft proposes after the first token (same model, its own settings).
    let proposal = minfer::generate::Sampler::new(draft_sampling).unwrap().distribution(&logits2).unwrap();

    let n_draws = 2000;
    let dists = [&first, &second, &third];
    let mut counts: Vec<Vec<usize>> = dists.iter().map(|d| vec![0; d.cands.len()]).collect();
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..n_draws {
        let p = params(3, SamplerParams { seed, ..target_sampling.clone() });
        target.reset();
        let g = generate_speculative(&mut target, &mut spec, &tok, &prompt, &p, &mut |_| Ok(())).unwrap();
        assert_eq!(g.generated_ids.len(), 3);
        // Token i counts when the tokens before it are the likeliest ones.
        for (i, d) in dists.iter().enumerate() {
            if (0..i).any(|j| g.generated_ids[j] != dists[j].cands[0].0) {
                break;
            }
            let at = d.cands.iter().position(|c| c.0 == g.generated_ids[i]);
            counts[i][at.unwrap_or_else(|| panic!("token {i} outside the target's candidates"))] += 1;
        }
        drafted += spec.stats().drafted;
        accepted += spec.stats().accepted;
    }
    println!("drafted {drafted}, accepted {accepted}");
    assert!(accepted > drafted / 10 && accepted < drafted * 9 / 10, "rejections and acceptances both happen: {accepted}/{drafted}");
    assert!(drafted < 2 * n_draws as usize && drafted > n_draws as usize / 2, "--draft-min-p must cut some rounds short, not all: {drafted}");
    // The test can fail: second tokens distributed as the draft's proposals would give a
    // statistic far above the critical value.
    let n_second: usize = counts[1].iter().sum();
    let p2: Vec<f64> = second.cands.iter().map(|c| f64::from(c.1)).collect();
    let q2: Vec<f64> = second.cands.iter().map(|c| f64::from(proposal.prob(c.0))).collect();
    let power = n_second as f64 * p2.iter().zip(&q2).map(|(p, q)| (q - p).powi(2) / p).sum::<f64>();
    println!("second tokens as the draft proposes them would give chi2 about {power:.0}; proposal {:?}", proposal.cands);
    assert!(power > 4.0 * chi2_critical_001(p2.len() - 1), "the draft must propose from a distribution the test tells apart");
    for (i, (d, n)) in dists.iter().zip(&counts).enumerate() {
        let p: Vec<f64> = d.cands.iter().map(|c| f64::from(c.1)).collect();
        let (stat, df) = chi2(n, &p);
        let crit = chi2_critical_001(df);
        println!("token {}: p {:?}\n         n {n:?}\n         chi2 {stat:.2} with {df} df (0.1% point {crit})", i + 1, d.cands);
        assert!(df >= 2, "token {}: too few categories to test", i + 1);
        assert!(stat < crit, "token {}: the emitted tokens do not follow the target's distribution (chi2 {stat:.2} >= {crit})", i + 1);
    }
}

/// Generation that ends on a full context or a zero budget ends as plain decoding does.
#[test]
fn full_context_and_zero_budget_end_as_plain_decoding() {
    let (model, tok) = load(TINY);
    let prompt = tok.encode("The weather today is", false);
    for (n_ctx, max_tokens) in [(16, 100), (64, 0), (64, 1)] {
        let mut target = engine(&model, n_ctx);
        // The target as its own draft: every draft is accepted, so a round runs into the end.
        let mut spec = Speculator::new(draft_beside(&model, &target), DraftParams { n_draft: 4, p_min: 0.0 }).unwrap();
        let p = params(max_tokens, SamplerParams::greedy());
        let plain = generate(&mut target, &tok, &prompt, &p, &mut |_| Ok(())).unwrap();
        let plain_kv = target.tokens().to_vec();
        target.reset();
        let mut streamed = String::new();
        let fast = generate_speculative(&mut target, &mut spec, &tok, &prompt, &p, &mut |t| {
            streamed.push_str(t);
            Ok(())
        })
        .unwrap();
        let what = format!("n_ctx {n_ctx}, max_tokens {max_tokens}");
        assert_eq!(fast.generated_ids, plain.generated_ids, "{what}");
        assert_eq!((fast.stop, &fast.text, &streamed), (plain.stop, &plain.text, &plain.text), "{what}");
        assert_eq!(target.tokens(), &plain_kv[..], "{what}: the KV holds what plain decoding leaves");
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let f = GgufFile::open(common::model_path(DRAFT)).unwrap();
    let data = TokenizerData::from_gguf(&f).unwrap();
    let tok = Tokenizer::new(data.clone()).unwrap();
    // The real pair shares its vocabulary (so does the tiny Qwen3 fixture).
    check_vocab(&tok, &Tokenizer::from_gguf(&GgufFile::open(common::model_path(TARGET)).unwrap()).unwrap()).unwrap();
    check_vocab(&tok, &tok).unwrap();
    let refuse = |what: &str, edit: &dyn Fn(&mut TokenizerData)| {
        let mut d = data.clone();
        edit(&mut d);
        let err = check_vocab(&tok, &Tokenizer::new(d).unwrap()).unwrap_err();
        let msg = err.to_string();
        println!("{what}: {msg}");
        assert!(matches!(err, SpecError::Vocab(_)), "{what}");
        assert!(msg.starts_with("the draft model cannot draft for this target: ") && !msg.contains('\n'), "{what}: {msg}");
        msg
    };
    let n = data.tokens.len();
    let msg = refuse("fewer tokens", &|d| {
        d.tokens.truncate(n - 1);
        d.token_types.truncate(n - 1);
    });
    assert!(msg.contains(&format!("{n} tokens, the draft {}", n - 1)), "{msg}");
    let msg = refuse("two tokens swapped", &|d| d.tokens.swap(100, 101));
    assert!(msg.contains("token 100 is"), "{msg}");
    refuse("another EOS", &|d| d.eos_id = Some(0));
}

#[test]
fn bad_draft_settings_are_refused() {
    let (model, _) = load(TINY);
    let target = engine(&model, 64);
    let e = |p| Speculator::new(draft_beside(&model, &target), p).err().map(|e| e.to_string());
    assert_eq!(e(DraftParams { n_draft: 0, p_min: 0.0 }).as_deref(), Some("--draft-n must be at least 1"));
    assert!(e(DraftParams { n_draft: 4, p_min: 1.5 }).unwrap().contains("--draft-min-p = 1.5"));
    assert!(e(DraftParams { n_draft: 4, p_min: f32::NAN }).is_some());
    assert!(e(DraftParams { n_draft: 4, p_min: 0.5 }).is_none());
}
