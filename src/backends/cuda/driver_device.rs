//! The real [`Device`]: the CUDA driver API through cudarc's raw calls, on device 0's primary
//! context and one stream of its own (launches, copies and memsets in one order; an upload or
//! a download waits for the stream, so host buffers may go as soon as it returns; a graph can
//! only be captured on such a stream, not on the legacy one). Modules are NVRTC's PTX for the
//! device's virtual architecture, from the [`module_cache`](super::module_cache). Decode
//! graphs are captured with `cuStreamBeginCapture` (thread-local mode), instantiated once and
//! launched with `cuGraphLaunch`.
//!
//! This file and `driver.rs` / `nvrtc.rs` are the CUDA backend's FFI modules: every `unsafe`
//! block here is a driver call on handles this struct created.

use std::collections::HashMap;
use std::ffi::{CString, c_void};

use cudarc::driver::{result, sys};

use super::device::{Arg, DevPtr, Device, DeviceError, FuncId, GraphId, Launch};
use super::module_cache;
use super::nvrtc::Source;

/// Device 0 with its primary context.
pub struct DriverDevice {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    cc: (i32, i32),
    stream: sys::CUstream,
    modules: HashMap<String, sys::CUmodule>,
    funcs: Vec<sys::CUfunction>,
    /// Instantiated graphs (`None` once dropped).
    graphs: Vec<Option<sys::CUgraphExec>>,
}

// SAFETY: the context handle is process-wide; every method makes it current on the calling
// thread before any driver call, and the backend that owns this device is used by one thread
// at a time (`&mut self`).
unsafe impl Send for DriverDevice {}

fn err(call: &str, e: cudarc::driver::DriverError) -> DeviceError {
    DeviceError::new(call, super::driver::error_name(&e))
}

impl DriverDevice {
    /// Opens device 0 (after [`driver::probe`](super::driver::probe) said it is usable).
    pub fn open() -> Result<DriverDevice, DeviceError> {
        let info = super::driver::probe().map_err(|r| DeviceError::new("probe", r))?;
        let dev = result::device::get(info.ordinal).map_err(|e| err("cuDeviceGet", e))?;
        // SAFETY: `dev` is a valid device handle; the primary context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| err("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: the context was just retained.
        unsafe { result::ctx::set_current(ctx) }.map_err(|e| err("cuCtxSetCurrent", e))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking).map_err(|e| err("cuStreamCreate", e))?;
        Ok(DriverDevice { dev, ctx, name: info.name, cc: info.cc, stream, modules: HashMap::new(), funcs: Vec::new(), graphs: Vec::new() })
    }

    fn current(&self) -> Result<(), DeviceError> {
        // SAFETY: `ctx` was retained in `open` and is released only in Drop.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| err("cuCtxSetCurrent", e))
    }

    fn arch(&self) -> String {
        format!("compute_{}{}", self.cc.0, self.cc.1)
    }

    /// `src` compiled by NVRTC to a cubin for this device (`sm_XY`) and loaded.
    fn load_cubin(&self, src: Source<'static>) -> Result<sys::CUmodule, String> {
        let arch = format!("sm_{}{}", self.cc.0, self.cc.1);
        match super::nvrtc::compile(src, &arch, &[]).map_err(|e| e.to_string())?.image {
            // SAFETY: a cubin image NVRTC produced, alive for the call.
            super::nvrtc::Image::Cubin(bin) => unsafe { result::module::load_data(bin.as_ptr() as *const c_void) }.map_err(|e| err("cuModuleLoadData(cubin)", e).reason),
            super::nvrtc::Image::Ptx(_) => Err(format!("NVRTC gave PTX for {arch}")),
        }
    }
}

impl Device for DriverDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevPtr, DeviceError> {
        self.current()?;
        // SAFETY: a plain allocation in the current context (at least one byte: cuMemAlloc
        // refuses zero), zero-filled on our stream before it is handed out.
        unsafe {
            let p = result::malloc_sync(bytes.max(1)).map_err(|e| err(&format!("cuMemAlloc({bytes})"), e))?;
            result::memset_d8_async(p, 0, bytes.max(1), self.stream).map_err(|e| err("cuMemsetD8Async", e))?;
            result::stream::synchronize(self.stream).map_err(|e| err("cuStreamSynchronize", e))?;
            Ok(p)
        }
    }

    fn free(&mut self, ptr: DevPtr) {
        if self.current().is_ok() {
            // SAFETY: `ptr` came from `alloc` and the executor frees it once, after the stream
            // finished every launch that could use it.
            let _ = unsafe { result::stream::synchronize(self.stream).and_then(|_| result::free_sync(ptr)) };
        }
    }

    fn upload(&mut self, dst: DevPtr, data: &[u8]) -> Result<(), DeviceError> {
        if data.is_empty() {
            return Ok(());
        }
        self.current()?;
        // SAFETY: the executor bounds-checked `dst..dst + data.len()` inside one allocation;
        // `data` outlives the copy (the stream is waited for before returning).
        unsafe { result::memcpy_htod_async(dst, data, self.stream).and_then(|_| result::stream::synchronize(self.stream)) }.map_err(|e| err("cuMemcpyHtoDAsync", e))
    }

    fn download(&mut self, src: DevPtr, out: &mut [u8]) -> Result<(), DeviceError> {
        if out.is_empty() {
            return Ok(());
        }
        self.current()?;
        // SAFETY: as `upload`; the stream orders it after every queued launch.
        unsafe { result::memcpy_dtoh_async(out, src, self.stream).and_then(|_| result::stream::synchronize(self.stream)) }.map_err(|e| err("cuMemcpyDtoHAsync", e))
    }

    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), DeviceError> {
        if bytes == 0 {
            return Ok(());
        }
        self.current()?;
        // SAFETY: both ranges were bounds-checked by the executor and do not overlap.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }.map_err(|e| err("cuMemcpyDtoDAsync", e))
    }

    fn function(&mut self, src: Source<'static>, name: &str) -> Result<FuncId, DeviceError> {
        self.current()?;
        let module = match self.modules.get(src.name) {
            Some(m) => *m,
            None => {
                let (ptx, _) = module_cache::ptx(src, &self.arch(), &[]).map_err(|e| DeviceError::new(format!("compile {}", src.name), e.to_string()))?;
                let image = CString::new(ptx).map_err(|_| DeviceError::new(format!("load {}", src.name), "PTX with a NUL byte"))?;
                // SAFETY: `image` is a NUL-terminated PTX text that outlives the call.
                let m = match unsafe { result::module::load_data(image.as_ptr() as *const c_void) } {
                    Ok(m) => m,
                    // A driver older than NVRTC refuses its PTX version: a cubin for the
                    // device's own architecture needs no JIT.
                    Err(ptx_err) => self.load_cubin(src).map_err(|e| DeviceError::new(format!("cuModuleLoadData({})", src.name), format!("{}; as a cubin: {e}", err("PTX", ptx_err).reason)))?,
                };
                self.modules.insert(src.name.to_string(), m);
                m
            }
        };
        let cname = CString::new(name).map_err(|_| DeviceError::new("cuModuleGetFunction", "a kernel name with a NUL byte"))?;
        // SAFETY: `module` is loaded and not unloaded before Drop.
        let f = unsafe { result::module::get_function(module, cname) }.map_err(|e| err(&format!("cuModuleGetFunction({name})"), e))?;
        self.funcs.push(f);
        Ok(FuncId(self.funcs.len() as u32 - 1))
    }

    fn launch(&mut self, f: FuncId, shape: Launch, args: &[Arg]) -> Result<(), DeviceError> {
        let func = *self.funcs.get(f.0 as usize).ok_or_else(|| DeviceError::new("launch", format!("no function #{}", f.0)))?;
        if shape.grid == 0 || shape.block == 0 {
            return Ok(());
        }
        self.current()?;
        // One 8-byte slot per argument; the driver reads each parameter's own size from it
        // (the low bytes, little-endian).
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::I64(v) => v as u64,
                Arg::I32(v) => v as u32 as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        // SAFETY: `func` is a loaded kernel whose parameters are `args` in order (the
        // executor's launch table); the slots outlive the call, which copies them.
        unsafe { result::launch_kernel(func, (shape.grid, 1, 1), (shape.block, 1, 1), shape.shared, self.stream, &mut params) }
            .map_err(|e| err("cuLaunchKernel", e))
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.current()?;
        // SAFETY: our stream, created in `open`.
        unsafe { result::stream::synchronize(self.stream) }.map_err(|e| err("cuStreamSynchronize", e))
    }

    fn begin_capture(&mut self) -> Result<bool, DeviceError> {
        self.current()?;
        // SAFETY: our stream; thread-local mode refuses unsafe calls from this thread while
        // capturing, which the executor does not make (no alloc, copy or sync inside).
        unsafe { result::stream::begin_capture(self.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
            .map_err(|e| err("cuStreamBeginCapture", e))?;
        Ok(true)
    }

    fn end_capture(&mut self) -> Result<GraphId, DeviceError> {
        self.current()?;
        // SAFETY: ends the capture begun on our stream; the graph is instantiated, then its
        // template destroyed (the executable graph does not need it).
        let exec = unsafe {
            let graph = result::stream::end_capture(self.stream).map_err(|e| err("cuStreamEndCapture", e))?;
            let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
            let _ = result::graph::destroy(graph);
            exec.map_err(|e| err("cuGraphInstantiate", e))?
        };
        self.graphs.push(Some(exec));
        Ok(GraphId(self.graphs.len() as u32 - 1))
    }

    fn replay(&mut self, graph: GraphId) -> Result<(), DeviceError> {
        let exec = self.graphs.get(graph.0 as usize).copied().flatten().ok_or_else(|| DeviceError::new("cuGraphLaunch", format!("no graph #{}", graph.0)))?;
        self.current()?;
        // SAFETY: an instantiated graph of this context, launched on our stream.
        unsafe { result::graph::launch(exec, self.stream) }.map_err(|e| err("cuGraphLaunch", e))
    }

    fn drop_graph(&mut self, graph: GraphId) {
        if let Some(exec) = self.graphs.get_mut(graph.0 as usize).and_then(Option::take)
            && self.current().is_ok()
        {
            // SAFETY: instantiated by `end_capture`, destroyed once (taken out of the table)
            // after the stream finished any launch of it.
            let _ = unsafe { result::stream::synchronize(self.stream).and_then(|_| result::graph::exec_destroy(exec)) };
        }
    }
}

impl Drop for DriverDevice {
    fn drop(&mut self) {
        if self.current().is_ok() {
            for g in 0..self.graphs.len() {
                self.drop_graph(GraphId(g as u32));
            }
            // SAFETY: created in `open`, destroyed once, after its work.
            let _ = unsafe { result::stream::synchronize(self.stream).and_then(|_| result::stream::destroy(self.stream)) };
            for m in self.modules.values() {
                // SAFETY: loaded by `function`, unloaded once here.
                let _ = unsafe { result::module::unload(*m) };
            }
        }
        // SAFETY: retained once in `open`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}
