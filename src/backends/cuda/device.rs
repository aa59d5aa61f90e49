//! The device seam under the CUDA executor: raw device memory, modules and kernel launches.
//!
//! [`CudaBackend`](super::CudaBackend) speaks only this trait, so the same executor runs on a
//! real GPU ([`DriverDevice`](super::driver_device::DriverDevice), the driver API through
//! cudarc) and on the host emulator the tests use (`tests/support/cuda_emu.rs`: the same
//! kernel sources compiled as C++, every CUDA thread a fiber), which is how the executor and
//! the kernels are checked on a machine without a GPU.
//!
//! Addresses are plain `u64`s ([`DevPtr`]); the executor adds byte offsets to a buffer's base.
//! Every call is fallible with a [`DeviceError`] naming the call and the driver's reason.
//! Launches are in stream order; [`Device::synchronize`] waits for all of them, and a download
//! waits for the launches before it.

use super::nvrtc::Source;

/// A device address (a buffer's base plus a byte offset).
pub type DevPtr = u64;

/// A loaded kernel: an index into the device's table of functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FuncId(pub u32);

/// A recorded graph of launches ([`Device::begin_capture`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub u32);

/// One kernel argument, by value, in the kernel's parameter order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    Ptr(DevPtr),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// A launch shape: `grid` blocks of `block` threads (one-dimensional), `shared` bytes of
/// dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: u32,
    pub block: u32,
    pub shared: u32,
}

/// A device call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {reason}")]
pub struct DeviceError {
    /// The operation (`"cuMemAlloc"`, `"launch rms_norm_f32"`, `"compile norm.cu"`).
    pub call: String,
    pub reason: String,
}

impl DeviceError {
    pub fn new(call: impl Into<String>, reason: impl Into<String>) -> DeviceError {
        DeviceError { call: call.into(), reason: reason.into() }
    }
}

/// What the executor needs of a CUDA device.
pub trait Device: Send {
    /// The device's name (for messages and reports).
    fn name(&self) -> &str;

    /// `bytes` bytes of zero-filled device memory.
    fn alloc(&mut self, bytes: usize) -> Result<DevPtr, DeviceError>;
    /// Releases an allocation made by [`Device::alloc`].
    fn free(&mut self, ptr: DevPtr);
    /// Host to device (complete when it returns).
    fn upload(&mut self, dst: DevPtr, data: &[u8]) -> Result<(), DeviceError>;
    /// Device to host, after every queued launch.
    fn download(&mut self, src: DevPtr, out: &mut [u8]) -> Result<(), DeviceError>;
    /// Device to device, `bytes` bytes; the ranges do not overlap.
    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), DeviceError>;

    /// The kernel `name` of source `src`: the source is compiled (or found compiled) and
    /// loaded at its first use, once per source name.
    fn function(&mut self, src: Source<'static>, name: &str) -> Result<FuncId, DeviceError>;
    /// Queues one launch of `f` with `args`.
    fn launch(&mut self, f: FuncId, shape: Launch, args: &[Arg]) -> Result<(), DeviceError>;
    /// Waits for every queued launch and transfer.
    fn synchronize(&mut self) -> Result<(), DeviceError>;

    /// Optional: graph capture (CUDA graphs). From `begin_capture` to `end_capture` launches
    /// are recorded, not run; [`replay`](Device::replay) runs a recorded graph's launches in
    /// order with the arguments they were recorded with. No allocation, transfer or
    /// synchronization may happen while recording. `Ok(false)` (the default): the device cannot
    /// record, and the executor launches every time.
    fn begin_capture(&mut self) -> Result<bool, DeviceError> {
        Ok(false)
    }
    /// Ends the recording begun by [`begin_capture`](Device::begin_capture).
    fn end_capture(&mut self) -> Result<GraphId, DeviceError> {
        Err(DeviceError::new("end_capture", "this device does not record graphs"))
    }
    /// Queues a recorded graph.
    fn replay(&mut self, _graph: GraphId) -> Result<(), DeviceError> {
        Err(DeviceError::new("replay", "this device does not record graphs"))
    }
    /// Releases a recorded graph.
    fn drop_graph(&mut self, _graph: GraphId) {}
}
