//! JSON export for tools and the visualizer.
//!
//! ```text
//! {"format": "minfer-graph", "version": 1, "model": "name"|null, "uid": 3,
//!  "kind": "prefill"|"decode"|null, "params": {...}|null, "inputs": [ids], "outputs": [ids],
//!  "nodes": [{"id", "name", "op", "detail", "shape", "dtype", "backend", "src", "layer",
//!             "live", "meta"}]}
//! ```
//! `op` is the short op name, `detail` the payload (`RmsNorm { eps: 1e-6 }`), `backend` the
//! registry name or `null`, `meta` an object with a `"kind"` field per `NodeMeta` variant.
//! `docs/minfer-graph.schema.json` is the schema, every op and meta kind enumerated
//! (`tests/graph_export.rs` validates exports against it).

use std::io::{self, Write};

use serde_json::{Value, json};

use super::ops::NodeMeta;
use super::params::{GraphParams, GraphType};
use super::{CNode, ComputeGraph};

pub const JSON_FORMAT: &str = "minfer-graph";
pub const JSON_VERSION: u64 = 1;

fn meta_json(meta: &NodeMeta) -> Value {
    let body = match meta {
        NodeMeta::None => json!({}),
        NodeMeta::MatMul(m) => json!({
            "weight": m.weight_name, "bias": m.bias_name, "weight_type": m.weight_type.name(),
            "in_dim": m.in_dim, "out_dim": m.out_dim,
        }),
        NodeMeta::Norm(m) => json!({ "weight": m.weight_name }),
        NodeMeta::Rope(m) => json!({
            "n_head": m.n_head, "head_dim": m.head_dim, "n_rot": m.n_rot,
            "freq_base": m.freq_base,
        }),
        NodeMeta::Attn(m) => json!({
            "layer": m.layer, "n_head": m.n_head, "n_head_kv": m.n_head_kv,
            "head_dim": m.head_dim, "scale": m.scale, "n_ctx": m.n_ctx, "kv_type": m.kv_type.name(), "window": m.window,
        }),
        NodeMeta::Kvcache(m) => json!({
            "layer": m.layer, "n_embd_kv": m.n_embd_kv, "n_ctx": m.n_ctx,
            "kv_type": m.kv_type.name(), "head_dim": m.head_dim,
        }),
        NodeMeta::Embed(m) => json!({
            "weight": m.weight_name, "weight_type": m.weight_type.name(), "n_embd": m.n_embd,
        }),
        NodeMeta::KvShift(m) => json!({
            "layer": m.kv.layer, "n_embd_kv": m.kv.n_embd_kv, "n_ctx": m.kv.n_ctx,
            "kv_type": m.kv.kv_type.name(), "head_dim": m.kv.head_dim, "n_rot": m.rope.n_rot,
            "freq_base": m.rope.freq_base,
        }),
    };
    let mut obj = body;
    if let Value::Object(map) = &mut obj {
        map.insert("kind".to_string(), Value::from(meta.kind_name()));
    }
    obj
}

fn node_json(node: &CNode, live: bool) -> Value {
    json!({
        "id": node.id,
        "name": node.name,
        "op": node.op.name(),
        "detail": format!("{:?}", node.op),
        "shape": node.out_shape,
        "dtype": node.out_dtype.name(),
        "backend": node.backend.map(|b| b.name()),
        "src": node.src,
        "layer": node.layer,
        "live": live,
        "meta": meta_json(&node.meta),
    })
}

fn params_json(p: &GraphParams) -> Value {
    json!({
        "n_tokens": p.n_tokens, "n_out": p.n_out, "output": p.output.name(),
        "n_ctx": p.cparams.n_ctx, "gpu": p.cparams.gpu, "kv_type": p.cparams.kv_type.name(),
        "weights_version": p.weights_version,
    })
}

impl ComputeGraph {
    /// The graph as a JSON value; `params` adds `"kind"` and `"params"`, `model` names the
    /// model.
    pub fn export_json(&self, params: Option<&GraphParams>, model: Option<&str>) -> Value {
        let live = self.live_mask();
        let kind = params.map(|p| match p.gtype {
            GraphType::Prefill => "prefill",
            GraphType::Decode => "decode",
        });
        json!({
            "format": JSON_FORMAT,
            "version": JSON_VERSION,
            "model": model,
            "uid": self.uid,
            "kind": kind,
            "params": params.map(params_json),
            "inputs": self.inputs,
            "outputs": self.outputs,
            "nodes": self.nodes.iter().map(|n| node_json(n, live.get(n.id).copied().unwrap_or(false))).collect::<Vec<_>>(),
        })
    }

    /// Writes [`export_json`](Self::export_json), pretty-printed.
    pub fn dump_json(&self, w: &mut dyn Write, params: Option<&GraphParams>, model: Option<&str>) -> io::Result<()> {
        serde_json::to_writer_pretty(&mut *w, &self.export_json(params, model))?;
        writeln!(w)
    }
}
