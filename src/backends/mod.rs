//! The execution backends, each in its own folder with its kernels, and the registry of this
//! build.
//!
//! * [`cpu`]: host memory, the SIMD kernels (AVX-512, AVX2, NEON, scalar twins), always present
//!   and the terminal of the assignment walk.
//! * [`cuda`] (`--features cuda`): NVIDIA GPUs through the driver API and NVRTC, loaded at
//!   run time; on a machine without a driver its entry says why it is not usable.
//! * Metal is a known name (its id is part of the file formats) but not compiled into this
//!   build: `--backend metal` says so, as `--backend cuda` does without the feature.
//!
//! Everything a backend is to the rest of the engine goes through
//! [`BackendImpl`](crate::graph::BackendImpl) and the entries [`registry`] returns.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::graph::{Backend, BackendConfig, BackendEntry, BackendFence, BackendRegistry, GraphAllocator, GraphError, registry::BUILTIN};

/// The registry of this build: the CPU entry (probed now) and the known names that are not
/// compiled in.
pub fn registry() -> BackendRegistry {
    let entries = BUILTIN
        .iter()
        .map(|b| match b.handle {
            Backend::CPU => BackendEntry {
                handle: b.handle,
                name: b.name,
                priority: b.priority,
                compiled_in: true,
                probed: cpu::probe(),
                capabilities: Some(cpu::CAPABILITIES),
                create: Some(cpu::create),
                color: b.color,
            },
            #[cfg(feature = "cuda")]
            Backend::CUDA => BackendEntry {
                handle: b.handle,
                name: b.name,
                priority: b.priority,
                compiled_in: true,
                probed: cuda::probe(),
                capabilities: Some(cuda::CAPABILITIES),
                create: Some(cuda::create),
                color: b.color,
            },
            _ => BackendEntry::not_compiled(b),
        })
        .collect();
    BackendRegistry::new(entries)
}

/// An allocator over this build's registry, no fence, with a bare CPU backend (no weights, no
/// workers): for graph tests of element-wise ops.
pub fn cpu_allocator() -> GraphAllocator {
    cpu_allocator_fenced(BackendFence::all())
}

/// [`cpu_allocator`] behind `fence` (tests that add mock devices).
pub fn cpu_allocator_fenced(fence: BackendFence) -> GraphAllocator {
    let mut alloc = GraphAllocator::new(registry(), fence);
    // The CPU is in every registry this module builds; enabling it cannot fail.
    let _ = alloc.enable_backend(Backend::CPU, Box::new(cpu::CpuBackend::new()));
    alloc
}

/// Creates every usable backend the fence allows (the CPU always) into `alloc`, in priority
/// order.
pub fn enable_all(alloc: &mut GraphAllocator, config: &BackendConfig) -> Result<Vec<Backend>, GraphError> {
    let entries: Vec<BackendEntry> = alloc.registry().by_priority().into_iter().cloned().collect();
    let mut enabled = Vec::new();
    for entry in entries {
        let wanted = entry.handle == Backend::CPU || (entry.usable_here() && alloc.fence().allows(entry.handle));
        if !wanted {
            continue;
        }
        let imp = entry.instantiate(config)?;
        alloc.enable_backend(entry.handle, imp)?;
        enabled.push(entry.handle);
    }
    Ok(enabled)
}
