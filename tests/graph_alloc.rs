//! The allocator (liveness, aliasing, KV regions, host I/O), the reuse cache and the CPU pool.

mod graph_support;

use graph_support::{MockBackend, Qwen2Shape, all_f32, params};
use minfer::backends::cpu::CpuBackend;
use minfer::graph::{
    Backend, BackendImpl, BackendScheduler, BufferUsage, CNode, ComputeGraph, DType, GraphAllocator, GraphBuilder, GraphCache,
    GraphError, GraphParams, KvProvider, NodeId, NodeMeta, NodeWork, Op, Prepared, RoPEMeta, RopeStyle, SplitWork,
    StructuralField, TensorRef,
};

fn sched() -> BackendScheduler {
    BackendScheduler::with_trace(false)
}

fn plan(g: &mut ComputeGraph) -> GraphAllocator {
    let mut alloc = minfer::backends::cpu_allocator();
    sched().assign_backends(g, &alloc);
    alloc.alloc_graph(g).unwrap();
    alloc
}

fn buf(alloc: &GraphAllocator, id: NodeId) -> TensorRef {
    alloc
        .node_tensor(id)
        .unwrap_or_else(|| panic!("node {id} has no buffer"))
}

// ---- liveness ----------------------------------------------------------------------------

/// The G3 regression: two inputs declared at the head; `x` is read early, `tail` only by the
/// last node. Between them a chain of equal-sized temporaries dies and frees buffers.
fn g3_graph() -> (ComputeGraph, NodeId, NodeId) {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let tail = b.input("tail", [4, 1, 1, 1], DType::F32);
    let mut h = b.add(x, x).unwrap();
    for _ in 0..6 {
        let s = b.mul(h, h).unwrap();
        h = b.add(s, h).unwrap();
    }
    let out = b.add(h, tail).unwrap();
    b.output(out).unwrap();
    (b.build(), x, tail)
}

#[test]
fn inputs_are_never_shared_or_clobbered() {
    let (mut g, x, tail) = g3_graph();
    let alloc = plan(&mut g);
    let (bx, bt) = (buf(&alloc, x), buf(&alloc, tail));
    assert!(!bx.overlaps(&bt), "two inputs never share a region");
    for node in g.nodes.iter().filter(|n| !n.is_input()) {
        let b = buf(&alloc, node.id);
        assert!(!b.overlaps(&bt), "{} reuses the late-read input's region", node.name);
        assert!(!b.overlaps(&bx), "{} reuses an input's region", node.name);
    }
    // And the numbers: fill, run, compare with the scalar reference.
    let mut alloc = alloc;
    let xv = [0.5f32, -0.25, 0.125, 1.0];
    let tv = [10.0f32, 20.0, 30.0, 40.0];
    alloc.fill_input(&g, "x", &xv).unwrap();
    alloc.fill_input(&g, "tail", &tv).unwrap();
    sched().execute(&g, &mut alloc).unwrap();
    let want: Vec<f32> = xv
        .iter()
        .zip(&tv)
        .map(|(&x, &t)| {
            let mut h = x + x;
            for _ in 0..6 {
                h += h * h;
            }
            h + t
        })
        .collect();
    assert_eq!(alloc.copy_to_cpu(g.outputs[0]).unwrap(), want);
}

#[test]
fn dead_temporaries_are_recycled_in_build_order() {
    let (mut g, _, _) = g3_graph();
    let alloc = plan(&mut g);
    // 2 inputs + at most 3 temporaries alive at once + the output, never one per node: each
    // 16-byte value takes one 64-byte aligned slot of the arena.
    let arena = alloc.arena_bytes(Backend::CPU);
    assert!(arena <= 6 * 64 && arena < g.nodes.len() * 64, "arena of {arena} bytes for {} nodes", g.nodes.len());
    // A value is never overwritten before its last reader: no node shares a buffer with a
    // source it reads (only in-place ops may, and this graph has none).
    for node in &g.nodes {
        for &s in &node.src {
            assert!(!buf(&alloc, s).overlaps(&buf(&alloc, node.id)), "{} overwrites its source", node.name);
        }
    }
}

#[test]
fn in_place_alias_only_for_the_sole_consumer_on_the_same_backend() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [8, 2, 1, 1], DType::F32);
    let pos = b.input("positions", [2, 1, 1, 1], DType::I32);
    let m = b.mul(x, x).unwrap(); // sole consumer: the silu below
    let s = b.silu(m).unwrap();
    let shared = b.add(s, x).unwrap(); // two consumers: silu and add
    let s2 = b.silu(shared).unwrap();
    let t = b.add(s2, shared).unwrap();
    let on_input = b.silu(x).unwrap(); // inputs are pinned
    let meta = RoPEMeta {
        n_head: 2,
        head_dim: 4,
        n_rot: 4,
        freq_base: 1e4,
    };
    let r = b.rope(t, pos, RopeStyle::NonInterleaved, meta).unwrap();
    let u = b.add(r, on_input).unwrap();
    let w = b.mul(u, u).unwrap();
    let s3 = b.silu(w).unwrap(); // assigned to another backend below
    b.output(s3).unwrap();
    let mut g = b.build();
    let mut alloc = minfer::backends::cpu_allocator();
    alloc
        .enable_backend(
            Backend::CUDA,
            Box::new(MockBackend::new(Backend::CUDA, all_f32, true)),
        )
        .unwrap();
    for n in &mut g.nodes {
        n.backend = Some(if n.id == s3 {
            Backend::CUDA
        } else {
            Backend::CPU
        });
    }
    alloc.alloc_graph(&g).unwrap();
    assert_eq!(
        buf(&alloc, s),
        buf(&alloc, m),
        "silu aliases its sole-consumer input"
    );
    assert_eq!(buf(&alloc, r), buf(&alloc, t), "rope aliases too");
    assert!(!buf(&alloc, s2).overlaps(&buf(&alloc, shared)), "two consumers: no alias");
    assert!(!buf(&alloc, on_input).overlaps(&buf(&alloc, x)), "an input is never aliased");
    assert!(!buf(&alloc, t).overlaps(&buf(&alloc, s2)), "add is not in-place");
    assert_eq!(buf(&alloc, s3).backend(), Backend::CUDA, "cross-backend: a region of its own backend");
}

#[test]
fn aliased_chains_keep_their_buffer_until_the_last_reader() {
    // m -> silu (alias) -> read much later; nothing in between may take m's buffer.
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let m = b.mul(x, x).unwrap();
    let s = b.silu(m).unwrap();
    let mut h = b.add(x, x).unwrap();
    for _ in 0..4 {
        h = b.mul(h, x).unwrap();
    }
    let out = b.add(h, s).unwrap();
    b.output(out).unwrap();
    let mut g = b.build();
    let mut alloc = plan(&mut g);
    let bs = buf(&alloc, s);
    for id in (s + 1)..out {
        assert!(!buf(&alloc, id).overlaps(&bs), "node {id} takes the aliased region while it is live");
    }
    let xv = [0.5f32, -1.0, 2.0, 0.0];
    alloc.fill_input(&g, "x", &xv).unwrap();
    sched().execute(&g, &mut alloc).unwrap();
    let want: Vec<f32> = xv
        .iter()
        .map(|&x| (x + x) * x * x * x * x + silu(x * x))
        .collect();
    assert_eq!(alloc.copy_to_cpu(out).unwrap(), want);
}

#[test]
fn fused_graph_executes_and_its_orphan_gets_no_buffer() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [5, 1, 1, 1], DType::F32);
    let y = b.input("y", [5, 1, 1, 1], DType::F32);
    let s = b.silu(x).unwrap();
    let m = b.mul(s, y).unwrap();
    let out = b.add(m, x).unwrap();
    b.output(out).unwrap();
    let mut g = b.build();
    let mut alloc = minfer::backends::cpu_allocator();
    sched().assign_backends(&mut g, &alloc);
    assert_eq!(minfer::graph::FusionPass::new().run(&mut g, &alloc), 1);
    alloc.alloc_graph(&g).unwrap();
    assert_eq!(alloc.node_tensor(s), None, "the orphaned silu is dead");
    let xv = [-3.0f32, -0.5, 0.0, 0.5, 3.0];
    let yv = [1.5f32, 2.0, -1.0, 4.0, 0.25];
    alloc.fill_input(&g, "x", &xv).unwrap();
    alloc.fill_input(&g, "y", &yv).unwrap();
    sched().execute(&g, &mut alloc).unwrap();
    let want: Vec<f32> = xv.iter().zip(&yv).map(|(&x, &y)| silu(x) * y + x).collect();
    assert_eq!(
        alloc.copy_to_cpu(out).unwrap(),
        want,
        "fused output is bit-identical"
    );
}

#[test]
fn unassigned_live_nodes_are_refused() {
    let (g, _, _) = g3_graph();
    let mut alloc = minfer::backends::cpu_allocator();
    assert!(matches!(
        alloc.alloc_graph(&g),
        Err(GraphError::Unassigned { .. })
    ));
}

// ---- host I/O ----------------------------------------------------------------------------

#[test]
fn inputs_are_filled_exactly() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [3, 1, 1, 1], DType::F32);
    let ids = b.input("token_ids", [3, 1, 1, 1], DType::I32);
    let s = b.add(x, x).unwrap();
    b.output(s).unwrap();
    let mut g = b.build();
    let mut alloc = plan(&mut g);
    assert!(matches!(
        alloc.fill_input(&g, "x", &[1.0, 2.0]),
        Err(GraphError::InputLength {
            expected: 3,
            got: 2,
            ..
        })
    ));
    assert!(matches!(
        alloc.fill_input(&g, "nope", &[1.0]),
        Err(GraphError::NoSuchInput { .. })
    ));
    assert!(matches!(
        alloc.fill_input(&g, "token_ids", &[1.0, 2.0, 3.0]),
        Err(GraphError::InputDType {
            actual: DType::I32,
            requested: DType::F32,
            ..
        })
    ));
    assert!(matches!(
        alloc.fill_input_i32(&g, "x", &[1, 2, 3]),
        Err(GraphError::InputDType { .. })
    ));
    let tokens = [151_935, 0, -1];
    alloc.fill_input_i32(&g, "token_ids", &tokens).unwrap();
    let back: Vec<i32> = alloc
        .read_node_bytes(ids)
        .unwrap()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(back, tokens, "i32 values are stored as 4-byte integers");
    assert_eq!(alloc.node_tensor(ids).unwrap().dtype, DType::I32, "in a typed region");
    assert!(matches!(
        alloc.copy_to_cpu(99),
        Err(GraphError::NoBuffer { node: 99 })
    ));
}

// ---- KV regions and the reuse cache ------------------------------------------------------

fn tiny_cache() -> GraphCache {
    GraphCache::new(minfer::backends::cpu_allocator())
}

fn build_tiny(p: &GraphParams) -> Result<ComputeGraph, GraphError> {
    Qwen2Shape::tiny().build(p)
}

#[test]
fn allocator_survives_rebuild() {
    let shape = Qwen2Shape::tiny();
    let mut cache = tiny_cache();
    let prefill = params(5, 16);
    assert!(matches!(
        cache.prepare(&prefill, &sched(), build_tiny).unwrap(),
        Prepared::Built { fused: 2, .. }
    ));
    let pairs: Vec<_> = (0..shape.n_layer)
        .map(|l| cache.alloc().kv_pair(l).unwrap())
        .collect();
    let names: Vec<&str> = cache
        .alloc()
        .persistent()
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["kv.0.k", "kv.0.v", "kv.1.k", "kv.1.v"]);
    let region = shape.n_embd_kv() * 16;
    assert!(cache.alloc().persistent().iter().all(|p| p.bytes == 4 * region));
    // Stand-in for this step's KV store: written through the backend's set_tensor.
    let k: Vec<f32> = (0..region).map(|i| i as f32).collect();
    let v: Vec<f32> = (0..region).map(|i| -(i as f32)).collect();
    let alloc = cache.alloc_mut();
    alloc.write_kv(1, false, 0, bytemuck::cast_slice(&k)).unwrap();
    alloc.write_kv(1, true, 0, bytemuck::cast_slice(&v)).unwrap();

    // Prefill -> decode changes n_tokens and gtype: a rebuild, same allocator.
    let decode = params(1, 16);
    let Prepared::Built { .. } = cache.prepare(&decode, &sched(), build_tiny).unwrap() else {
        panic!("decode after prefill must rebuild");
    };
    let after: Vec<_> = (0..shape.n_layer)
        .map(|l| cache.alloc().kv_pair(l).unwrap())
        .collect();
    assert_eq!(after, pairs, "KV region ids survive the rebuild");
    let (mut kb, mut vb) = (vec![0u8; 4 * region], vec![0u8; 4 * region]);
    cache.alloc_mut().read_kv(1, false, 0, &mut kb).unwrap();
    cache.alloc_mut().read_kv(1, true, 0, &mut vb).unwrap();
    assert_eq!((kb.as_slice(), vb.as_slice()), (bytemuck::cast_slice(&k), bytemuck::cast_slice(&v)), "and so do their contents");
    assert_eq!(
        cache.alloc().persistent().len(),
        4,
        "no second set of regions"
    );
    // The graph's KV nodes bind the K region.
    let g = cache.graph().unwrap();
    let store = g.nodes.iter().find(|n| n.name == "kv_store-1").unwrap();
    assert_eq!(cache.alloc().node_tensor(store.id), Some(pairs[1].k));
}

#[test]
fn a_kv_region_of_another_size_is_refused_and_the_failed_plan_is_dropped() {
    let mut cache = tiny_cache();
    let p = params(5, 16);
    cache.prepare(&p, &sched(), build_tiny).unwrap();
    let allocs = cache.alloc().memory(Backend::CPU).unwrap().allocations;
    let err = cache
        .prepare(&params(5, 32), &sched(), build_tiny)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::KvRegionSize {
                layer: 0,
                have: 256,
                want: 512
            }
        ),
        "{err}"
    );
    // The old graph's buffers were released for the failed plan: it must not be reused.
    assert!(cache.graph().is_none() && !cache.try_reuse(&p));
    assert!(matches!(
        cache.prepare(&p, &sched(), build_tiny).unwrap(),
        Prepared::Built { .. }
    ));
    assert_eq!(
        cache.alloc().memory(Backend::CPU).unwrap().allocations,
        allocs,
        "the failed plan allocated nothing and the rebuild fits the arena"
    );
}

#[test]
fn executing_an_unplanned_graph_is_an_error_not_a_no_op() {
    let (mut g, _, _) = g3_graph();
    let mut alloc = minfer::backends::cpu_allocator();
    sched().assign_backends(&mut g, &alloc);
    let err = sched().execute(&g, &mut alloc).unwrap_err();
    assert!(
        matches!(err, GraphError::NotPlanned { planned: 0, .. }),
        "{err}"
    );
}

#[test]
fn reuse_requires_equal_params() {
    let mut cache = tiny_cache();
    let p = params(1, 16);
    assert!(!cache.try_reuse(&p), "nothing cached yet");
    let Prepared::Built { uid, .. } = cache.prepare(&p, &sched(), build_tiny).unwrap() else {
        panic!("first prepare builds");
    };
    assert_eq!(
        cache.prepare(&p, &sched(), build_tiny).unwrap(),
        Prepared::Reused { uid }
    );
    let changes: [fn(&mut GraphParams); 4] = [
        |p| p.n_tokens = 2,
        |p| p.n_out = 2,
        |p| p.weights_version = 2,
        |p| p.cparams.n_ctx = 32,
    ];
    for change in changes {
        let mut q = p;
        change(&mut q);
        assert!(!cache.try_reuse(&q), "{q:?} must not reuse {p:?}");
    }
    let mut q = p;
    q.gtype = minfer::graph::GraphType::Prefill;
    assert!(!cache.try_reuse(&q));
    assert!(cache.try_reuse(&p));
}

#[test]
fn cparams_are_part_of_the_reuse_identity() {
    let mut cache = tiny_cache();
    let p = params(1, 16);
    cache.prepare(&p, &sched(), build_tiny).unwrap();
    let mut q8 = p;
    q8.cparams.kv_type = minfer::graph::KvType::Q8_0;
    assert!(!cache.try_reuse(&q8), "another KV type is another graph");
    let mut device = p;
    device.cparams.gpu = true;
    assert!(!cache.try_reuse(&device), "a device taking part is another graph");
    let mut reloaded = p;
    reloaded.weights_version += 1;
    assert!(!cache.try_reuse(&reloaded));
    // And back: the other direction forces a rebuild too.
    cache.prepare(&reloaded, &sched(), build_tiny).unwrap();
    assert!(!cache.try_reuse(&p));
    cache.prepare(&p, &sched(), build_tiny).unwrap();
    assert!(cache.try_reuse(&p));
}

#[test]
fn uid_is_monotonic_and_kept_on_reuse() {
    let mut cache = tiny_cache();
    let mut last = 0;
    for n in [3, 1, 3] {
        let p = params(n, 16);
        let Prepared::Built { uid, .. } = cache.prepare(&p, &sched(), build_tiny).unwrap() else {
            panic!("params changed: must build");
        };
        assert!(uid > last, "uid {uid} after {last}");
        assert_eq!(cache.graph().unwrap().uid, uid);
        assert_eq!(
            cache.prepare(&p, &sched(), build_tiny).unwrap(),
            Prepared::Reused { uid }
        );
        assert_eq!(cache.graph().unwrap().uid, uid);
        last = uid;
    }
    let g = build_tiny(&params(2, 16)).unwrap();
    assert_eq!(g.uid, 0, "only the cache assigns uids");
    let direct = cache.replace_graph(g, params(2, 16));
    assert!(direct > last);
}

#[test]
fn structural_check_detects_different_graph() {
    let mut cache = tiny_cache();
    let p = params(4, 16);
    cache.prepare(&p, &sched(), build_tiny).unwrap();
    // Same params, rebuilt and passed through the same passes: identical.
    let mut same = build_tiny(&p).unwrap();
    sched().assign_backends(&mut same, cache.alloc());
    minfer::graph::FusionPass::new().run(&mut same, cache.alloc());
    cache.verify_structural(&same).unwrap();

    let mut extra = same.clone();
    let id = extra.nodes.len();
    extra.nodes.push(CNode {
        id,
        name: "extra".into(),
        ..extra.nodes[id - 1].clone()
    });
    assert!(matches!(
        cache.verify_structural(&extra),
        Err(GraphError::StructuralMismatch {
            field: StructuralField::NodeCount,
            ..
        })
    ));
    let mut eps = same.clone();
    let norm = eps
        .nodes
        .iter()
        .position(|n| matches!(n.op, Op::RmsNorm { .. }))
        .unwrap();
    eps.nodes[norm].op = Op::RmsNorm { eps: 1e-5 };
    assert!(matches!(
        cache.verify_structural(&eps),
        Err(GraphError::StructuralMismatch { node, field: StructuralField::Op }) if node == norm
    ));
    let mut weight = same.clone();
    if let NodeMeta::MatMul(m) = &mut weight.nodes[6].meta {
        m.weight_name = "blk.0.attn_v.weight".into();
    }
    assert!(matches!(
        cache.verify_structural(&weight),
        Err(GraphError::StructuralMismatch {
            node: 6,
            field: StructuralField::Meta
        })
    ));
    let mut src = same.clone();
    src.nodes[6].src = vec![3];
    assert!(matches!(
        cache.verify_structural(&src),
        Err(GraphError::StructuralMismatch {
            node: 6,
            field: StructuralField::Src
        })
    ));
    // Unfused vs fused is a different graph too.
    let unfused = build_tiny(&p).unwrap();
    assert!(cache.verify_structural(&unfused).is_err());
}

#[test]
fn debug_builds_check_the_reuse_invariant_on_every_reuse() {
    // A builder that is not a function of its params: the eps drifts between calls.
    let calls = std::cell::Cell::new(0u32);
    let drifting = |p: &GraphParams| {
        calls.set(calls.get() + 1);
        let mut shape = Qwen2Shape::tiny();
        shape.eps = 1e-6 * calls.get() as f32;
        shape.build(p)
    };
    let mut cache = tiny_cache();
    let p = params(1, 16);
    cache.prepare(&p, &sched(), drifting).unwrap();
    let reused = cache.prepare(&p, &sched(), drifting);
    if cfg!(debug_assertions) {
        assert!(matches!(
            reused,
            Err(GraphError::StructuralMismatch {
                field: StructuralField::Op,
                ..
            })
        ));
    } else {
        assert!(
            matches!(reused, Ok(Prepared::Reused { .. })),
            "release builds trust the params"
        );
    }
}

// ---- CPU backend ---------------------------------------------------------------------------

#[test]
fn cpu_buffers_are_zeroed_bounded_and_counted() {
    let mut cpu = CpuBackend::new().with_cap(Some(1000));
    let a = cpu.alloc_buffer(400, BufferUsage::Compute).unwrap();
    let t = TensorRef { buf: minfer::graph::BufRef { backend: Backend::CPU, id: a }, offset: 64, bytes: 16, dtype: DType::F32 };
    let mut out = [0xffu8; 16];
    cpu.get_tensor(t, 0, &mut out).unwrap();
    assert_eq!(out, [0; 16], "new buffers are zero-filled");
    cpu.set_tensor(t, 4, &[1, 2, 3, 4]).unwrap();
    cpu.get_tensor(t, 4, &mut out[..4]).unwrap();
    assert_eq!(out[..4], [1, 2, 3, 4]);
    // Reads and writes stay inside the region they name.
    assert!(matches!(cpu.set_tensor(t, 14, &[0; 4]), Err(GraphError::TensorRange { .. })));
    let past = TensorRef { offset: 390, ..t };
    assert!(matches!(cpu.get_tensor(past, 0, &mut out), Err(GraphError::TensorRange { .. })));
    // The cap: 400 + 500 fits, another 200 does not, and the refusal names the sizes.
    let b = cpu.alloc_buffer(500, BufferUsage::Kv).unwrap();
    let oom = cpu.alloc_buffer(200, BufferUsage::Kv).unwrap_err();
    assert_eq!((oom.backend, oom.requested, oom.in_use, oom.capacity), (Backend::CPU, 200, 900, Some(1000)));
    assert_eq!(oom.to_string(), "cpu: out of memory allocating 200 bytes for a KV region (900 bytes in use, cap 1000 bytes)");
    cpu.free_buffer(b);
    cpu.free_buffer(b); // a double free is ignored
    let m = cpu.memory();
    assert_eq!((m.allocations, m.frees, m.bytes_in_use, m.peak_bytes), (2, 1, 400, 900));
    assert_eq!(cpu.buffer_size(b), None);
    assert!(matches!(cpu.get_tensor(TensorRef { buf: minfer::graph::BufRef { backend: Backend::CPU, id: b }, ..t }, 0, &mut out), Err(GraphError::BadBufferId { .. })));
}

fn cpu_node(op: Op, src: &[NodeId], len: usize) -> CNode {
    CNode {
        id: 0,
        name: "node-9".into(),
        op,
        src: src.to_vec(),
        out_shape: [len, 1, 1, 1],
        out_dtype: DType::F32,
        layer: Some(9),
        backend: Some(Backend::CPU),
        meta: NodeMeta::None,
    }
}

/// Runs `node` alone on `cpu` with operands `srcs` into `out` (a one-node split).
fn run_one(cpu: &mut CpuBackend, node: CNode, srcs: &[TensorRef], out: TensorRef) -> Result<(), GraphError> {
    let graph = ComputeGraph { nodes: vec![node], ..Default::default() };
    let work = [NodeWork { node: 0, out, srcs: srcs.to_vec(), kv: None }];
    cpu.compute(&SplitWork { graph: &graph, backend: Backend::CPU, nodes: &work })
}

#[test]
fn cpu_swiglu_is_bit_identical_to_silu_then_mul() {
    let mut cpu = CpuBackend::new();
    let n = 257;
    let arena = cpu.alloc_buffer(5 * 1088, BufferUsage::Compute).unwrap();
    let at = |i: usize| TensorRef { buf: minfer::graph::BufRef { backend: Backend::CPU, id: arena }, offset: i * 1088, bytes: 4 * n, dtype: DType::F32 };
    let gate: Vec<f32> = (0..n).map(|i| (i as f32 - 128.0) * 0.173).collect();
    let up: Vec<f32> = (0..n).map(|i| 1.0 / (i as f32 + 0.5) - 0.3).collect();
    let (g, u, s, m, f) = (at(0), at(1), at(2), at(3), at(4));
    cpu.set_tensor(g, 0, bytemuck::cast_slice(&gate)).unwrap();
    cpu.set_tensor(u, 0, bytemuck::cast_slice(&up)).unwrap();
    run_one(&mut cpu, cpu_node(Op::Silu, &[0], n), &[g], s).unwrap();
    run_one(&mut cpu, cpu_node(Op::Mul, &[0, 1], n), &[s, u], m).unwrap();
    run_one(&mut cpu, cpu_node(Op::SwiGLU, &[0, 1], n), &[g, u], f).unwrap();
    let bytes = |cpu: &mut CpuBackend, t: TensorRef| {
        let mut b = vec![0u8; t.bytes];
        cpu.get_tensor(t, 0, &mut b).unwrap();
        b
    };
    assert_eq!(bytes(&mut cpu, f), bytes(&mut cpu, m));
    // In place: swiglu over its gate, then silu over its own input.
    let g2 = at(2);
    cpu.set_tensor(g2, 0, bytemuck::cast_slice(&gate)).unwrap();
    run_one(&mut cpu, cpu_node(Op::SwiGLU, &[0, 1], n), &[g2, u], g2).unwrap();
    assert_eq!(bytes(&mut cpu, g2), bytes(&mut cpu, f), "in-place swiglu has the out-of-place bits");
    run_one(&mut cpu, cpu_node(Op::Silu, &[0], n), &[g], s).unwrap();
    let s_bits = bytes(&mut cpu, s);
    run_one(&mut cpu, cpu_node(Op::Silu, &[0], n), &[g], g).unwrap();
    assert_eq!(bytes(&mut cpu, g), s_bits);
}

#[test]
fn cpu_refuses_what_it_cannot_run_by_name() {
    let mut cpu = CpuBackend::new();
    let arena = cpu.alloc_buffer(256, BufferUsage::Compute).unwrap();
    let at = |i: usize, bytes: usize| TensorRef { buf: minfer::graph::BufRef { backend: Backend::CPU, id: arena }, offset: i * 64, bytes, dtype: DType::F32 };
    let (a, b) = (at(0, 16), at(1, 16));
    // A node the CPU does not claim (an f16 add) is refused by name, not computed.
    let mut f16 = cpu_node(Op::Add, &[0, 0], 4);
    f16.out_dtype = DType::F16;
    match run_one(&mut cpu, f16, &[a, a], b) {
        Err(GraphError::NoKernel { node, op: Op::Add }) => assert_eq!(node, "node-9"),
        other => panic!("expected NoKernel, got {other:?}"),
    }
    // A short operand: the kernel refuses it, naming the node.
    match run_one(&mut cpu, cpu_node(Op::Add, &[0, 0], 4), &[a, at(2, 12)], b) {
        Err(GraphError::Kernel { node, .. }) => assert_eq!(node, "node-9"),
        other => panic!("expected a kernel error for a short operand, got {other:?}"),
    }
    // An operand that straddles the output region is refused, not read half-written.
    let straddle = TensorRef { offset: 72, ..a };
    assert!(run_one(&mut cpu, cpu_node(Op::Add, &[0, 0], 4), &[a, straddle], at(1, 16)).is_err());
    // A kernel that needs metadata or weights says so instead of computing garbage.
    assert!(matches!(run_one(&mut cpu, cpu_node(Op::MatMul, &[0], 4), &[a], b), Err(GraphError::WrongMeta { expected: "matmul", .. })));
    assert!(matches!(run_one(&mut cpu, cpu_node(Op::RmsNorm { eps: 1e-6 }, &[0], 4), &[a], b), Err(GraphError::WrongMeta { expected: "norm", .. })));
    let foreign = TensorRef { buf: minfer::graph::BufRef { backend: Backend::METAL, id: arena }, ..a };
    assert!(matches!(
        run_one(&mut cpu, cpu_node(Op::Add, &[0, 0], 4), &[a, foreign], b),
        Err(GraphError::BackendMismatch { split: Backend::CPU, buffer: Backend::METAL, .. })
    ));
}

#[test]
fn a_pool_in_use_cannot_be_replaced() {
    let (mut g, _, _) = g3_graph();
    let mut alloc = plan(&mut g);
    let err = alloc
        .enable_backend(Backend::CPU, Box::new(CpuBackend::new()))
        .unwrap_err();
    assert!(matches!(
        err,
        GraphError::PoolInUse {
            backend: Backend::CPU
        }
    ));
    alloc.release();
    assert_eq!(alloc.node_tensor(0), None);
}

/// The CPU backend's silu of one value: ggml's `ggml_silu_f32` (libm `expf`), what a row too
/// short for a whole vector gets.
fn silu(x: f32) -> f32 {
    minfer::backends::cpu::kernels::expf::silu_libm(x)
}
