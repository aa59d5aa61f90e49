//! Registry and fence, backend assignment, the fusion pass, splits and the scheduler.

mod graph_support;

use graph_support::{MockBackend, Qwen2Shape, all_f32, ids_of, only_add_mul, params};
use minfer::graph::registry::BACKENDS_ENV;
use minfer::graph::scheduler::trace_report;
use minfer::graph::{
    Backend, BackendEntry, BackendFence, BackendRegistry, BackendScheduler, ComputeGraph, DType,
    FusedOp, FusionPass, GraphAllocator, GraphBuilder, GraphError, NodeId, Op,
};

/// A lone node of `op` producing `dtype` (for capability queries).
fn lone_node(op: Op, dtype: DType) -> minfer::graph::CNode {
    minfer::graph::CNode {
        id: 0,
        name: "n".into(),
        op,
        src: vec![],
        out_shape: [4, 1, 1, 1],
        out_dtype: dtype,
        layer: None,
        backend: None,
        meta: Default::default(),
    }
}

// ---- registry and fence ------------------------------------------------------------------

#[test]
fn the_registered_set_and_priority_order_are_pinned() {
    let r = minfer::backends::registry();
    let identity: Vec<(&str, u16)> = r
        .entries()
        .iter()
        .map(|e| (e.name, e.handle.id()))
        .collect();
    assert_eq!(identity, [("cpu", 0), ("metal", 1), ("cuda", 2)]);
    let priority: Vec<(&str, u16)> = r
        .by_priority()
        .iter()
        .map(|e| (e.name, e.priority))
        .collect();
    assert_eq!(priority, [("metal", 300), ("cuda", 200), ("cpu", 100)]);
    assert_eq!(Backend::METAL.to_string(), "metal");
    assert_eq!(Backend::from_id(2), Some(Backend::CUDA));
    assert_eq!(Backend::from_id(9), None);
    let cpu = r.entry(Backend::CPU).unwrap();
    assert!(cpu.compiled_in && cpu.usable_here());
    let caps = cpu.capabilities.unwrap();
    assert!((caps.supports_fused)(FusedOp::SwiGLU));
    assert!((caps.supports_node)(&lone_node(Op::Add, DType::F32)));
    // The capability query sees the whole node: an f16 add has no CPU kernel.
    assert!(!(caps.supports_node)(&lone_node(Op::Add, DType::F16)));
    assert!(r.entry(Backend::METAL).unwrap().capabilities.is_none());
}

#[test]
fn fence_refusals_say_which_of_the_three_it_is() {
    let r = minfer::backends::registry();
    match r.parse_fence("cpu,vulkan") {
        Err(GraphError::UnknownBackend { name, known }) => {
            assert_eq!(name, "vulkan");
            assert_eq!(known, "cpu, metal, cuda");
        }
        other => panic!("expected unknown, got {other:?}"),
    }
    // No build has a Metal module; CUDA is compiled in only with the cuda feature
    // (tests/cuda_unavailable.rs covers that build's refusal).
    let not_compiled: &[&str] = if cfg!(feature = "cuda") { &["metal"] } else { &["metal", "cuda", "CUDA"] };
    for &name in not_compiled {
        let err = r.parse_fence(name).unwrap_err();
        assert!(
            matches!(&err, GraphError::BackendNotCompiled { .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("not compiled into this build"),
            "{err}"
        );
    }
    // Compiled in, but no device here.
    let mut entries = r.entries().to_vec();
    entries[2].compiled_in = true;
    entries[2].probed = Err(minfer::graph::Unavailable { reason: "libcuda.so.1 not found".into() });
    let custom = BackendRegistry::new(entries);
    let err = custom.parse_fence("cpu, cuda").unwrap_err();
    assert!(
        matches!(&err, GraphError::BackendUnusable { name, .. } if name == "cuda"),
        "{err}"
    );
    assert!(err.to_string().contains("not usable on this machine: libcuda.so.1 not found"), "{err}");
    assert!(matches!(
        r.parse_fence(" , "),
        Err(GraphError::EmptyFence { .. })
    ));
}

#[test]
fn fence_accepts_usable_names_and_always_keeps_the_cpu() {
    let r = minfer::backends::registry();
    let f = r.parse_fence(" CPU , cpu ").unwrap();
    assert!(f.allows(Backend::CPU));
    assert!(!f.allows(Backend::CUDA));
    assert_eq!(r.resolve_fence(Some("cpu")).unwrap(), f);
    let mut entries: Vec<BackendEntry> = r.entries().to_vec();
    for e in &mut entries {
        e.compiled_in = true;
        e.probed = Ok(minfer::graph::DeviceInfo { name: "test device".into(), memory_bytes: None });
    }
    let f = BackendRegistry::new(entries).parse_fence("cuda").unwrap();
    assert!(f.allows(Backend::CUDA) && f.allows(Backend::CPU) && !f.allows(Backend::METAL));
    assert!(BackendFence::all().allows(Backend::METAL));
    // A CLI spec wins over the environment, so this holds whatever MINFER_BACKENDS says.
    assert!(matches!(
        r.resolve_fence(Some("nope")),
        Err(GraphError::UnknownBackend { .. })
    ));
    assert_eq!(BACKENDS_ENV, "MINFER_BACKENDS");
}

// ---- assignment --------------------------------------------------------------------------

fn two_device_alloc(fence: BackendFence) -> GraphAllocator {
    let mut a = minfer::backends::cpu_allocator_fenced(fence);
    a.enable_backend(
        Backend::CUDA,
        Box::new(MockBackend::new(Backend::CUDA, all_f32, true)),
    )
    .unwrap();
    a.enable_backend(
        Backend::METAL,
        Box::new(MockBackend::new(Backend::METAL, only_add_mul, true)),
    )
    .unwrap();
    a
}

fn add_silu_graph() -> ComputeGraph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let y = b.input("y", [4, 1, 1, 1], DType::F32);
    let s = b.add(x, y).unwrap();
    let t = b.silu(s).unwrap();
    b.output(t).unwrap();
    b.build()
}

#[test]
fn assignment_walks_the_registry_priority_with_cpu_last() {
    let sched = BackendScheduler::with_trace(false);
    let mut g = add_silu_graph();
    g.nodes[3].backend = Some(Backend::CPU); // explicit assignments are kept
    let alloc = two_device_alloc(BackendFence::all());
    sched.assign_backends(&mut g, &alloc);
    let got: Vec<Backend> = g.nodes.iter().map(|n| n.backend.unwrap()).collect();
    // Inputs: only the CPU claims them. Add: Metal (300) beats CUDA (200).
    assert_eq!(
        got,
        [Backend::CPU, Backend::CPU, Backend::METAL, Backend::CPU]
    );

    let mut g = add_silu_graph();
    sched.assign_backends(&mut g, &alloc);
    assert_eq!(
        g.nodes[3].backend,
        Some(Backend::CUDA),
        "Metal declines Silu"
    );

    let mut g = add_silu_graph();
    let fenced = two_device_alloc(BackendFence::only(&[Backend::CUDA]));
    sched.assign_backends(&mut g, &fenced);
    assert_eq!(
        g.nodes[2].backend,
        Some(Backend::CUDA),
        "the fence removes Metal"
    );

    let mut g = add_silu_graph();
    sched.assign_backends(&mut g, &minfer::backends::cpu_allocator());
    assert!(g.nodes.iter().all(|n| n.backend == Some(Backend::CPU)));
}

#[test]
fn an_op_nobody_claims_lands_on_the_cpu_and_fails_loudly_there() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let s = b.silu(x).unwrap();
    // An f16 add: no backend here has a kernel for it.
    let mut spec = minfer::graph::NodeSpec::new("ffn", Op::Add, &[s, s], [4, 1, 1, 1]);
    spec.out_dtype = DType::F16;
    let f = b.node(spec).unwrap();
    b.output(f).unwrap();
    let mut g = b.build();
    let mut alloc = minfer::backends::cpu_allocator();
    let sched = BackendScheduler::with_trace(false);
    sched.assign_backends(&mut g, &alloc);
    assert_eq!(g.nodes[f].backend, Some(Backend::CPU));
    alloc.alloc_graph(&g).unwrap();
    alloc.fill_input(&g, "x", &[1.0; 4]).unwrap();
    match sched.execute(&g, &mut alloc) {
        Err(GraphError::NoKernel { node, op: Op::Add }) => assert_eq!(node, "ffn"),
        other => panic!("expected NoKernel, got {other:?}"),
    }
}

// ---- fusion ------------------------------------------------------------------------------

/// gate, up inputs; silu(gate); mul in the given operand order; output.
fn ffn_graph(silu_first: bool) -> (ComputeGraph, NodeId, NodeId) {
    let mut b = GraphBuilder::new();
    let gate = b.input("gate", [6, 2, 1, 1], DType::F32);
    let up = b.input("up", [6, 2, 1, 1], DType::F32);
    let s = b.silu(gate).unwrap();
    let m = if silu_first {
        b.mul(s, up)
    } else {
        b.mul(up, s)
    }
    .unwrap();
    b.output(m).unwrap();
    (b.build(), s, m)
}

fn assign_all(g: &mut ComputeGraph, backend: Backend) {
    for n in &mut g.nodes {
        n.backend = Some(backend);
    }
}

#[test]
fn swiglu_fusion_applies_with_silu_on_either_side() {
    for silu_first in [true, false] {
        let (mut g, silu, mul) = ffn_graph(silu_first);
        assign_all(&mut g, Backend::CPU);
        let alloc = minfer::backends::cpu_allocator();
        assert_eq!(FusionPass::new().run(&mut g, &alloc), 1);
        assert_eq!(g.nodes[mul].op, Op::SwiGLU);
        assert_eq!(g.nodes[mul].src, vec![0, 1], "src = [gate, up]");
        assert_eq!(g.nodes[mul].backend, Some(Backend::CPU));
        // The orphaned Silu stays in the list, dead.
        assert_eq!(g.nodes[silu].op, Op::Silu);
        assert_eq!(g.nodes.len(), 4);
        assert!(!g.live_mask()[silu]);
        // Idempotent: nothing left to match.
        assert_eq!(FusionPass::new().run(&mut g, &alloc), 0);
    }
}

#[test]
fn swiglu_fusion_skipped_when_backend_does_not_support_it() {
    let (mut g, _, mul) = ffn_graph(true);
    assign_all(&mut g, Backend::CUDA);
    let no = |_: Backend, _: FusedOp| false;
    assert_eq!(FusionPass::new().run(&mut g, &no), 0);
    assert_eq!(g.nodes[mul].op, Op::Mul);

    // Gated per node: the Mul's backend decides, through the allocator's pools.
    let mut alloc = minfer::backends::cpu_allocator();
    alloc
        .enable_backend(
            Backend::CUDA,
            Box::new(MockBackend::new(Backend::CUDA, all_f32, false)),
        )
        .unwrap();
    assert_eq!(FusionPass::new().run(&mut g, &alloc), 0);

    // Unassigned nodes are never fused.
    let (mut g, _, _) = ffn_graph(true);
    let yes = |_: Backend, _: FusedOp| true;
    assert_eq!(FusionPass::new().run(&mut g, &yes), 0);
}

#[test]
fn fusion_folds_every_ffn_of_a_qwen2_graph() {
    let shape = Qwen2Shape::tiny();
    let mut g = shape.build(&params(5, 16)).unwrap();
    let before = g.nodes.len();
    let alloc = minfer::backends::cpu_allocator();
    BackendScheduler::with_trace(false).assign_backends(&mut g, &alloc);
    assert_eq!(FusionPass::new().run(&mut g, &alloc), shape.n_layer);
    assert_eq!(g.nodes.len(), before, "fusion never changes the node count");
    let live = g.live_mask();
    let silus = ids_of(&g, &Op::Silu);
    assert_eq!(silus.len(), shape.n_layer);
    assert!(silus.iter().all(|&s| !live[s]));
    for sw in ids_of(&g, &Op::SwiGLU) {
        let src: Vec<&str> = g.nodes[sw]
            .src
            .iter()
            .map(|&s| g.nodes[s].name.as_str())
            .collect();
        assert!(
            src[0].starts_with("ffn_gate-") && src[1].starts_with("ffn_up-"),
            "{src:?}"
        );
    }
}

// ---- splits and execution ----------------------------------------------------------------

/// x, y on CPU; a = x + y on the mock; m = a * y on the mock; s = silu(m) on CPU; output s.
fn mixed_graph() -> (ComputeGraph, GraphAllocator) {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let y = b.input("y", [4, 1, 1, 1], DType::F32);
    let a = b.add(x, y).unwrap();
    let m = b.mul(a, y).unwrap();
    let s = b.silu(m).unwrap();
    b.output(s).unwrap();
    let mut g = b.build();
    let mut alloc = minfer::backends::cpu_allocator();
    alloc
        .enable_backend(
            Backend::METAL,
            Box::new(MockBackend::new(Backend::METAL, only_add_mul, false)),
        )
        .unwrap();
    BackendScheduler::with_trace(false).assign_backends(&mut g, &alloc);
    alloc.alloc_graph(&g).unwrap();
    (g, alloc)
}

#[test]
fn split_graph_cuts_at_backend_changes() {
    let (g, _) = mixed_graph();
    let splits = BackendScheduler::with_trace(false).split_graph(&g).unwrap();
    let summary: Vec<(Backend, (usize, usize))> =
        splits.iter().map(|s| (s.backend, s.node_range)).collect();
    assert_eq!(
        summary,
        [
            (Backend::CPU, (0, 2)),
            (Backend::METAL, (2, 4)),
            (Backend::CPU, (4, 5))
        ]
    );
    assert_eq!(splits[1].inputs, vec![0, 1]);
    assert_eq!(splits[0].outputs, vec![0, 1]);
    assert_eq!(splits[1].outputs, vec![3]);
    assert_eq!(splits[2].inputs, vec![3]);
}

#[test]
fn execution_stages_values_across_backends() {
    let (g, mut alloc) = mixed_graph();
    let (x, y) = ([1.0f32, -2.0, 0.5, 3.0], [2.0f32, 1.0, -1.0, 0.25]);
    alloc.fill_input(&g, "x", &x).unwrap();
    alloc.fill_input(&g, "y", &y).unwrap();
    let sched = BackendScheduler::with_trace(false);
    sched.execute(&g, &mut alloc).unwrap();
    let want: Vec<f32> = x
        .iter()
        .zip(&y)
        .map(|(a, b)| minfer::backends::cpu::kernels::expf::silu_libm((a + b) * b))
        .collect();
    assert_eq!(alloc.copy_to_cpu(g.outputs[0]).unwrap(), want);
    // The mock's value was staged onto the CPU; the canonical buffer stays on the mock.
    assert_eq!(alloc.node_tensor(3).unwrap().backend(), Backend::METAL);
    assert_eq!(alloc.cross_tensor(3, Backend::CPU).unwrap().backend(), Backend::CPU);
    assert_eq!(alloc.cross_tensor(0, Backend::METAL).unwrap().backend(), Backend::METAL);
    // Re-executable: a reused graph with new inputs.
    alloc.fill_input(&g, "y", &[1.0; 4]).unwrap();
    sched.execute(&g, &mut alloc).unwrap();
    let want: Vec<f32> = x
        .iter()
        .map(|a| minfer::backends::cpu::kernels::expf::silu_libm(a + 1.0))
        .collect();
    assert_eq!(alloc.copy_to_cpu(g.outputs[0]).unwrap(), want);
}

#[test]
fn scheduler_cross_backend_error_names_the_node_and_both_backends() {
    let (mut g, mut alloc) = mixed_graph();
    alloc.fill_input(&g, "x", &[1.0; 4]).unwrap();
    alloc.fill_input(&g, "y", &[1.0; 4]).unwrap();
    // Planned on the mock, then moved to the CPU behind the allocator's back.
    g.nodes[3].backend = Some(Backend::CPU);
    let err = BackendScheduler::with_trace(false)
        .execute(&g, &mut alloc)
        .unwrap_err();
    match &err {
        GraphError::BackendMismatch {
            node,
            split,
            buffer,
        } => {
            assert_eq!(node, "mul");
            assert_eq!((*split, *buffer), (Backend::CPU, Backend::METAL));
        }
        other => panic!("expected BackendMismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("'mul'") && msg.contains("cpu") && msg.contains("metal"),
        "{msg}"
    );
}

#[test]
fn trace_report_lists_splits_and_census() {
    let (mut g, mut alloc) = mixed_graph();
    g.uid = 7;
    let sched = BackendScheduler::with_trace(false);
    let splits = sched.split_graph(&g).unwrap();
    let text = trace_report(&g, &splits, &alloc);
    assert!(text.starts_with("graph uid=7: 5 nodes, 3 splits"), "{text}");
    assert!(text.contains("split 1: metal nodes [2, 4)"), "{text}");
    assert!(
        text.contains("op add") && text.contains("backend metal") && text.contains("x1"),
        "{text}"
    );
    assert!(text.contains("dead (skipped) x0"), "{text}");
    alloc.release();
    assert!(trace_report(&g, &splits, &alloc).contains("dead (skipped) x3"));
}

#[test]
fn a_node_orphaned_by_fusion_neither_cuts_a_split_nor_asks_for_a_copy() {
    let (mut g, silu, mul) = ffn_graph(true);
    assign_all(&mut g, Backend::CPU);
    // The Silu claimed by a device, the Mul (and so the fused SwiGLU) on the CPU.
    g.nodes[silu].backend = Some(Backend::METAL);
    let mut alloc = two_device_alloc(BackendFence::all());
    assert_eq!(FusionPass::new().run(&mut g, &alloc), 1);
    let splits = BackendScheduler::with_trace(false).split_graph(&g).unwrap();
    assert_eq!(splits.len(), 1, "{splits:?}");
    assert!(splits[0].inputs.is_empty() && splits[0].backend == Backend::CPU);
    alloc.alloc_graph(&g).unwrap();
    assert_eq!(alloc.arena_bytes(Backend::METAL), 0, "no staging region for a dead node");
    assert!(alloc.node_tensor(silu).is_none() && alloc.node_tensor(mul).is_some());
}
