//! The backend registry: which backends exist, their names, priorities and capabilities, how
//! to probe and create each one, and the fence that restricts which of them take part.
//!
//! The types live here; the entries of this build are assembled by
//! `crate::backends::registry()` (the graph layer knows no backend).
//!
//! A [`Backend`] is an opaque handle over a fixed id space (cpu = 0, metal = 1, cuda = 2). The ids
//! are a file-format contract (KV sessions), so they are appended, never renumbered. Two orders
//! exist and both are pinned: *identity* (id order — exporters, `Ord`, pool order in the
//! allocator) and *priority* (Metal 300 > CUDA 200 > CPU 100 — the assignment preference).
//! Nothing here depends on `HashMap` iteration order.
//!
//! The fence (`--backend NAMES` / `MINFER_BACKENDS`, comma-separated) removes backends from
//! participation. A name that is unknown, not compiled into this build, or not usable on this
//! machine is a loud refusal that says which of the three it is. The CPU is always the terminal
//! backend of the assignment walk, so a fence never has to name it.

use std::fmt;
use std::sync::Arc;

use super::CNode;
use super::backend::BackendImpl;
use super::error::GraphError;
use super::ops::FusedOp;
use crate::workers::Pool;

/// Environment variable holding the fence when no `--backend` flag is given.
pub const BACKENDS_ENV: &str = "MINFER_BACKENDS";

/// Opaque backend handle. `Copy`, `Hash`, `Ord` (identity order).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend(u16);

impl Backend {
    pub const CPU: Backend = Backend(0);
    pub const METAL: Backend = Backend(1);
    pub const CUDA: Backend = Backend(2);

    /// The stable id (file-format contract).
    pub const fn id(self) -> u16 {
        self.0
    }

    /// The handle of a built-in id.
    pub fn from_id(id: u16) -> Option<Backend> {
        BUILTIN.iter().map(|b| b.handle).find(|h| h.0 == id)
    }

    /// The built-in name (`"cpu"`, `"metal"`, `"cuda"`).
    pub fn name(self) -> &'static str {
        BUILTIN
            .iter()
            .find(|b| b.handle == self)
            .map_or("unknown", |b| b.name)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({}:{})", self.0, self.name())
    }
}

pub const PRIORITY_METAL: u16 = 300;
pub const PRIORITY_CUDA: u16 = 200;
pub const PRIORITY_CPU: u16 = 100;

/// The fixed facts of a built-in backend (independent of the build configuration).
pub struct Builtin {
    pub handle: Backend,
    pub name: &'static str,
    pub priority: u16,
    /// Graphviz fill colour.
    pub color: &'static str,
}

/// The built-in backends, in identity order.
pub const BUILTIN: [Builtin; 3] = [
    Builtin {
        handle: Backend::CPU,
        name: "cpu",
        priority: PRIORITY_CPU,
        color: "lightyellow",
    },
    Builtin {
        handle: Backend::METAL,
        name: "metal",
        priority: PRIORITY_METAL,
        color: "lightblue",
    },
    Builtin {
        handle: Backend::CUDA,
        name: "cuda",
        priority: PRIORITY_CUDA,
        color: "lightgreen",
    },
];

/// A backend's capability matrix as plain functions. The backend's trait methods forward to the
/// same functions, so the registry's answer and the pool's answer cannot diverge.
#[derive(Clone, Copy)]
pub struct Capabilities {
    /// Sees the whole node: op, output dtype, weight type, KV type, head size.
    pub supports_node: fn(&CNode) -> bool,
    pub supports_fused: fn(FusedOp) -> bool,
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Capabilities { .. }")
    }
}

/// What a probe found: the device, its memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's own name (`"AMD EPYC 9B45"`, `"NVIDIA H200"`).
    pub name: String,
    /// Memory the backend can use, where known (bytes).
    pub memory_bytes: Option<u64>,
}

/// Why a compiled-in backend cannot run here (no driver, no device).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Unavailable {
    pub reason: String,
}

/// What a backend is created with.
#[derive(Clone, Default)]
pub struct BackendConfig {
    /// CPU worker threads (a backend may use them for host-side work).
    pub n_threads: usize,
    /// Workers shared with other engines (a server's slots, a draft model beside its target).
    pub workers: Option<Arc<Pool>>,
    /// A cap on the bytes the backend may allocate (`None`: what the device has).
    pub memory_cap: Option<usize>,
}

impl fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendConfig")
            .field("n_threads", &self.n_threads)
            .field("shared_workers", &self.workers.is_some())
            .field("memory_cap", &self.memory_cap)
            .finish()
    }
}

/// Probes a backend's device on this machine.
pub type ProbeFn = fn() -> Result<DeviceInfo, Unavailable>;
/// Creates a backend on a probed device.
pub type CreateFn = fn(&DeviceInfo, &BackendConfig) -> Result<Box<dyn BackendImpl>, GraphError>;

/// One registered backend.
#[derive(Debug, Clone)]
pub struct BackendEntry {
    pub handle: Backend,
    pub name: &'static str,
    /// Assignment preference; higher is asked first.
    pub priority: u16,
    /// Part of this binary.
    pub compiled_in: bool,
    /// The probe's answer on this machine (`Err` also when not compiled in).
    pub probed: Result<DeviceInfo, Unavailable>,
    /// `None` when not compiled in.
    pub capabilities: Option<Capabilities>,
    /// `None` when not compiled in.
    pub create: Option<CreateFn>,
    /// Graphviz fill colour of its nodes.
    pub color: &'static str,
}

impl BackendEntry {
    /// An entry for a built-in name that this binary does not contain.
    pub fn not_compiled(b: &Builtin) -> BackendEntry {
        BackendEntry {
            handle: b.handle,
            name: b.name,
            priority: b.priority,
            compiled_in: false,
            probed: Err(Unavailable { reason: "not compiled into this build".to_string() }),
            capabilities: None,
            create: None,
            color: b.color,
        }
    }

    /// Compiled in *and* its device is present and usable on this machine.
    pub fn usable_here(&self) -> bool {
        self.compiled_in && self.probed.is_ok() && self.create.is_some()
    }

    /// Creates the backend with `config` (errors when not usable here).
    pub fn instantiate(&self, config: &BackendConfig) -> Result<Box<dyn BackendImpl>, GraphError> {
        match (&self.probed, self.create) {
            (Ok(info), Some(create)) => create(info, config),
            (Err(why), _) => Err(GraphError::BackendUnusable { name: self.name.to_string(), reason: why.reason.clone() }),
            (Ok(_), None) => Err(GraphError::BackendNotCompiled { name: self.name.to_string() }),
        }
    }
}

/// The set of backends, ordered by identity.
#[derive(Debug, Clone)]
pub struct BackendRegistry {
    entries: Vec<BackendEntry>,
}

impl BackendRegistry {
    /// A registry from explicit entries (tests, future backends), kept in identity order.
    pub fn new(mut entries: Vec<BackendEntry>) -> BackendRegistry {
        entries.sort_by_key(|e| e.handle);
        entries.dedup_by_key(|e| e.handle);
        BackendRegistry { entries }
    }

    /// Entries in identity (id) order.
    pub fn entries(&self) -> &[BackendEntry] {
        &self.entries
    }

    /// Entries, highest priority first; ties broken by id. Deterministic.
    pub fn by_priority(&self) -> Vec<&BackendEntry> {
        let mut v: Vec<&BackendEntry> = self.entries.iter().collect();
        v.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.handle.cmp(&b.handle)));
        v
    }

    pub fn entry(&self, backend: Backend) -> Option<&BackendEntry> {
        self.entries.iter().find(|e| e.handle == backend)
    }

    /// Case-insensitive lookup by name.
    pub fn lookup(&self, name: &str) -> Option<&BackendEntry> {
        self.entries
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(name))
    }

    /// Parses a comma-separated fence (`"cuda,cpu"`). Every name must be known, compiled in and
    /// usable here; otherwise the refusal names the backend and which of the three failed.
    pub fn parse_fence(&self, spec: &str) -> Result<BackendFence, GraphError> {
        let mut allowed = Vec::new();
        for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let entry = self
                .lookup(name)
                .ok_or_else(|| GraphError::UnknownBackend {
                    name: name.to_string(),
                    known: self
                        .entries
                        .iter()
                        .map(|e| e.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            if !entry.compiled_in {
                return Err(GraphError::BackendNotCompiled {
                    name: entry.name.to_string(),
                });
            }
            if let Err(why) = &entry.probed {
                return Err(GraphError::BackendUnusable {
                    name: entry.name.to_string(),
                    reason: why.reason.clone(),
                });
            }
            if !allowed.contains(&entry.handle) {
                allowed.push(entry.handle);
            }
        }
        if allowed.is_empty() {
            return Err(GraphError::EmptyFence {
                spec: spec.to_string(),
            });
        }
        allowed.sort();
        Ok(BackendFence {
            allowed: Some(allowed),
        })
    }

    /// The fence from `--backend` if given, else from `MINFER_BACKENDS`, else no fence.
    pub fn resolve_fence(&self, cli: Option<&str>) -> Result<BackendFence, GraphError> {
        match cli {
            Some(spec) => self.parse_fence(spec),
            None => match std::env::var(BACKENDS_ENV) {
                Ok(spec) => self.parse_fence(&spec),
                Err(_) => Ok(BackendFence::all()),
            },
        }
    }
}

/// Which backends may take nodes. The CPU is always allowed: it is the terminal of the
/// assignment walk (the landing pad for inputs and for ops no device claims).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackendFence {
    /// `None`: every backend with a pool.
    allowed: Option<Vec<Backend>>,
}

impl BackendFence {
    pub fn all() -> BackendFence {
        BackendFence { allowed: None }
    }

    /// A fence over explicit handles (no name checks: for code that already holds the pools).
    pub fn only(backends: &[Backend]) -> BackendFence {
        let mut allowed = backends.to_vec();
        allowed.sort();
        allowed.dedup();
        BackendFence {
            allowed: Some(allowed),
        }
    }

    pub fn allows(&self, backend: Backend) -> bool {
        backend == Backend::CPU || self.allowed.as_ref().is_none_or(|a| a.contains(&backend))
    }
}
