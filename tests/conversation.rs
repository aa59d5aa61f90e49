//! The conversation engine and the KV edits under it: a multi-turn conversation equals
//! from-scratch greedy runs over its transcripts and prefills only new tokens; `kv_rm` /
//! `kv_shift` move cells the way a fresh evaluation at the new positions would place them;
//! context shift keeps a conversation going past `n_ctx`.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use minfer::chat::{ChatMessage, ChatTemplate, RenderOptions};
use minfer::generate::{
    Conversation, ConversationError, ConversationParams, Engine, EngineError, EngineParams, GenerateParams, SamplerParams, generate,
};
use minfer::gguf::GgufFile;
use minfer::graph::KvType;
use minfer::models::{Model, load_model};
use minfer::tokenizer::Tokenizer;

struct Fixture {
    model: Arc<Model>,
    tok: Tokenizer,
    template: ChatTemplate,
    render: RenderOptions,
}

fn fixture(name: &str) -> Fixture {
    let f = GgufFile::open(common::model_path(name)).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let template = ChatTemplate::new("t", f.get_str("tokenizer.chat_template").unwrap()).unwrap();
    let render = RenderOptions::for_tokenizer(&tok);
    Fixture { model: Arc::new(load_model(Arc::new(f)).unwrap()), tok, template, render }
}

fn engine(fx: &Fixture, n_ctx: usize) -> Engine {
    Engine::new(fx.model.clone(), &EngineParams { n_ctx, n_threads: 2, ..EngineParams::default() }).unwrap()
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, sampler: SamplerParams::greedy(), stop: vec![], ubatch: None, n_probs: None, post_sampling_probs: false, grammar: None }
}

fn params(system: Option<&str>, context_shift: bool, max_tokens: usize) -> ConversationParams {
    ConversationParams { system: system.map(str::to_string), keep: None, context_shift, generate: greedy(max_tokens) }
}

fn say(c: &mut Conversation, text: &str) -> Result<minfer::generate::Turn, ConversationError> {
    c.turn(text, &AtomicBool::new(false), &mut |_| Ok(()))
}

#[test]
fn three_turns_equal_from_scratch_runs_and_prefill_only_new_tokens() {
    let fx = fixture(common::QWEN2_05B);
    let system = "You are a helpful assistant. Answer briefly.";
    let mut c = Conversation::new(engine(&fx, 2048), &fx.tok, &fx.template, fx.render.clone(), params(Some(system), false, 40)).unwrap();
    let users = ["My name is Ada and I like tea.", "What is my name?", "And what do I like to drink?"];
    let mut transcript = vec![ChatMessage::system(system)];
    for (k, user) in users.iter().enumerate() {
        let kv_before = c.engine().n_past();
        let turn = say(&mut c, user).unwrap();
        transcript.push(ChatMessage::user(*user));
        let text = fx.template.render(&transcript, &RenderOptions { add_generation_prompt: true, ..fx.render.clone() }).unwrap();
        let full = fx.tok.encode_prompt(&text, true);
        // from scratch: a fresh engine over the whole transcript
        let mut fresh = engine(&fx, 2048);
        let g = generate(&mut fresh, &fx.tok, &full, &greedy(40), &mut |_| Ok(())).unwrap();
        assert_eq!(turn.generated_ids, g.generated_ids, "turn {k}: {:?} vs {:?}", turn.text, g.text);
        assert_eq!(turn.text, g.text);
        eprintln!("turn {k}: prefilled {} of {} tokens, answer {:?}", turn.stats.n_prefilled, full.len(), turn.text);
        // only what the KV did not hold was prefilled: nothing of the history again
        assert_eq!(turn.stats.n_prefilled, full.len() - kv_before, "turn {k}");
        if k > 0 {
            assert!(turn.stats.n_prefilled < 30, "turn {k} prefilled {}", turn.stats.n_prefilled);
        }
        transcript.push(ChatMessage::assistant(turn.text.clone()));
    }
    assert!(c.messages()[4].content.as_ref().unwrap().as_str().unwrap().contains("Ada"), "{:?}", c.messages()[4]);
}

#[test]
fn kv_rm_and_shift_match_a_fresh_evaluation_at_the_new_positions() {
    let fx = fixture(common::QWEN3_TINY);
    let hp = fx.model.hparams();
    let (head_dim, width) = (hp.head_dim as usize, (hp.n_head_kv * hp.head_dim) as usize);
    let ids: Vec<u32> = vec![9707, 11, 1879, 0, 374, 264, 1273, 13];
    // f32 cells: the rotation is computed in f32, |error| ~ 1e-6 of the row's scale; q8_0
    // cells are decoded, rotated and quantized again: within two quantization steps.
    for (kv_type, tol) in [(KvType::F32, 1e-5f32), (KvType::Q8_0, 2.0 / 127.0)] {
        let mk = || Engine::new(fx.model.clone(), &EngineParams { n_seq: 1, n_ubatch: minfer::generate::DEFAULT_UBATCH, memory_cap: None, n_ctx: 64, n_threads: 2, kv_type, ..EngineParams::default() }).unwrap();
        let mut e = mk();
        e.eval(&ids, 1).unwrap();
        // drop cells 2..5, move the survivors 5..8 down by 3
        e.kv_rm(2, 5).unwrap();
        assert!(matches!(e.eval(&[1], 1), Err(EngineError::KvNotAligned { cell: 2, pos: 5 })));
        e.kv_shift(2, 5, -3).unwrap();
        let kept: Vec<u32> = [&ids[..2], &ids[5..]].concat();
        assert_eq!(e.tokens(), &kept[..]);
        assert_eq!(e.kv_positions(), &[0, 1, 2, 3, 4]);
        let shifted = e.kv_snapshot().unwrap();
        let mut fresh = mk();
        fresh.eval(&kept, 1).unwrap();
        let want = fresh.kv_snapshot().unwrap();
        // Layer 0's K and V rows depend on the token and its position only: V moves verbatim
        // (the same bytes), K is rotated by -3 positions, which equals rotating it to its new
        // position up to rounding.
        assert_eq!(shifted.layers[0].1, want.layers[0].1, "{kv_type}");
        let (k, _) = shifted.rows_f32(0, width, head_dim).unwrap();
        let (wk, _) = want.rows_f32(0, width, head_dim).unwrap();
        let scale = wk.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = k.iter().zip(&wk).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= tol * scale.max(1.0), "{kv_type}: max |dK| {err} (scale {scale})");
        // cells before the removed range did not move at all
        let rb = shifted.row_bytes;
        assert_eq!(&shifted.layers[0].0[..2 * rb], &want.layers[0].0[..2 * rb], "{kv_type}");
        // the edited engine evaluates on
        assert!(e.eval(&[11], 1).unwrap().iter().all(|x| x.is_finite()));
        // bad ranges are refused and change nothing
        assert!(matches!(e.kv_rm(3, 99), Err(EngineError::KvRange { .. })));
        assert!(matches!(e.kv_shift(0, 2, -1), Err(EngineError::KvShiftBelowZero { .. })));
        assert_eq!(e.n_past(), 6);
    }
}

#[test]
fn context_shift_keeps_a_conversation_going_and_no_shift_is_an_error() {
    let fx = fixture(common::QWEN2_05B);
    let system = "You are a terse assistant.";
    let n_ctx = 160;
    let mut c = Conversation::new(engine(&fx, n_ctx), &fx.tok, &fx.template, fx.render.clone(), params(Some(system), true, 48)).unwrap();
    let keep = c.keep();
    let system_tokens =
        fx.tok.encode_prompt(&fx.template.render(&[ChatMessage::system(system)], &fx.render).unwrap(), true);
    assert_eq!(keep, system_tokens.len());
    let mut discarded = 0;
    for q in ["Name a color.", "Name a fruit.", "Name an animal.", "Name a city.", "Name a planet.", "What is 2 + 2?"] {
        let turn = say(&mut c, q).unwrap();
        discarded += turn.stats.n_discarded;
        assert!(!turn.generated_ids.is_empty());
        let e = c.engine();
        assert!(e.n_past() <= n_ctx);
        // the system prompt is retained, every cell is at its position, and the history is
        // the KV with the dropped tokens put back after the kept ones
        assert_eq!(&e.tokens()[..keep], &system_tokens[..]);
        assert_eq!(e.kv_positions(), &(0..e.n_past() as i32).collect::<Vec<_>>()[..]);
        let h = c.history();
        assert_eq!(h.len(), e.n_past() + c.dropped().len());
        assert_eq!(&h[keep + c.dropped().len()..], &e.tokens()[keep..]);
    }
    assert!(discarded > 0, "the conversation never filled the context");
    let last = c.messages().last().unwrap().content.clone().unwrap();
    assert!(last.as_str().unwrap().contains('4'), "{last}");

    let mut strict = Conversation::new(engine(&fx, n_ctx), &fx.tok, &fx.template, fx.render.clone(), params(Some(system), false, 48)).unwrap();
    let err = (0..10).find_map(|i| say(&mut strict, &format!("Tell me fact number {i} about the sea.")).err()).expect("the context fills up");
    assert!(matches!(err, ConversationError::ContextFull { n_ctx: 160, .. }), "{err}");
    assert!(err.to_string().contains("context shift"));
}

/// Gemma 3's K-shift re-rotates each layer with its own RoPE base: the windowed layers with
/// `rope.freq_base_swa` (10000), the global ones (5, 11, 17) with the file's 1e6. Layer 0
/// (windowed) of a shifted cache equals a fresh evaluation at the new positions up to rounding
/// (deeper layers saw the dropped tokens, so only layer 0 is comparable).
#[test]
fn gemma3_kv_shift_rotates_each_layer_with_its_base() {
    let f = GgufFile::open(common::model_path(common::GEMMA3)).unwrap();
    let model = Arc::new(load_model(Arc::new(f)).unwrap());
    let hp = model.hparams().clone();
    let p = minfer::graph::GraphParams {
        n_tokens: 1,
        n_out: 1,
        output: Default::default(),
        gtype: minfer::graph::GraphType::for_tokens(1),
        cparams: minfer::graph::CParams { n_ctx: 64, n_seq: 1, gpu: false, kv_type: KvType::F32 },
        weights_version: 1,
    };
    let g = model.def.build_kv_shift(&p).unwrap();
    let bases: Vec<f32> = g
        .nodes
        .iter()
        .filter_map(|n| match &n.meta {
            minfer::graph::NodeMeta::KvShift(m) => Some(m.rope.freq_base),
            _ => None,
        })
        .collect();
    let want: Vec<f32> = (0..18).map(|il| if il % 6 == 5 { 1e6 } else { 1e4 }).collect();
    assert_eq!(bases, want);

    let (head_dim, width) = (hp.head_dim as usize, (hp.n_head_kv * hp.head_dim) as usize);
    let ids: Vec<u32> = vec![2, 818, 5279, 529, 7001, 563, 496, 3207, 236761];
    let mk = || Engine::new(model.clone(), &EngineParams { n_ctx: 64, n_threads: 2, ..EngineParams::default() }).unwrap();
    let mut e = mk();
    e.eval(&ids, 1).unwrap();
    e.kv_rm(2, 6).unwrap();
    e.kv_shift(2, 5, -4).unwrap();
    let kept: Vec<u32> = [&ids[..2], &ids[6..]].concat();
    let shifted = e.kv_snapshot().unwrap();
    let mut fresh = mk();
    fresh.eval(&kept, 1).unwrap();
    let want = fresh.kv_snapshot().unwrap();
    let (k, _) = shifted.rows_f32(0, width, head_dim).unwrap();
    let (wk, _) = want.rows_f32(0, width, head_dim).unwrap();
    let scale = wk.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = k.iter().zip(&wk).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= 1e-5 * scale.max(1.0), "max |dK| {err} (scale {scale})");
}
