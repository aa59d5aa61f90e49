//! The real [`Device`]: the CUDA driver API through cudarc's raw calls, on device 0's primary
//! context and the legacy default stream (launches and copies in one order; a download
//! waits for every launch before it). Modules are NVRTC's PTX for the device's virtual
//! architecture, from the [`module_cache`](super::module_cache).
//!
//! This file and `driver.rs` / `nvrtc.rs` are the CUDA backend's FFI modules: every `unsafe`
//! block here is a driver call on handles this struct created.

use std::collections::HashMap;
use std::ffi::{CString, c_void};

use cudarc::driver::{result, sys};

use super::device::{Arg, DevPtr, Device, DeviceError, FuncId, Launch};
use super::module_cache;
use super::nvrtc::Source;

/// Device 0 with its primary context.
pub struct DriverDevice {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    cc: (i32, i32),
    modules: HashMap<String, sys::CUmodule>,
    funcs: Vec<sys::CUfunction>,
    /// The last module-cache outcome per source (for `minfer info` and the device report).
    pub cache_log: Vec<(String, module_cache::Outcome)>,
}

// SAFETY: the context handle is process-wide; every method makes it current on the calling
// thread before any driver call, and the backend that owns this device is used by one thread
// at a time (`&mut self`).
unsafe impl Send for DriverDevice {}

fn err(call: &str, e: cudarc::driver::DriverError) -> DeviceError {
    let name = e.error_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    DeviceError::new(call, name)
}

impl DriverDevice {
    /// Opens device 0 (after [`driver::probe`](super::driver::probe) said it is usable).
    pub fn open() -> Result<DriverDevice, DeviceError> {
        let info = super::driver::probe().map_err(|r| DeviceError::new("probe", r))?;
        let dev = result::device::get(info.ordinal).map_err(|e| err("cuDeviceGet", e))?;
        // SAFETY: `dev` is a valid device handle; the primary context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| err("cuDevicePrimaryCtxRetain", e))?;
        let d = DriverDevice { dev, ctx, name: info.name, cc: info.cc, modules: HashMap::new(), funcs: Vec::new(), cache_log: Vec::new() };
        d.current()?;
        Ok(d)
    }

    fn current(&self) -> Result<(), DeviceError> {
        // SAFETY: `ctx` was retained in `open` and is released only in Drop.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| err("cuCtxSetCurrent", e))
    }

    fn arch(&self) -> String {
        format!("compute_{}{}", self.cc.0, self.cc.1)
    }
}

impl Device for DriverDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    fn memory_info(&self) -> Option<(u64, u64)> {
        self.current().ok()?;
        result::mem_get_info().ok().map(|(f, t)| (f as u64, t as u64))
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevPtr, DeviceError> {
        self.current()?;
        // SAFETY: a plain allocation in the current context (at least one byte: cuMemAlloc
        // refuses zero), zero-filled before it is handed out.
        unsafe {
            let p = result::malloc_sync(bytes.max(1)).map_err(|e| err(&format!("cuMemAlloc({bytes})"), e))?;
            result::memset_d8_sync(p, 0, bytes.max(1)).map_err(|e| err("cuMemsetD8", e))?;
            Ok(p)
        }
    }

    fn free(&mut self, ptr: DevPtr) {
        if self.current().is_ok() {
            // SAFETY: `ptr` came from `alloc` and the executor frees it once.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    fn upload(&mut self, dst: DevPtr, data: &[u8]) -> Result<(), DeviceError> {
        if data.is_empty() {
            return Ok(());
        }
        self.current()?;
        // SAFETY: the executor bounds-checked `dst..dst + data.len()` inside one allocation.
        unsafe { result::memcpy_htod_sync(dst, data) }.map_err(|e| err("cuMemcpyHtoD", e))
    }

    fn download(&mut self, src: DevPtr, out: &mut [u8]) -> Result<(), DeviceError> {
        if out.is_empty() {
            return Ok(());
        }
        self.current()?;
        // SAFETY: as `upload`; the legacy stream orders it after every queued launch.
        unsafe { result::memcpy_dtoh_sync(out, src) }.map_err(|e| err("cuMemcpyDtoH", e))
    }

    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), DeviceError> {
        if bytes == 0 {
            return Ok(());
        }
        self.current()?;
        // SAFETY: both ranges were bounds-checked by the executor and do not overlap.
        unsafe { result::memcpy_dtod_sync(dst, src, bytes) }.map_err(|e| err("cuMemcpyDtoD", e))
    }

    fn function(&mut self, src: Source<'static>, name: &str) -> Result<FuncId, DeviceError> {
        self.current()?;
        let module = match self.modules.get(src.name) {
            Some(m) => *m,
            None => {
                let (ptx, outcome) = module_cache::ptx(src, &self.arch(), &[]).map_err(|e| DeviceError::new(format!("compile {}", src.name), e.to_string()))?;
                self.cache_log.push((src.name.to_string(), outcome));
                let image = CString::new(ptx).map_err(|_| DeviceError::new(format!("load {}", src.name), "PTX with a NUL byte"))?;
                // SAFETY: `image` is a NUL-terminated PTX text that outlives the call.
                let m = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| err(&format!("cuModuleLoadData({})", src.name), e))?;
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
        unsafe { result::launch_kernel(func, (shape.grid, 1, 1), (shape.block, 1, 1), shape.shared, std::ptr::null_mut(), &mut params) }
            .map_err(|e| err("cuLaunchKernel", e))
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.current()?;
        result::ctx::synchronize().map_err(|e| err("cuCtxSynchronize", e))
    }
}

impl Drop for DriverDevice {
    fn drop(&mut self) {
        if self.current().is_ok() {
            for m in self.modules.values() {
                // SAFETY: loaded by `function`, unloaded once here.
                let _ = unsafe { result::module::unload(*m) };
            }
        }
        // SAFETY: retained once in `open`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}
