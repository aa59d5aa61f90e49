//! The op vocabulary and per-node metadata.
//!
//! **Positions are data, not structure.** `KvcacheStore` / `KvcacheLoad` carry the layer index
//! and nothing else; the rows they touch arrive through the `positions` input node. No payload
//! here may depend on `n_past`, because the graph topology must be a function of `GraphParams`
//! alone (that is what makes decode-step reuse sound).
//!
//! `Op` and `NodeMeta` derive a full `PartialEq`, payloads included: the structural reuse check
//! compares them node by node, so an `eps` or a layer index that silently changed is caught.
//!
//! Op *groups* ("element-wise", "may run in place", "has a side effect", "binds the KV region")
//! are declared once, in [`Op::traits`]; every pass asks that table instead of keeping its own
//! `matches!` list.

use super::weights::WeightId;
use crate::quants::GgmlType;

/// RoPE layout. ggml's `GGML_ROPE_TYPE_NORM` rotates adjacent pairs `(x[2i], x[2i+1])`;
/// `GGML_ROPE_TYPE_NEOX` rotates the halves `(x[i], x[i + n_rot/2])`. Qwen2/Qwen3 are NeoX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum RopeStyle {
    /// ggml NORM: adjacent pairs.
    #[serde(rename = "normal")]
    Interleaved,
    /// ggml NEOX: split halves.
    #[serde(rename = "neox")]
    NonInterleaved,
}

impl RopeStyle {
    /// llama.cpp's name of the layout.
    pub const fn name(self) -> &'static str {
        match self {
            RopeStyle::Interleaved => "normal",
            RopeStyle::NonInterleaved => "neox",
        }
    }
}

/// The fusion-pass rewrites a backend can claim (`BackendImpl::supports_fused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// `Mul(Silu(x), y)` → `SwiGLU(x, y)`.
    SwiGLU,
    /// `Mul(Gelu(x), y)` → `GeGLU(x, y)`.
    GeGLU,
}

/// One operation with its full payload. Every variant is built by a model builder or by the
/// fusion pass, and every backend that claims one has a kernel for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Leaf, host-filled every step (token ids, positions, tail ids, K-shift deltas).
    Input,
    // ---- element-wise ----
    Add,
    Mul,
    Silu,
    /// `x * s` (ggml `scale`): Gemma's embedding scale and query scale.
    Scale {
        s: f32,
    },
    /// GELU, tanh approximation, as ggml's CPU computes it: looked up in a table of the f16
    /// values of `gelu(f16(x))` for `-10 < x < 10`; `0` below, `x` above.
    Gelu,
    // ---- normalisation ----
    RmsNorm {
        eps: f32,
    },
    /// Per-head RMSNorm (Qwen3 q/k norm): `[hd * nh, nt]` normalised per `hd`-row.
    QkNorm {
        hd: usize,
        nh: usize,
        eps: f32,
    },
    // ---- linear algebra / gathers ----
    /// `y = W x (+ b)`; the weight and bias are in [`MatMulMeta`].
    MatMul,
    /// Row gather: embedding lookup, tail-row selection.
    GetRows,
    // ---- position / attention ----
    /// Rotary embedding of the first `n_rot` dims of every head ([`RoPEMeta`]).
    RoPE {
        style: RopeStyle,
    },
    /// Grouped-query attention with its softmax inside the kernel; `src = [q, kv, pos]`, or
    /// `[q, kv, pos, cells]` when sequences share the KV regions (token `t` attends cells
    /// `cells[t] - pos[t] ..= cells[t]`).
    Attn,
    // ---- KV cache (persistent regions; positions are data) ----
    /// Writes this step's K and V rows; `src = [k, v, cells]` (the positions when one sequence
    /// owns the regions: cell = position).
    KvcacheStore {
        layer: usize,
    },
    /// A view of the layer's persistent K region (no sources).
    KvcacheLoad {
        layer: usize,
    },
    /// Re-rotates the K rows of the layer's cells by their position delta (llama.cpp's K-shift
    /// graph); `src = [deltas]`, one i32 per cell, `0` leaves a cell untouched. Packed rows are
    /// decoded, rotated and encoded again.
    KvShift {
        layer: usize,
    },
    // ---- fused ----
    /// `silu(gate) * up`: the FusionPass output.
    SwiGLU,
    /// `gelu(gate) * up` (ggml `geglu`): the FusionPass output.
    GeGLU,
}

/// What family an op belongs to (exports, traces, capability tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    Leaf,
    Elementwise,
    Norm,
    Linear,
    Gather,
    Position,
    Attention,
    Kv,
}

/// The op-group table row of one op. See [`Op::traits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpTraits {
    /// Short name, ggml-style (`"mul_mat"`, `"rms_norm"`).
    pub name: &'static str,
    pub kind: OpKind,
    /// Output element `i` depends only on input elements `i`.
    pub elementwise: bool,
    /// May write its output over `src[0]` when it is the sole consumer on the same backend.
    pub in_place_safe: bool,
    /// Does work beyond its output buffer (writes KV), so it is live without consumers.
    pub side_effect: bool,
    /// Its node buffer *is* the layer's persistent K region.
    pub binds_kv_region: bool,
}

impl OpTraits {
    const fn new(name: &'static str, kind: OpKind) -> OpTraits {
        OpTraits {
            name,
            kind,
            elementwise: false,
            in_place_safe: false,
            side_effect: false,
            binds_kv_region: false,
        }
    }
    const fn elementwise(mut self) -> OpTraits {
        self.elementwise = true;
        self
    }
    const fn in_place(mut self) -> OpTraits {
        self.in_place_safe = true;
        self
    }
    const fn side_effect(mut self) -> OpTraits {
        self.side_effect = true;
        self
    }
    const fn binds_kv(mut self) -> OpTraits {
        self.binds_kv_region = true;
        self
    }
}

impl Op {
    /// The one table of op groups. Adding an op means adding one row here; the allocator, the
    /// liveness analysis, the exporters and the CPU capability matrix all read it.
    pub const fn traits(&self) -> OpTraits {
        use OpKind as K;
        match self {
            Op::Input => OpTraits::new("input", K::Leaf),
            Op::Add => OpTraits::new("add", K::Elementwise).elementwise(),
            Op::Mul => OpTraits::new("mul", K::Elementwise).elementwise(),
            // In place: the aliasing rule that keeps kernel-order execution correct.
            Op::Silu => OpTraits::new("silu", K::Elementwise)
                .elementwise()
                .in_place(),
            Op::Scale { .. } => OpTraits::new("scale", K::Elementwise).elementwise().in_place(),
            Op::Gelu => OpTraits::new("gelu", K::Elementwise).elementwise().in_place(),
            Op::RmsNorm { .. } => OpTraits::new("rms_norm", K::Norm),
            Op::QkNorm { .. } => OpTraits::new("qk_norm", K::Norm),
            Op::MatMul => OpTraits::new("mul_mat", K::Linear),
            Op::GetRows => OpTraits::new("get_rows", K::Gather),
            Op::RoPE { .. } => OpTraits::new("rope", K::Position).in_place(),
            Op::Attn => OpTraits::new("attn", K::Attention),
            Op::KvcacheStore { .. } => OpTraits::new("kv_store", K::Kv).side_effect().binds_kv(),
            Op::KvcacheLoad { .. } => OpTraits::new("kv_load", K::Kv).binds_kv(),
            Op::KvShift { .. } => OpTraits::new("kv_shift", K::Kv).side_effect().binds_kv(),
            // In place over its gate: the fused FFN needs no third n_ff-wide buffer.
            Op::SwiGLU => OpTraits::new("swiglu", K::Elementwise).elementwise().in_place(),
            Op::GeGLU => OpTraits::new("geglu", K::Elementwise).elementwise().in_place(),
        }
    }

    /// One op of every variant (payloads arbitrary): exporters, schemas and tests iterate over
    /// it. [`Op::example_index`] matches without a wildcard, so a new variant does not compile
    /// until it has an example here.
    pub fn examples() -> Vec<Op> {
        let ops = vec![
            Op::Input,
            Op::Add,
            Op::Mul,
            Op::Silu,
            Op::RmsNorm { eps: 1e-6 },
            Op::QkNorm { hd: 64, nh: 2, eps: 1e-6 },
            Op::MatMul,
            Op::GetRows,
            Op::RoPE { style: RopeStyle::NonInterleaved },
            Op::Attn,
            Op::KvcacheStore { layer: 0 },
            Op::KvcacheLoad { layer: 0 },
            Op::KvShift { layer: 0 },
            Op::SwiGLU,
            Op::Scale { s: 0.5 },
            Op::Gelu,
            Op::GeGLU,
        ];
        debug_assert!(ops.iter().enumerate().all(|(i, op)| op.example_index() == i));
        ops
    }

    /// This op's place in [`Op::examples`].
    const fn example_index(&self) -> usize {
        match self {
            Op::Input => 0,
            Op::Add => 1,
            Op::Mul => 2,
            Op::Silu => 3,
            Op::RmsNorm { .. } => 4,
            Op::QkNorm { .. } => 5,
            Op::MatMul => 6,
            Op::GetRows => 7,
            Op::RoPE { .. } => 8,
            Op::Attn => 9,
            Op::KvcacheStore { .. } => 10,
            Op::KvcacheLoad { .. } => 11,
            Op::KvShift { .. } => 12,
            Op::SwiGLU => 13,
            Op::Scale { .. } => 14,
            Op::Gelu => 15,
            Op::GeGLU => 16,
        }
    }

    /// Short ggml-style name.
    pub const fn name(&self) -> &'static str {
        self.traits().name
    }
    pub const fn kind(&self) -> OpKind {
        self.traits().kind
    }
    pub const fn is_elementwise(&self) -> bool {
        self.traits().elementwise
    }
    pub const fn in_place_safe(&self) -> bool {
        self.traits().in_place_safe
    }
    pub const fn has_side_effect(&self) -> bool {
        self.traits().side_effect
    }
    pub const fn binds_kv_region(&self) -> bool {
        self.traits().binds_kv_region
    }

    /// The KV layer named by the payload (store, load, shift).
    /// Attention names its layer in [`AttnMeta`]; use [`CNode::kv_layer`](super::CNode::kv_layer).
    pub const fn kv_layer(&self) -> Option<usize> {
        match self {
            Op::KvcacheStore { layer } | Op::KvcacheLoad { layer } | Op::KvShift { layer } => Some(*layer),
            _ => None,
        }
    }
}

/// Matrix multiply against a weight: GGUF `[in, out]`, memory `[out][in]`. The handles are
/// resolved at build time; the names are for exports and messages.
#[derive(Debug, Clone, PartialEq)]
pub struct MatMulMeta {
    pub weight: WeightId,
    pub weight_name: String,
    /// Added inline by the kernel (no separate node).
    pub bias: Option<WeightId>,
    pub bias_name: Option<String>,
    pub weight_type: GgmlType,
    pub in_dim: usize,
    pub out_dim: usize,
}

/// RMSNorm / QkNorm weight (`None`: unweighted).
#[derive(Debug, Clone, PartialEq)]
pub struct NormMeta {
    pub weight: Option<WeightId>,
    pub weight_name: Option<String>,
}

/// RoPE parameters (ggml `rope_ext` arguments that are structure, not data).
#[derive(Debug, Clone, PartialEq)]
pub struct RoPEMeta {
    pub n_head: usize,
    pub head_dim: usize,
    /// Rotated dims per head (`<= head_dim`).
    pub n_rot: usize,
    pub freq_base: f32,
}

/// Attention parameters. The output shape is `[n_head * head_dim, nt]`, from here rather than
/// from `q` (a fused q handle can point at a wider q|k|v buffer).
#[derive(Debug, Clone, PartialEq)]
pub struct AttnMeta {
    pub layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Rows of the persistent KV region.
    pub n_ctx: usize,
    /// How the KV cells are stored.
    pub kv_type: super::KvType,
    /// Sliding window: a query at position `p` attends only the cells `p - window < j <= p`
    /// (llama.cpp's standard SWA mask); `None` attends every cell `j <= p`.
    pub window: Option<usize>,
}

impl AttnMeta {
    /// Width of one K (or V) row: `n_head_kv * head_dim`.
    pub const fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// One layer's persistent KV regions: K and V are each `n_ctx` rows of `n_embd_kv` values
/// stored as `kv_type`, token-major.
#[derive(Debug, Clone, PartialEq)]
pub struct KvcacheMeta {
    pub layer: usize,
    pub n_embd_kv: usize,
    pub n_ctx: usize,
    pub kv_type: super::KvType,
    /// Values per head in a row (quantized rows are rotated head by head).
    pub head_dim: usize,
}

impl KvcacheMeta {
    /// Bytes of one region (K or V).
    pub const fn region_bytes(&self) -> usize {
        self.kv_type.region_bytes(self.n_embd_kv, self.n_ctx)
    }
}

/// The K-shift of one layer: its regions, and the RoPE its K rows were rotated with.
#[derive(Debug, Clone, PartialEq)]
pub struct KvShiftMeta {
    pub kv: KvcacheMeta,
    pub rope: RoPEMeta,
    pub style: RopeStyle,
}

/// Token embedding lookup: weight GGUF `[n_embd, n_vocab]`.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedMeta {
    pub weight: WeightId,
    pub weight_name: String,
    pub weight_type: GgmlType,
    pub n_embd: usize,
}

/// Per-node metadata: a concrete enum (comparable, clonable, no downcasts).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum NodeMeta {
    #[default]
    None,
    MatMul(MatMulMeta),
    Norm(NormMeta),
    Rope(RoPEMeta),
    Attn(AttnMeta),
    Kvcache(KvcacheMeta),
    Embed(EmbedMeta),
    KvShift(KvShiftMeta),
}

impl NodeMeta {
    /// Every [`NodeMeta::kind_name`].
    pub const KIND_NAMES: [&'static str; 8] = ["none", "matmul", "norm", "rope", "attn", "kvcache", "embed", "kv_shift"];

    /// Variant name, for exports and error messages.
    pub const fn kind_name(&self) -> &'static str {
        match self {
            NodeMeta::None => "none",
            NodeMeta::MatMul(_) => "matmul",
            NodeMeta::Norm(_) => "norm",
            NodeMeta::Rope(_) => "rope",
            NodeMeta::Attn(_) => "attn",
            NodeMeta::Kvcache(_) => "kvcache",
            NodeMeta::Embed(_) => "embed",
            NodeMeta::KvShift(_) => "kv_shift",
        }
    }
}
