//! The backend seam, proven with a backend whose memory the host cannot see
//! (`tests/support/test_backend.rs`): for both test models, a prompt prefill and greedy decode
//! steps give **bit-identical** logits on the CPU alone and with the test backend taking
//! (a) every node, inputs included, (b) only the matrix products, (c) the odd layers. The test
//! backend runs the CPU's scalar reference kernels on host copies of its operands, so every
//! difference would be the seam's: a wrong staging copy, a region planned across another, a
//! weight read from the wrong place, a split cut in the wrong spot.
//!
//! Besides the logits, each placement checks its counts — splits of the prefill and the decode
//! graph, cross-backend copies (the test backend's `set_tensor` / `get_tensor` calls against the
//! splits' inputs), nodes run on each backend — against what the placement implies, and that
//! the test backend allocates nothing after the engine's reserve. A KV-edit test runs a context
//! shift (row moves through `copy_tensor`, the K-shift graph) with the KV on the test backend.

mod common;
#[path = "support/test_backend.rs"]
mod test_backend;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use minfer::backends::cpu::exec::KernelIsa;
use minfer::generate::{Engine, EngineParams, EngineShared};
use minfer::gguf::GgufFile;
use minfer::graph::{
    Backend, BackendImpl, BackendScheduler, BufRef, BufferId, BufferUsage, CParams, ComputeGraph, DType, FusionPass, GraphError,
    GraphParams, GraphType, MemoryStats, Op, Split, TensorRef, WeightId,
};
use minfer::workers::Pool;
use minfer::models::{Model, load_model};
use minfer::tokenizer::Tokenizer;
use test_backend::{CounterHandle, Counters, Everything, MatMuls, Nothing, OddLayers, Placement, Scrambled, TestBackend};

/// The handle the test backend is registered under.
const DEVICE: Backend = Backend::CUDA;
const N_CTX: usize = 64;
const DECODE_STEPS: usize = 8;
const PROMPT: &str = "The quick brown fox jumps over the lazy dog, and then";

fn load(name: &str) -> (Arc<Model>, Vec<u32>) {
    let f = GgufFile::open(common::model_path(name)).expect("model opens");
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer");
    let prompt = tok.encode(PROMPT, false);
    assert!((7..=20).contains(&prompt.len()), "{name}: prompt of {} tokens", prompt.len());
    (Arc::new(load_model(Arc::new(f)).expect("model loads")), prompt)
}

fn params() -> EngineParams {
    EngineParams { n_ctx: N_CTX, n_threads: 2, backends: None, trace: false, dump: None, memory_cap: None, ..EngineParams::default() }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Where the live nodes of a graph run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Census {
    /// Live non-input nodes per backend (the work items the backends run).
    nodes: BTreeMap<Backend, usize>,
    /// Input nodes per backend (host-filled there).
    inputs: BTreeMap<Backend, Vec<String>>,
    /// Live MatMul nodes per backend.
    matmuls: BTreeMap<Backend, usize>,
    /// The output node's backend.
    output: Option<Backend>,
    /// The weights the device's nodes read.
    device_weights: BTreeSet<WeightId>,
}

fn census(graph: &ComputeGraph) -> Census {
    let live = graph.live_mask();
    let mut c = Census::default();
    for node in graph.nodes.iter().filter(|n| live[n.id]) {
        let b = node.backend.expect("assigned");
        if node.is_input() {
            c.inputs.entry(b).or_default().push(node.name.clone());
            continue;
        }
        *c.nodes.entry(b).or_default() += 1;
        if b == DEVICE {
            c.device_weights.extend(node.weights());
        }
        if node.op == Op::MatMul {
            *c.matmuls.entry(b).or_default() += 1;
        }
    }
    c.output = graph.outputs.first().and_then(|&o| graph.nodes[o].backend);
    c
}

/// Copies the splits imply per evaluation: `(into the device, out of the device)` — the
/// sources staged into device splits, and those staged out of it into CPU splits (live
/// producers only: a dead node is never copied).
fn implied_copies(graph: &ComputeGraph, splits: &[Split]) -> (usize, usize) {
    let live = graph.live_mask();
    let (mut into, mut out) = (0, 0);
    for s in splits {
        for &src in s.inputs.iter().filter(|&&src| live[src]) {
            match (s.backend, graph.nodes[src].backend) {
                (DEVICE, _) => into += 1,
                (_, Some(DEVICE)) => out += 1,
                _ => {}
            }
        }
    }
    (into, out)
}

/// One evaluation, as observed.
#[derive(Debug, Clone)]
struct Step {
    logits: Vec<u32>,
    splits: Vec<Split>,
    census: Census,
    copies: (usize, usize),
    /// The test backend's counters during this evaluation.
    device: Option<Counters>,
    memory: BTreeMap<Backend, MemoryStats>,
}

/// Prefill of `prompt`, then `DECODE_STEPS` greedy steps; `forced`, when given, is the token
/// fed at each decode step (the reference's picks), so that a difference shows at its step.
fn drive(engine: &mut Engine, prompt: &[u32], forced: Option<&[u32]>, counters: Option<&CounterHandle>) -> (Vec<Step>, Vec<u32>) {
    let mut steps = Vec::new();
    let mut picks = Vec::new();
    let mut feed = prompt.to_vec();
    for step in 0..=DECODE_STEPS {
        let before = counters.map(CounterHandle::snapshot);
        let logits = match step {
            0 => engine.prefill(&feed, None).expect("prefill"),
            _ => engine.eval(&feed, 1).expect("decode step"),
        };
        let device = counters.zip(before).map(|(c, b)| c.snapshot().since(&b));
        let (graph, _) = engine.live_graph().expect("a graph ran");
        let splits = engine.splits().to_vec();
        let memory = engine.backends().into_iter().filter_map(|b| Some((b, engine.memory(b)?))).collect();
        steps.push(Step { copies: implied_copies(graph, &splits), census: census(graph), logits: bits(&logits), splits, device, memory });
        let pick = argmax(&logits);
        picks.push(pick);
        if step < DECODE_STEPS {
            feed = vec![forced.map_or(pick, |f| f[step])];
        }
    }
    (steps, picks)
}

struct Reference {
    isa: KernelIsa,
    model: Arc<Model>,
    prompt: Vec<u32>,
    steps: Vec<Step>,
    picks: Vec<u32>,
}

/// The CPU-only run: the production engine (`Engine::new`) for [`KernelIsa::Detected`]; for
/// another ISA a CPU backend running it (beside an idle test backend).
fn reference(name: &str, isa: KernelIsa) -> Reference {
    let (model, prompt) = load(name);
    let mut engine = match isa {
        KernelIsa::Detected => Engine::new(model.clone(), &params()).expect("cpu engine"),
        _ => {
            let shared = EngineShared::new(&model, 2).expect("shared");
            let (alloc, _) = test_backend::allocator::<Nothing>(DEVICE, shared.pool.clone(), isa).expect("allocator");
            Engine::with_allocator(model.clone(), &params(), &shared, alloc).expect("cpu engine")
        }
    };
    let (steps, picks) = drive(&mut engine, &prompt, None, None);
    for s in &steps {
        assert_eq!(s.splits.len(), 1, "the CPU alone runs one split");
        assert_eq!(s.splits[0].backend, Backend::CPU);
    }
    Reference { isa, model, prompt, steps, picks }
}

/// What a placement's run looked like, for the placement's own checks.
struct Observed {
    n_layer: usize,
    steps: Vec<Step>,
    /// Allocation counters right after the engine was built (the reserve).
    reserved: BTreeMap<Backend, MemoryStats>,
}

/// Runs placement `P` against the reference and checks what every placement must: bit-identical
/// logits and greedy picks, the device's counters equal to what the splits imply, no
/// allocation after the reserve.
fn run_placement<P: Placement>(name: &str, r: &Reference) -> Observed {
    let shared = EngineShared::new(&r.model, 2).expect("shared");
    let (alloc, counters) = test_backend::allocator::<P>(DEVICE, shared.pool.clone(), r.isa).expect("allocator");
    let mut engine = Engine::with_allocator(r.model.clone(), &params(), &shared, alloc).expect("engine with the test backend");
    assert_eq!(engine.backends(), vec![Backend::CPU, DEVICE]);
    let reserved: BTreeMap<Backend, MemoryStats> = engine.backends().into_iter().filter_map(|b| Some((b, engine.memory(b)?))).collect();
    let loaded = counters.snapshot();
    let (steps, picks) = drive(&mut engine, &r.prompt, Some(&r.picks[..DECODE_STEPS]), Some(&counters));
    let n_layer = r.model.hparams().n_layer as usize;
    let label = format!("{name} / {:?} / {}", r.isa, P::NAME);

    for (i, (got, want)) in steps.iter().zip(&r.steps).enumerate() {
        let first = got.logits.iter().zip(&want.logits).position(|(a, b)| a != b);
        assert!(first.is_none(), "{label}: step {i} logits differ from the CPU's (first at index {first:?})");
        assert_eq!(got.logits.len(), want.logits.len(), "{label}: step {i} logit count");
    }
    assert_eq!(picks, r.picks, "{label}: greedy picks");
    // The device was offered (and uploaded) exactly the weights its nodes read.
    assert_eq!(loaded.weights_loaded as usize, steps[0].census.device_weights.len(), "{label}: weights uploaded");
    assert_eq!(steps[0].census.device_weights, steps[1].census.device_weights, "{label}: prefill and decode read the same weights");

    for (i, s) in steps.iter().enumerate() {
        let d = s.device.as_ref().expect("counted");
        let kind = if i == 0 { "prefill" } else { "decode" };
        // Every device split ran, and every device node once.
        let device_splits = s.splits.iter().filter(|x| x.backend == DEVICE).count();
        assert_eq!(d.splits as usize, device_splits, "{label}: {kind} step {i}: device splits computed");
        assert_eq!(d.nodes as usize, s.census.nodes.get(&DEVICE).copied().unwrap_or(0), "{label}: {kind} step {i}: device nodes run");
        // Transfers: inputs filled on the device + sources staged into it; sources staged out of
        // it + the logits when the head ran there. Nothing else crosses.
        let fills = s.census.inputs.get(&DEVICE).map_or(0, Vec::len);
        let readback = usize::from(s.census.output == Some(DEVICE));
        assert_eq!(d.set_tensor as usize, fills + s.copies.0, "{label}: {kind} step {i}: set_tensor calls");
        assert_eq!(d.get_tensor as usize, s.copies.1 + readback, "{label}: {kind} step {i}: get_tensor calls");
        assert_eq!(d.copy_tensor, 0, "{label}: no KV edit, no copy_tensor");
        // Reserve once: nothing allocated or freed on any backend after the engine was built.
        for (b, m) in &s.memory {
            let at_reserve = reserved[b];
            assert_eq!((m.allocations, m.frees), (at_reserve.allocations, at_reserve.frees), "{label}: {kind} step {i}: {b} allocated after the reserve");
        }
    }

    let (pre, dec) = (&steps[0], &steps[1]);
    let cpu_nodes = |s: &Step| s.census.nodes.get(&Backend::CPU).copied().unwrap_or(0);
    let dev_nodes = |s: &Step| s.census.nodes.get(&DEVICE).copied().unwrap_or(0);
    let per_eval = |f: fn(&Counters) -> u64| steps.iter().map(|s| f(s.device.as_ref().unwrap()).to_string()).collect::<Vec<_>>().join(",");
    println!(
        "{label}: {n_layer} layers; splits prefill {} decode {}; nodes prefill cpu {} device {}, decode cpu {} device {}; \
         device set_tensor/eval [{}] get_tensor/eval [{}] syncs/eval [{}]; weights uploaded {} ({} bytes); \
         allocations at reserve {:?}; device memory {:?}",
        pre.splits.len(),
        dec.splits.len(),
        cpu_nodes(pre),
        dev_nodes(pre),
        cpu_nodes(dec),
        dev_nodes(dec),
        per_eval(|c| c.set_tensor),
        per_eval(|c| c.get_tensor),
        per_eval(|c| c.synchronize),
        loaded.weights_loaded,
        loaded.weight_bytes,
        reserved.iter().map(|(b, m)| (b.name(), m.allocations)).collect::<Vec<_>>(),
        steps.last().unwrap().memory.get(&DEVICE),
    );
    println!("{label}: device ops per decode step {:?}", dec.device.as_ref().unwrap().nodes_by_op);
    Observed { n_layer, steps, reserved }
}

fn placements(name: &str, isa: KernelIsa) {
    let r = reference(name, isa);
    println!("{name} / {isa:?}: prompt of {} tokens, greedy picks {:?}", r.prompt.len(), r.picks);

    // (a) Everything on the device, inputs included: one split, the CPU idle.
    let a = run_placement::<Everything>(name, &r);
    for (i, s) in a.steps.iter().enumerate() {
        assert_eq!(s.splits.len(), 1, "everything: step {i}: one split");
        assert_eq!(s.splits[0].backend, DEVICE);
        assert!(s.splits[0].inputs.is_empty() && s.splits[0].outputs.is_empty(), "everything: nothing crosses");
        assert_eq!(s.census.nodes.get(&Backend::CPU), None, "everything: the CPU runs no node");
        assert_eq!(s.census.inputs.get(&Backend::CPU), None, "everything: the CPU fills no input");
        let d = s.device.as_ref().unwrap();
        let n_inputs = if i == 0 { 3 } else { 2 }; // token_ids, positions (+ tail_ids in the prefill)
        assert_eq!((d.set_tensor, d.get_tensor), (n_inputs, 1), "everything: step {i}: the inputs in, the logits out");
        assert_eq!(d.splits, 1);
    }
    assert_eq!(a.reserved[&Backend::CPU].allocations, 0, "everything: the CPU allocated nothing");
    assert_eq!(a.reserved[&DEVICE].allocations as usize, 1 + 2 * a.n_layer, "everything: one arena and K, V per layer on the device");

    // (b) Only the matrix products: 4 device runs per layer (qkv, wo, gate+up, down) and the
    // head, each between CPU runs.
    let b = run_placement::<MatMuls>(name, &r);
    let l = b.n_layer;
    for (i, s) in b.steps.iter().enumerate() {
        assert_eq!(s.splits.len(), 8 * l + 2, "matmuls: step {i}: splits");
        assert_eq!(s.census.matmuls.get(&Backend::CPU), None, "matmuls: no matmul on the CPU");
        assert_eq!(s.census.nodes.get(&DEVICE).copied(), s.census.matmuls.get(&DEVICE).copied(), "matmuls: only matmuls on the device");
        assert_eq!(s.census.matmuls[&DEVICE], 7 * l + 1, "matmuls: step {i}: q k v o gate up down per layer, and the head");
        // In: the normed input of qkv, the attention output, the ffn norm, the swiglu, the
        // final norm. Out: q, k, v, wo, gate, up, down, and the logits.
        let d = s.device.as_ref().unwrap();
        assert_eq!((d.set_tensor as usize, d.get_tensor as usize), (4 * l + 1, 7 * l + 1), "matmuls: step {i}: copies");
    }
    assert_eq!(b.reserved[&DEVICE].allocations, 1, "matmuls: only the device's arena (the KV is the CPU's)");
    assert_eq!(b.reserved[&Backend::CPU].allocations as usize, 1 + 2 * l, "matmuls: the CPU's arena and every layer's KV");

    // (c) Alternating layers: the odd layers on the device, so about two splits per layer
    // pair; each device layer takes the residual stream and the positions in and gives its
    // output back.
    let c = run_placement::<OddLayers>(name, &r);
    let n_odd = l / 2;
    let last_odd = (l - 1) % 2 == 1;
    for (i, s) in c.steps.iter().enumerate() {
        assert_eq!(s.splits.len(), if l.is_multiple_of(2) { l + 1 } else { l }, "odd layers: step {i}: one split per layer, the head on the CPU");
        let device_splits = s.splits.iter().filter(|x| x.backend == DEVICE).count();
        assert_eq!(device_splits, n_odd, "odd layers: step {i}: one device split per odd layer");
        assert_eq!(s.census.output, Some(Backend::CPU));
        let d = s.device.as_ref().unwrap();
        let tail = usize::from(i == 0 && last_odd); // the prefill's tail ids, read in the last layer
        assert_eq!((d.set_tensor as usize, d.get_tensor as usize), (2 * n_odd + tail, n_odd), "odd layers: step {i}: copies");
        // Half the layer nodes: the device's share equals an odd layer's node count each.
        assert!(s.census.nodes[&DEVICE] > 0 && s.census.nodes[&Backend::CPU] > s.census.nodes[&DEVICE]);
    }
    assert_eq!(c.reserved[&DEVICE].allocations as usize, 1 + 2 * n_odd, "odd layers: the device's arena and its layers' KV");
    assert_eq!(c.reserved[&Backend::CPU].allocations as usize, 1 + 2 * (l - n_odd), "odd layers: the CPU's arena and its layers' KV");
}

#[test]
fn qwen2_placements_are_bit_identical_to_the_cpu() {
    placements(common::QWEN2_05B, KernelIsa::Detected);
}

#[test]
fn qwen3_tiny_placements_are_bit_identical_to_the_cpu() {
    placements(common::QWEN3_TINY, KernelIsa::Detected);
}

/// The same with the scalar reference kernels on both backends (the CPU's reference run too:
/// on x86 the SIMD matrix products do not round as the scalar ones do).
#[test]
fn qwen2_scalar_placements_are_bit_identical_to_the_scalar_cpu() {
    placements(common::QWEN2_05B, KernelIsa::Scalar);
}

#[test]
fn qwen3_tiny_scalar_placements_are_bit_identical_to_the_scalar_cpu() {
    placements(common::QWEN3_TINY, KernelIsa::Scalar);
}

/// KV edits where the KV lives on the device: a context shift moves rows with the device's
/// `copy_tensor` (overlapping, as `memmove`) and re-rotates K with the K-shift graph on the
/// device; a snapshot reads the rows in use back through `get_tensor`. Everything matches the
/// CPU bit for bit.
#[test]
fn context_shift_on_the_test_backend_matches_the_cpu() {
    let (model, prompt) = load(common::QWEN3_TINY);
    let (keep, discard) = (2, 4);
    let go = |engine: &mut Engine| -> (Vec<Vec<u32>>, minfer::generate::KvSnapshot) {
        let mut out = vec![bits(&engine.prefill(&prompt, None).unwrap())];
        engine.context_shift(keep, discard).expect("context shift");
        for &t in prompt.iter().rev().take(4) {
            out.push(bits(&engine.eval(&[t], 1).unwrap()));
        }
        (out, engine.kv_snapshot().expect("snapshot"))
    };
    let (want, want_kv) = go(&mut Engine::new(model.clone(), &params()).unwrap());
    let n_layer = model.hparams().n_layer as usize;
    fn with<P: Placement>(model: &Arc<Model>) -> (Engine, CounterHandle) {
        let shared = EngineShared::new(model, 2).unwrap();
        let (alloc, counters) = test_backend::allocator::<P>(DEVICE, shared.pool.clone(), KernelIsa::Detected).unwrap();
        (Engine::with_allocator(model.clone(), &params(), &shared, alloc).unwrap(), counters)
    }
    for (label, (mut engine, counters), device_layers) in [
        ("everything", with::<Everything>(&model), n_layer),
        ("odd layers", with::<OddLayers>(&model), n_layer / 2),
    ] {
        let (got, got_kv) = go(&mut engine);
        assert_eq!(got, want, "{label}: logits around a context shift");
        assert_eq!(got_kv, want_kv, "{label}: the KV after the shift");
        let c = counters.snapshot();
        // kv_rm moves the K and V rows of each device layer once; the K-shift graph runs one
        // kv_shift per device layer.
        assert_eq!(c.copy_tensor as usize, 2 * device_layers, "{label}: row moves on the device");
        assert_eq!(c.nodes_by_op.get("kv_shift").copied().unwrap_or(0) as usize, device_layers, "{label}: K-shift nodes on the device");
        println!("{label}: copy_tensor {} kv_shift nodes {} set_tensor {} get_tensor {}", c.copy_tensor, c.nodes_by_op.get("kv_shift").copied().unwrap_or(0), c.set_tensor, c.get_tensor);
    }
    // The CPU's KV restored onto the device (row writes through set_tensor) continues as the
    // CPU does.
    let next = prompt[0];
    let mut cpu = Engine::new(model.clone(), &params()).unwrap();
    cpu.kv_restore(&want_kv).unwrap();
    let want_next = bits(&cpu.eval(&[next], 1).unwrap());
    let (mut device, counters) = with::<Everything>(&model);
    let before = counters.snapshot();
    device.kv_restore(&want_kv).expect("restore onto the device");
    assert_eq!(counters.snapshot().since(&before).set_tensor as usize, 2 * n_layer, "one K and one V write per layer");
    assert_eq!(bits(&device.eval(&[next], 1).unwrap()), want_next, "after a restore onto the device");
}

/// The test backend itself: zero-filled buffers in a layout that is not the host's, exact
/// round trips at any offset, `memmove` copies, and errors (never panics) for every access
/// outside a region, a buffer, or to a buffer it does not have.
#[test]
fn test_backend_keeps_its_memory_behind_the_api() {
    // The layout: no byte of a non-trivial payload is stored as itself at its place.
    let plain: Vec<u8> = (0..=255u8).collect();
    let s = Scrambled::from_plain(&plain);
    assert_eq!(s.raw().len(), 256);
    assert!(s.raw().iter().zip(&plain).all(|(a, b)| a != b), "stored bytes differ from the host's");
    for at in 0..9 {
        for len in 0..(256 - at).min(23) {
            let mut out = vec![0u8; len];
            assert!(s.read(at, &mut out));
            assert_eq!(out, plain[at..at + len], "read {at}+{len}");
        }
    }
    assert!(!s.read(250, &mut [0u8; 7]) && !s.read(usize::MAX, &mut [0u8; 2]));

    let pool = Arc::new(Pool::new(1).unwrap());
    let mut b = TestBackend::new::<Everything>(DEVICE, pool.clone());
    let counters = b.counters();
    let id = b.alloc_buffer(101, BufferUsage::Compute).unwrap();
    assert_eq!(b.buffer_size(id), Some(101));
    let t = TensorRef { buf: BufRef { backend: DEVICE, id }, offset: 8, bytes: 40, dtype: DType::F32 };
    let mut out = vec![1u8; 40];
    b.get_tensor(t, 0, &mut out).unwrap();
    assert_eq!(out, vec![0u8; 40], "zero-filled");
    let data: Vec<u8> = (1..=37u8).collect();
    b.set_tensor(t, 3, &data).unwrap();
    b.get_tensor(t, 0, &mut out).unwrap();
    assert_eq!(&out[..3], &[0, 0, 0]);
    assert_eq!(&out[3..], &data[..]);

    let range = |r: Result<(), GraphError>| matches!(r, Err(GraphError::TensorRange { .. }));
    assert!(range(b.set_tensor(t, 4, &data)), "past the region's end");
    assert!(range(b.get_tensor(t, usize::MAX, &mut [0u8; 2])), "offset overflow");
    let outside = TensorRef { offset: 80, ..t }; // 80 + 40 > 101
    assert!(range(b.get_tensor(outside, 0, &mut [0u8; 1])), "a region past the buffer's end");
    assert!(range(b.copy_tensor(t, TensorRef { bytes: 20, ..t })), "copy of unequal sizes");
    let unknown = TensorRef { buf: BufRef { backend: DEVICE, id: BufferId(99) }, ..t };
    assert!(matches!(b.get_tensor(unknown, 0, &mut [0u8; 4]), Err(GraphError::BadBufferId { .. })));
    let foreign = TensorRef { buf: BufRef { backend: Backend::CPU, id }, ..t };
    assert!(matches!(b.set_tensor(foreign, 0, &[0u8; 4]), Err(GraphError::BackendMismatch { .. })));

    // Overlapping copies behave as memmove, both ways.
    let whole = TensorRef { offset: 0, bytes: 101, ..t };
    let pattern: Vec<u8> = (0..101u8).collect();
    b.set_tensor(whole, 0, &pattern).unwrap();
    let at = |offset, bytes| TensorRef { offset, bytes, ..t };
    b.copy_tensor(at(10, 50), at(13, 50)).unwrap();
    let mut got = vec![0u8; 101];
    b.get_tensor(whole, 0, &mut got).unwrap();
    let mut want = pattern.clone();
    want.copy_within(10..60, 13);
    assert_eq!(got, want, "copy up");
    b.copy_tensor(at(13, 50), at(9, 50)).unwrap();
    b.get_tensor(whole, 0, &mut got).unwrap();
    want.copy_within(13..63, 9);
    assert_eq!(got, want, "copy down");

    let c = counters.snapshot();
    assert_eq!((c.set_tensor, c.get_tensor, c.copy_tensor), (2, 4, 2), "only successful calls count");
    b.free_buffer(id);
    assert!(matches!(b.get_tensor(t, 0, &mut out), Err(GraphError::BadBufferId { .. })), "a freed buffer");
    let m = b.memory();
    assert_eq!((m.allocations, m.frees, m.bytes_in_use, m.peak_bytes), (1, 1, 0, 101));
    let mut capped = TestBackend::new::<Everything>(DEVICE, pool).with_cap(Some(64));
    assert!(capped.alloc_buffer(65, BufferUsage::Kv).is_err_and(|e| e.requested == 65 && e.backend == DEVICE));
    assert!(capped.alloc_buffer(64, BufferUsage::Kv).is_ok());
}

/// A node whose weight the device was not offered fails by name (the test backend answers
/// kernels only from its own uploaded copies); once offered, the same plan runs.
#[test]
fn a_weight_not_offered_to_the_test_backend_is_an_error() {
    let (model, prompt) = load(common::QWEN3_TINY);
    let shared = EngineShared::new(&model, 2).unwrap();
    let (mut alloc, counters) = test_backend::allocator::<Everything>(DEVICE, shared.pool.clone(), KernelIsa::Detected).unwrap();
    let p = GraphParams { n_tokens: 1, n_out: 1, output: Default::default(), gtype: GraphType::for_tokens(1), cparams: CParams { n_ctx: N_CTX, n_seq: 1, gpu: false, kv_type: Default::default() }, weights_version: 1 };
    let mut graph = model.def.build_graph(&p).unwrap();
    let sched = BackendScheduler::with_trace(false);
    sched.assign_backends(&mut graph, &alloc);
    FusionPass::new().run(&mut graph, &alloc);
    alloc.alloc_graph(&graph).unwrap();
    let fill = |alloc: &mut minfer::graph::GraphAllocator| {
        alloc.fill_input_i32(&graph, "token_ids", &[prompt[0] as i32]).unwrap();
        alloc.fill_input_i32(&graph, "positions", &[0]).unwrap();
    };
    fill(&mut alloc);
    let err = shared.pool.install(|| sched.execute(&graph, &mut alloc)).unwrap_err();
    assert!(
        // (Nothing was offered, so the backend knows no names yet: the weight is named by id.)
        matches!(&err, GraphError::WeightNotLoaded { node, backend, .. } if node == "token_embd" && *backend == DEVICE),
        "{err}"
    );
    let ids: BTreeSet<WeightId> = graph.nodes.iter().flat_map(|n| n.weights()).collect();
    let ids: Vec<WeightId> = ids.into_iter().collect();
    // Offered all but the embedding: still refused, now by name.
    let embd = shared.weights.id_of("token_embd.weight").expect("embedding weight");
    let others: Vec<WeightId> = ids.iter().copied().filter(|&i| i != embd).collect();
    alloc.pool_mut(DEVICE).unwrap().load_weights(&shared.weights, &others).unwrap();
    fill(&mut alloc);
    let err = shared.pool.install(|| sched.execute(&graph, &mut alloc)).unwrap_err();
    assert!(
        matches!(&err, GraphError::WeightNotLoaded { node, weight, .. } if node == "token_embd" && weight == "token_embd.weight"),
        "{err}"
    );
    alloc.pool_mut(DEVICE).unwrap().load_weights(&shared.weights, &[embd]).unwrap();
    fill(&mut alloc);
    shared.pool.install(|| sched.execute(&graph, &mut alloc)).expect("runs once offered");
    assert_eq!(counters.snapshot().weights_loaded as usize, ids.len());
}

/// The registry entry is a usable backend: probed, created through its `create` function, and
/// its capability matrix is the created backend's answer.
#[test]
fn registry_entry_creates_the_test_backend() {
    let registry = test_backend::registry_with::<MatMuls>(DEVICE);
    let entry = registry.entry(DEVICE).expect("entry");
    assert!(entry.usable_here());
    assert_eq!(entry.probed.as_ref().map(|d| d.name.as_str()), Ok(test_backend::DEVICE_NAME));
    let caps = entry.capabilities.expect("capabilities");
    let pool = Arc::new(Pool::new(1).unwrap());
    let config = minfer::graph::BackendConfig { n_threads: 1, workers: Some(pool), memory_cap: Some(1 << 20) };
    let mut created = entry.instantiate(&config).expect("created");
    let node = |op: Op| minfer::graph::CNode {
        id: 0,
        name: "n".into(),
        op,
        src: Vec::new(),
        out_shape: [4, 1, 1, 1],
        out_dtype: DType::F32,
        layer: None,
        backend: None,
        meta: minfer::graph::NodeMeta::None,
    };
    for op in [Op::MatMul, Op::Add, Op::Input, Op::Attn] {
        let n = node(op.clone());
        assert_eq!(created.supports_node(&n), (caps.supports_node)(&n), "{op:?}");
        assert_eq!(created.supports_node(&n), op == Op::MatMul, "{op:?}");
    }
    assert!(created.alloc_buffer(2 << 20, BufferUsage::Compute).is_err(), "the config's cap");
    // The build's own allocator setup enables it like any compiled-in device.
    let mut alloc = minfer::graph::GraphAllocator::new(registry.clone(), minfer::graph::BackendFence::all());
    let enabled = minfer::backends::enable_all(&mut alloc, &config).expect("enable_all");
    assert_eq!(enabled, vec![DEVICE, Backend::CPU], "priority order: the device first");
}
