//! The parameters a graph's topology is a function of.
//!
//! Equal [`GraphParams`] ⇒ identical graph, node for node; that is the whole basis of reuse.
//! `n_past` is deliberately absent: positions are execution data (the `positions` input), so a
//! decode step never forces a rebuild.

/// Which kind of forward pass a graph is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphType {
    /// One token per sequence step.
    Decode,
    /// A block of prompt tokens.
    Prefill,
}

impl GraphType {
    /// `Decode` for one token, `Prefill` otherwise.
    pub const fn for_tokens(n_tokens: usize) -> GraphType {
        if n_tokens == 1 {
            GraphType::Decode
        } else {
            GraphType::Prefill
        }
    }
}

/// What a forward pass yields from its output rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GraphOutput {
    /// `[n_vocab, n_out]`: the lm_head's logits.
    #[default]
    Logits,
    /// `[n_embd, n_out]`: the final hidden states after the output norm (llama.cpp's
    /// `t_embd`), what embeddings pool. The lm_head is not built.
    Hidden,
}

impl GraphOutput {
    pub const fn name(self) -> &'static str {
        match self {
            GraphOutput::Logits => "logits",
            GraphOutput::Hidden => "hidden",
        }
    }
}

/// Context parameters that change the graph. Every field is part of the reuse identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CParams {
    /// Rows of every persistent KV region (all sequences' cells together).
    pub n_ctx: usize,
    /// Sequences sharing the regions, each owning `n_ctx / n_seq` consecutive cells. With more
    /// than one the graph takes a `kv_cells` input (the cell each token's K and V go to; the
    /// cell minus the position is where its sequence starts), so this is topology; which
    /// sequences a pass holds, and how many, is data.
    pub n_seq: usize,
    /// Whether a device backend (not the CPU) takes part: assignment is part of the topology,
    /// so a run that gains or loses a device must not reuse a graph planned without it. Set by
    /// the engine from the backends it enabled.
    pub gpu: bool,
    /// Storage of the KV cells.
    pub kv_type: super::KvType,
}

/// Everything a graph build reads besides the model itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphParams {
    pub n_tokens: usize,
    /// Rows whose logits are produced (tail rows): topology, not just execution.
    pub n_out: usize,
    /// Logits or hidden states: topology (the lm_head is absent from a hidden-state graph).
    pub output: GraphOutput,
    pub gtype: GraphType,
    pub cparams: CParams,
    /// Reserved for weight reload / adapter switches: bumping it breaks reuse. Constant 1 today.
    pub weights_version: u64,
}

impl GraphParams {
    /// Do two parameter sets describe the same topology? All fields, `cparams` in full.
    pub fn same_topology(&self, other: &GraphParams) -> bool {
        self == other
    }
}
