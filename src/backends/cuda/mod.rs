//! The CUDA backend (`--features cuda`): the driver API and NVRTC through `cudarc`, both
//! loaded at run time, so the feature builds and runs on a machine without CUDA, where the
//! registry answers "not usable: <reason>" and the default order falls through to the CPU.
//!
//! * [`driver`]: the probe (libcuda.so.1, cuInit, device 0) that never lets cudarc panic;
//! * [`nvrtc`]: finding libnvrtc.so.12 and compiling the kernel sources;
//! * [`module_cache`]: the compiled PTX on disk, keyed by source, options and arch;
//! * [`device`]: the raw-device seam ([`Device`]) under the executor, with
//!   [`driver_device::DriverDevice`] the real one (the tests add a host emulator);
//! * [`backend`] / [`exec`]: the executor ([`CudaBackend`]) and its node → launch table;
//! * [`graphs`]: recording decode splits once and replaying them (CUDA graphs);
//! * [`kernels`]: the CUDA C sources (`kernels/*.cu`, `*.cuh`).
//!
//! Status: the kernels are compile-checked (tests/cuda_kernels.rs) and run through this
//! executor on the host emulator (backend_ops `--backend cuda-emu`), but not yet verified on
//! hardware: see docs/CUDA.md.

pub mod backend;
pub mod device;
pub mod driver;
pub mod driver_device;
pub mod exec;
pub mod fnv;
pub mod graphs;
pub mod kernels;
pub mod module_cache;
pub mod nvrtc;

pub use backend::CudaBackend;
pub use device::Device;

use crate::graph::{BackendConfig, BackendImpl, CNode, Capabilities, DType, DeviceInfo, FusedOp, GraphError, KvType, NodeMeta, Op, Unavailable};

/// Environment variable capping the CUDA backend's allocations (bytes; `K`, `M`, `G`).
pub const MEMORY_CAP_ENV: &str = "MINFER_CUDA_MEMORY_CAP";

fn rope_ok(m: &crate::graph::RoPEMeta) -> bool {
    m.n_rot > 0 && m.n_rot.is_multiple_of(2) && m.n_rot <= m.head_dim && m.head_dim <= exec::MAX_HEAD_DIM
}

/// Does a KV type's row layout fit the kernels (Q8_0 stores whole 64-value chunks)?
fn kv_ok(t: KvType, width: usize, head_dim: usize) -> bool {
    head_dim > 0 && head_dim <= exec::MAX_HEAD_DIM && (t != KvType::Q8_0 || (width.is_multiple_of(64) && head_dim.is_multiple_of(32)))
}

/// The CUDA capability matrix: what `kernels/*.cu` implement, on F32 activations with I32
/// ids/positions; every weight type minfer loads; KV f32/f16/q8_0 with heads up to 256.
pub fn cuda_supports_node(node: &CNode) -> bool {
    let f32_out = node.out_dtype == DType::F32;
    match (&node.op, &node.meta) {
        (Op::Input, _) => true,
        (Op::KvcacheStore { .. } | Op::KvcacheLoad { .. }, NodeMeta::Kvcache(m)) => kv_ok(m.kv_type, m.n_embd_kv, m.head_dim),
        (Op::KvShift { .. }, NodeMeta::KvShift(m)) => rope_ok(&m.rope) && kv_ok(m.kv.kv_type, m.kv.n_embd_kv, m.kv.head_dim),
        (Op::RoPE { .. }, NodeMeta::Rope(m)) => f32_out && rope_ok(m),
        (Op::Attn, NodeMeta::Attn(m)) => {
            f32_out && m.n_head_kv > 0 && m.n_head.is_multiple_of(m.n_head_kv) && kv_ok(m.kv_type, m.n_embd_kv(), m.head_dim)
        }
        (Op::MatMul, NodeMeta::MatMul(m)) => f32_out && exec::type_suffix(m.weight_type).is_some(),
        (Op::GetRows, NodeMeta::Embed(m)) => f32_out && exec::type_suffix(m.weight_type).is_some(),
        (Op::GetRows, _) => f32_out,
        (Op::Add | Op::Mul | Op::Silu | Op::SwiGLU | Op::Scale { .. } | Op::Gelu | Op::GeGLU | Op::RmsNorm { .. } | Op::QkNorm { .. }, _) => f32_out,
        _ => false,
    }
}

/// SwiGLU and GeGLU have their kernels (`swiglu_f32`, `geglu_f32`).
pub fn cuda_supports_fused(fused: FusedOp) -> bool {
    match fused {
        FusedOp::SwiGLU | FusedOp::GeGLU => true,
    }
}

pub const CAPABILITIES: Capabilities = Capabilities { supports_node: cuda_supports_node, supports_fused: cuda_supports_fused };

/// Driver, device and NVRTC, or the first reason that fails.
pub fn probe() -> Result<DeviceInfo, Unavailable> {
    let dev = driver::probe().map_err(|reason| Unavailable { reason })?;
    nvrtc::locate().map_err(|e| Unavailable { reason: e.to_string() })?;
    Ok(DeviceInfo { name: dev.name, memory_bytes: Some(dev.total_mem) })
}

/// Opens device 0 behind a [`CudaBackend`], capped by the config or `MINFER_CUDA_MEMORY_CAP`.
pub fn create(_info: &DeviceInfo, config: &BackendConfig) -> Result<Box<dyn BackendImpl>, GraphError> {
    let unusable = |reason: String| GraphError::BackendUnusable { name: "cuda".into(), reason };
    let cap = match config.memory_cap {
        Some(c) => Some(c),
        None => super::cpu::memory_cap_from_var(MEMORY_CAP_ENV, "cuda")?,
    };
    let dev = driver_device::DriverDevice::open().map_err(|e| unusable(e.to_string()))?;
    Ok(Box::new(CudaBackend::new(Box::new(dev), cap)))
}
