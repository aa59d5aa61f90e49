//! The allocator (liveness, aliasing, KV regions, host I/O), the reuse cache and the CPU pool.

mod graph_support;

use graph_support::{MockBackend, Qwen2Shape, all_f32, params};
use minfer::graph::{
    Backend, BackendImpl, BackendScheduler, BufRef, CNode, ComputeGraph, CpuBackend, DType,
    GraphAllocator, GraphBuilder, GraphCache, GraphError, GraphParams, KvProvider, NodeId,
    NodeMeta, Op, Prepared, RoPEMeta, RopeStyle, StructuralField,
};

fn sched() -> BackendScheduler {
    BackendScheduler::with_trace(false)
}

fn plan(g: &mut ComputeGraph) -> GraphAllocator {
    let mut alloc = GraphAllocator::cpu_only();
    sched().assign_backends(g, &alloc);
    alloc.alloc_graph(g).unwrap();
    alloc
}

fn buf(alloc: &GraphAllocator, id: NodeId) -> BufRef {
    alloc
        .node_buffer(id)
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
    assert_ne!(bx, bt, "two inputs never share a buffer");
    for node in g.nodes.iter().filter(|n| !n.is_input()) {
        let b = buf(&alloc, node.id);
        assert_ne!(b, bt, "{} reuses the late-read input's buffer", node.name);
        assert_ne!(b, bx, "{} reuses an input's buffer", node.name);
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
    let pool = alloc.pool(Backend::CPU).unwrap().pool_len();
    // 2 inputs + at most 3 temporaries alive at once + the output, never one per node.
    assert!(
        pool < g.nodes.len(),
        "pool of {pool} for {} nodes",
        g.nodes.len()
    );
    // A value is never overwritten before its last reader: no node shares a buffer with a
    // source it reads (only in-place ops may, and this graph has none).
    for node in &g.nodes {
        for &s in &node.src {
            assert_ne!(
                buf(&alloc, s),
                buf(&alloc, node.id),
                "{} overwrites its source",
                node.name
            );
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
        freq_scale: 1.0,
        n_ctx_orig: 0,
    };
    let r = b.rope(t, pos, RopeStyle::NonInterleaved, meta).unwrap();
    let u = b.add(r, on_input).unwrap();
    let w = b.mul(u, u).unwrap();
    let s3 = b.silu(w).unwrap(); // assigned to another backend below
    b.output(s3).unwrap();
    let mut g = b.build();
    let mut alloc = GraphAllocator::cpu_only();
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
    assert_ne!(
        buf(&alloc, s2),
        buf(&alloc, shared),
        "two consumers: no alias"
    );
    assert_ne!(
        buf(&alloc, on_input),
        buf(&alloc, x),
        "an input is never aliased"
    );
    assert_ne!(buf(&alloc, t), buf(&alloc, s2), "add is not in-place");
    assert_eq!(
        buf(&alloc, s3).backend,
        Backend::CUDA,
        "cross-backend: a fresh buffer"
    );
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
        assert_ne!(
            buf(&alloc, id),
            bs,
            "node {id} takes the aliased buffer while it is live"
        );
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
    let mut alloc = GraphAllocator::cpu_only();
    sched().assign_backends(&mut g, &alloc);
    assert_eq!(minfer::graph::FusionPass::new().run(&mut g, &alloc), 1);
    alloc.alloc_graph(&g).unwrap();
    assert_eq!(alloc.node_buffer(s), None, "the orphaned silu is dead");
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
    let mut alloc = GraphAllocator::cpu_only();
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
        .read_node(ids)
        .unwrap()
        .iter()
        .map(|v| v.to_bits() as i32)
        .collect();
    assert_eq!(back, tokens, "i32 values survive as f32 bit patterns");
    assert!(matches!(
        alloc.copy_to_cpu(99),
        Err(GraphError::NoBuffer { node: 99 })
    ));
}

// ---- KV regions and the reuse cache ------------------------------------------------------

fn tiny_cache() -> GraphCache {
    GraphCache::new(GraphAllocator::cpu_only())
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
    assert!(cache.alloc().persistent().iter().all(|p| p.len == region));
    // Stand-in for this step's KV store (the CPU KV kernel is wired in later).
    let k: Vec<f32> = (0..region).map(|i| i as f32).collect();
    let v: Vec<f32> = (0..region).map(|i| -(i as f32)).collect();
    let alloc = cache.alloc_mut();
    alloc
        .pool_mut(Backend::CPU)
        .unwrap()
        .write_host(pairs[1].k.id, &k)
        .unwrap();
    alloc
        .pool_mut(Backend::CPU)
        .unwrap()
        .write_host(pairs[1].v.id, &v)
        .unwrap();

    // Prefill -> decode changes n_tokens and gtype: a rebuild, same allocator.
    let decode = params(1, 16);
    let Prepared::Built { .. } = cache.prepare(&decode, &sched(), build_tiny).unwrap() else {
        panic!("decode after prefill must rebuild");
    };
    let after: Vec<_> = (0..shape.n_layer)
        .map(|l| cache.alloc().kv_pair(l).unwrap())
        .collect();
    assert_eq!(after, pairs, "KV region ids survive the rebuild");
    assert_eq!(
        cache.alloc_mut().copy_kv_to_cpu(1).unwrap(),
        (k, v),
        "and so do their contents"
    );
    assert_eq!(
        cache.alloc().persistent().len(),
        4,
        "no second set of regions"
    );
    // The graph's KV nodes bind the K region.
    let g = cache.graph().unwrap();
    let store = g.nodes.iter().find(|n| n.name == "kv_store-1").unwrap();
    assert_eq!(cache.alloc().node_buffer(store.id), Some(pairs[1].k));
}

#[test]
fn a_kv_region_of_another_size_is_refused_and_the_failed_plan_is_dropped() {
    let mut cache = tiny_cache();
    let p = params(5, 16);
    cache.prepare(&p, &sched(), build_tiny).unwrap();
    let pool = cache.alloc().pool(Backend::CPU).unwrap().pool_len();
    let err = cache
        .prepare(&params(5, 32), &sched(), build_tiny)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::KvRegionSize {
                layer: 0,
                have: 64,
                want: 128
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
        cache.alloc().pool(Backend::CPU).unwrap().pool_len(),
        pool,
        "the failed plan returned its buffers"
    );
}

#[test]
fn executing_an_unplanned_graph_is_an_error_not_a_no_op() {
    let (mut g, _, _) = g3_graph();
    let mut alloc = GraphAllocator::cpu_only();
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
fn fuse_flags_are_part_of_the_reuse_identity() {
    let mut cache = tiny_cache();
    let p = params(1, 16);
    cache.prepare(&p, &sched(), build_tiny).unwrap();
    let flips: [fn(&mut GraphParams); 4] = [
        |p| p.cparams.fuse_qkv = !p.cparams.fuse_qkv,
        |p| p.cparams.fuse_ffn = !p.cparams.fuse_ffn,
        |p| p.cparams.gpu = !p.cparams.gpu,
        |p| p.cparams.flash_attn = !p.cparams.flash_attn,
    ];
    for flip in flips {
        let mut q = p;
        flip(&mut q);
        assert!(!cache.try_reuse(&q), "{:?} vs {:?}", q.cparams, p.cparams);
        // And back: the other direction forces a rebuild too.
        cache.prepare(&q, &sched(), build_tiny).unwrap();
        assert!(!cache.try_reuse(&p));
        cache.prepare(&p, &sched(), build_tiny).unwrap();
    }
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

// ---- CPU pool ----------------------------------------------------------------------------

#[test]
fn cpu_pool_recycles_exact_lengths_zero_filled() {
    let mut cpu = CpuBackend::new();
    let a = cpu.alloc_buffer(4);
    cpu.write_host(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    cpu.free_buffer(a);
    cpu.free_buffer(a); // a double free is ignored
    assert_eq!(cpu.free_len(), 1);
    let b = cpu.alloc_buffer(5);
    assert_ne!(a, b, "no length match: a new buffer");
    let c = cpu.alloc_buffer(4);
    assert_eq!(c, a, "exact length match: recycled");
    assert_eq!(
        cpu.read_host(c).unwrap(),
        &[0.0; 4],
        "recycled buffers are zero-filled"
    );
    cpu.free_buffer(c);
    let d = cpu.alloc_fresh(4);
    assert_ne!(d, c, "alloc_fresh bypasses the free list");
    assert_eq!(cpu.pool_len(), 3);
    assert_eq!(cpu.buffer_len(b), Some(5));
    assert!(matches!(
        cpu.write_host(b, &[1.0]),
        Err(GraphError::HostLength {
            expected: 5,
            got: 1,
            ..
        })
    ));
    assert!(matches!(
        cpu.write_host(42, &[]),
        Err(GraphError::BadBufferId { id: 42, .. })
    ));
    assert_eq!(cpu.read_host(42), None);
}

fn cpu_node(op: Op, src: &[NodeId], len: usize) -> CNode {
    CNode {
        id: 9,
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

#[test]
fn cpu_swiglu_is_bit_identical_to_silu_then_mul() {
    let mut cpu = CpuBackend::new();
    let at = |id| BufRef {
        backend: Backend::CPU,
        id,
    };
    let n = 257;
    let gate: Vec<f32> = (0..n).map(|i| (i as f32 - 128.0) * 0.173).collect();
    let up: Vec<f32> = (0..n).map(|i| 1.0 / (i as f32 + 0.5) - 0.3).collect();
    let (g, u, s, m, f) = (
        cpu.alloc_buffer(n),
        cpu.alloc_buffer(n),
        cpu.alloc_buffer(n),
        cpu.alloc_buffer(n),
        cpu.alloc_buffer(n),
    );
    cpu.write_host(g, &gate).unwrap();
    cpu.write_host(u, &up).unwrap();
    cpu.execute_node(&cpu_node(Op::Silu, &[0], n), &[at(g)], at(s), None)
        .unwrap();
    cpu.execute_node(&cpu_node(Op::Mul, &[0, 1], n), &[at(s), at(u)], at(m), None)
        .unwrap();
    cpu.execute_node(
        &cpu_node(Op::SwiGLU, &[0, 1], n),
        &[at(g), at(u)],
        at(f),
        None,
    )
    .unwrap();
    let bits = |cpu: &CpuBackend, id| {
        cpu.read_host(id)
            .unwrap()
            .iter()
            .map(|v: &f32| v.to_bits())
            .collect::<Vec<u32>>()
    };
    assert_eq!(bits(&cpu, f), bits(&cpu, m));
    // In place: silu over its own input.
    cpu.execute_node(&cpu_node(Op::Silu, &[0], n), &[at(g)], at(g), None)
        .unwrap();
    assert_eq!(bits(&cpu, g), bits(&cpu, s));
}

#[test]
fn cpu_refuses_ops_without_a_kernel_by_name() {
    let mut cpu = CpuBackend::new();
    let a = BufRef {
        backend: Backend::CPU,
        id: cpu.alloc_buffer(4),
    };
    let b = BufRef {
        backend: Backend::CPU,
        id: cpu.alloc_buffer(4),
    };
    // Vocabulary no supported architecture emits, and a GPU decode fusion.
    for op in [Op::Scale(2.0), Op::Softmax { dim: 0 }, Op::FusedFFN] {
        match cpu.execute_node(&cpu_node(op.clone(), &[0], 4), &[a], b, None) {
            Err(GraphError::NoKernel { node, op: got }) => {
                assert_eq!(node, "node-9");
                assert_eq!(got, op);
            }
            other => panic!("expected NoKernel for {op:?}, got {other:?}"),
        }
    }
    let short = BufRef {
        backend: Backend::CPU,
        id: cpu.alloc_buffer(3),
    };
    // A short operand: the kernel refuses it, naming the node.
    match cpu.execute_node(&cpu_node(Op::Add, &[0, 1], 4), &[a, short], b, None) {
        Err(GraphError::Kernel { node, .. }) => assert_eq!(node, "node-9"),
        other => panic!("expected a kernel error for a short operand, got {other:?}"),
    }
    // A kernel that needs metadata or weights says so instead of computing garbage.
    assert!(matches!(
        cpu.execute_node(&cpu_node(Op::MatMul { transpose_b: false }, &[0], 4), &[a], b, None),
        Err(GraphError::WrongMeta { expected: "matmul", .. })
    ));
    assert!(matches!(
        cpu.execute_node(&cpu_node(Op::RmsNorm { eps: 1e-6 }, &[0], 4), &[a], b, None),
        Err(GraphError::WrongMeta { expected: "norm", .. })
    ));
    let foreign = BufRef {
        backend: Backend::METAL,
        id: 0,
    };
    assert!(matches!(
        cpu.execute_node(&cpu_node(Op::Add, &[0, 1], 4), &[a, foreign], b, None),
        Err(GraphError::BackendMismatch {
            split: Backend::CPU,
            buffer: Backend::METAL,
            ..
        })
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
    assert_eq!(alloc.node_buffer(0), None);
}

/// The CPU backend's silu of one value: ggml's `ggml_silu_f32` (libm `expf`), what a row too
/// short for a whole vector gets.
fn silu(x: f32) -> f32 {
    minfer::vec_ops::expf::silu_libm(x)
}
