//! The CUDA backend (`--features cuda`): the driver API and NVRTC through `cudarc`, both
//! loaded at run time, so the feature builds and runs on a machine without CUDA, where the
//! registry answers "not usable: <reason>" and the default order falls through to the CPU.
//!
//! * [`driver`]: the probe (libcuda.so.1, cuInit, device 0) that never lets cudarc panic;
//! * [`nvrtc`]: finding libnvrtc.so.12 and compiling the kernel sources;
//! * [`kernels`]: the CUDA C sources (`kernels/*.cu`, `*.cuh`).
//!
//! Status: the kernels are compile-checked (tests/cuda_kernels.rs) but no kernel has run on
//! hardware yet, and the backend does not yet claim any node: see docs/CUDA.md.

pub mod driver;
pub mod kernels;
pub mod nvrtc;

use crate::graph::{CNode, Capabilities, DeviceInfo, FusedOp, Unavailable};

/// The CUDA backend claims no node until its executor lands (docs/CUDA.md): the capability
/// query is honest about it, so the assignment walk sends everything to the CPU.
pub fn cuda_supports_node(_node: &CNode) -> bool {
    false
}

pub fn cuda_supports_fused(_fused: FusedOp) -> bool {
    false
}

pub const CAPABILITIES: Capabilities = Capabilities { supports_node: cuda_supports_node, supports_fused: cuda_supports_fused };

/// Driver, device and NVRTC, or the first reason that fails.
pub fn probe() -> Result<DeviceInfo, Unavailable> {
    let dev = driver::probe().map_err(|reason| Unavailable { reason })?;
    nvrtc::locate().map_err(|e| Unavailable { reason: e.to_string() })?;
    Ok(DeviceInfo { name: dev.name, memory_bytes: Some(dev.total_mem) })
}
