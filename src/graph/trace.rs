//! Per-node data capture for traces and the visualizer (design §8.3).
//!
//! After a node runs, [`NodeTrace::capture`] summarizes its output: exact statistics over every
//! value (min, max, mean, rms over the finite values; NaN and Inf counts) and a downsampled
//! sample (every `stride`-th value, at most `max_values` of them). Capture only reads, so a traced
//! run computes exactly what an untraced one does.
//!
//! What is not captured ([`is_traced`]): nodes whose buffer is a layer's persistent KV region
//! (`kv_store`, `kv_load` — a whole region per layer would dominate the trace; the visualizer
//! shows them as "no data"), and outputs in packed types (f16, q8_0) that have no f32 view.

use serde_json::{Value, json};

use super::{CNode, DType};

/// Values kept per node when nothing else is asked for (`MINFER_TRACE_VALUES`).
pub const DEFAULT_TRACE_VALUES: usize = 64;

/// Exact statistics of one output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeStats {
    /// Smallest and largest finite value; `None` when no value is finite.
    pub min: Option<f32>,
    pub max: Option<f32>,
    /// Mean and root mean square of the finite values (0 when none is finite).
    pub mean: f64,
    pub rms: f64,
    pub nan: usize,
    /// +Inf and -Inf together.
    pub inf: usize,
}

impl NodeStats {
    pub fn of(values: impl Iterator<Item = f32>) -> NodeStats {
        let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
        let (mut sum, mut sum_sq, mut finite, mut nan, mut inf) = (0f64, 0f64, 0usize, 0usize, 0usize);
        for v in values {
            if v.is_nan() {
                nan += 1;
            } else if v.is_infinite() {
                inf += 1;
            } else {
                min = min.min(v);
                max = max.max(v);
                sum += v as f64;
                sum_sq += (v as f64) * (v as f64);
                finite += 1;
            }
        }
        let (mean, rms) = match finite {
            0 => (0.0, 0.0),
            n => (sum / n as f64, (sum_sq / n as f64).sqrt()),
        };
        NodeStats {
            min: (finite > 0).then_some(min),
            max: (finite > 0).then_some(max),
            mean,
            rms,
            nan,
            inf,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "min": self.min, "max": self.max, "mean": self.mean, "rms": self.rms,
            "nan": self.nan, "inf": self.inf,
        })
    }
}

/// One node's captured output.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTrace {
    pub id: usize,
    pub dtype: DType,
    pub stats: NodeStats,
    /// `values[i]` is output value `i * stride` (flat, row-major over the output shape).
    pub values: Vec<f32>,
    pub stride: usize,
    /// Values in the output.
    pub n: usize,
}

/// Whether capture reads this node's output (see the module docs).
pub fn is_traced(node: &CNode) -> bool {
    !node.op.traits().binds_kv_region && matches!(node.out_dtype, DType::F32 | DType::I32)
}

impl NodeTrace {
    /// Summarizes `data`, the node's host view (an i32 output's bits are read as i32). `None`
    /// when the node is not traced ([`is_traced`]). At most `max_values` (at least 1) samples.
    pub fn capture(node: &CNode, data: &[f32], max_values: usize) -> Option<NodeTrace> {
        if !is_traced(node) {
            return None;
        }
        let n = node.n_elements().min(data.len());
        let data = &data[..n];
        let value = |v: &f32| match node.out_dtype {
            DType::I32 => v.to_bits() as i32 as f32,
            _ => *v,
        };
        let stride = n.div_ceil(max_values.max(1)).max(1);
        Some(NodeTrace {
            id: node.id,
            dtype: node.out_dtype,
            stats: NodeStats::of(data.iter().map(value)),
            values: data.iter().step_by(stride).map(value).collect(),
            stride,
            n,
        })
    }

    /// `{id, dtype, stats, values, stride, n}`; a non-finite sample is written as `null` (JSON
    /// has no NaN), its kind is in the stats' counts.
    pub fn to_json(&self) -> Value {
        let values: Vec<Value> = self
            .values
            .iter()
            .map(|&v| if v.is_finite() { json!(v) } else { Value::Null })
            .collect();
        json!({
            "id": self.id, "dtype": self.dtype.name(), "stats": self.stats.to_json(),
            "values": values, "stride": self.stride, "n": self.n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{NodeMeta, Op};

    fn node(op: Op, shape: [usize; 4], dtype: DType) -> CNode {
        CNode { id: 7, name: "x".into(), op, src: vec![], out_shape: shape, out_dtype: dtype, layer: None, backend: None, meta: NodeMeta::None }
    }

    #[test]
    fn stats_match_hand_computed_values() {
        // 1, -2, 3, NaN, +Inf: finite mean 2/3, rms sqrt(14/3).
        let s = NodeStats::of([1.0, -2.0, 3.0, f32::NAN, f32::INFINITY].into_iter());
        assert_eq!((s.min, s.max, s.nan, s.inf), (Some(-2.0), Some(3.0), 1, 1));
        assert!((s.mean - 2.0 / 3.0).abs() < 1e-12);
        assert!((s.rms - (14.0f64 / 3.0).sqrt()).abs() < 1e-12);
        let none = NodeStats::of([f32::NAN].into_iter());
        assert_eq!((none.min, none.max, none.mean, none.rms), (None, None, 0.0, 0.0));
    }

    #[test]
    fn capture_downsamples_with_a_stride_and_reads_i32_bits() {
        let data: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let t = NodeTrace::capture(&node(Op::Add, [10, 1, 1, 1], DType::F32), &data, 4).unwrap();
        // ceil(10 / 4) = 3: values 0, 3, 6, 9.
        assert_eq!((t.stride, t.n, t.values.clone()), (3, 10, vec![0.0, 3.0, 6.0, 9.0]));
        assert_eq!(t.stats.max, Some(9.0));
        let ids: Vec<f32> = [5i32, -1, 151643].iter().map(|&i| f32::from_bits(i as u32)).collect();
        let t = NodeTrace::capture(&node(Op::Input, [3, 1, 1, 1], DType::I32), &ids, 64).unwrap();
        assert_eq!(t.values, vec![5.0, -1.0, 151643.0]);
        let j = t.to_json();
        assert_eq!(j["dtype"], "i32");
        assert_eq!(j["stats"]["min"], -1.0);
    }

    #[test]
    fn kv_regions_and_packed_outputs_are_not_captured() {
        let data = vec![0.0f32; 8];
        assert!(NodeTrace::capture(&node(Op::KvcacheLoad { layer: 0 }, [8, 1, 1, 1], DType::F32), &data, 4).is_none());
        assert!(NodeTrace::capture(&node(Op::KvcacheStore { layer: 0 }, [8, 1, 1, 1], DType::F32), &data, 4).is_none());
        assert!(NodeTrace::capture(&node(Op::Add, [8, 1, 1, 1], DType::F16), &data, 4).is_none());
    }

    #[test]
    fn non_finite_samples_are_null_in_json() {
        let data = [1.0, f32::NAN, f32::NEG_INFINITY];
        let t = NodeTrace::capture(&node(Op::Add, [3, 1, 1, 1], DType::F32), &data, 8).unwrap();
        let j = t.to_json();
        assert_eq!(j["values"], json!([1.0, null, null]));
        assert_eq!((j["stats"]["nan"].clone(), j["stats"]["inf"].clone()), (json!(1), json!(1)));
    }
}
