//! The CUDA driver, probed without letting cudarc panic: `libcuda.so.1` is opened by name
//! first (cudarc panics on its first call when the library is missing), then `cuInit`, the
//! device count and device 0's name, memory and compute capability. The answer is computed once
//! per process.

use std::sync::OnceLock;

use cudarc::driver::{result, sys};

/// What the driver reported for the device the backend uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub ordinal: i32,
    pub name: String,
    pub total_mem: u64,
    /// Compute capability (major, minor), e.g. (9, 0) on an H100/H200.
    pub cc: (i32, i32),
}

impl Device {
    /// The NVRTC virtual architecture for this device (`compute_90`).
    pub fn compute_arch(&self) -> String {
        format!("compute_{}{}", self.cc.0, self.cc.1)
    }
}

static PROBED: OnceLock<Result<Device, String>> = OnceLock::new();

/// The driver's name of an error (`CUDA_ERROR_OUT_OF_MEMORY`), or its number.
pub fn error_name(e: &cudarc::driver::DriverError) -> String {
    e.error_name().map(|c| c.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0))
}

fn driver_err(what: &str, e: cudarc::driver::DriverError) -> String {
    format!("{what} failed: {}", error_name(&e))
}

fn probe_uncached() -> Result<Device, String> {
    // SAFETY: opening the driver library runs its initialisers only; the handle is dropped at
    // once (cudarc opens it again for its own use).
    match unsafe { libloading::Library::new("libcuda.so.1") } {
        Ok(lib) => drop(lib),
        Err(e) => return Err(format!("libcuda.so.1 not found (no NVIDIA driver installed): {e}")),
    }
    // SAFETY: only tries to dlopen cudarc's candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so.1 loads, but cudarc's loader does not find the driver library".into());
    }
    result::init().map_err(|e| driver_err("cuInit", e))?;
    let n = result::device::get_count().map_err(|e| driver_err("cuDeviceGetCount", e))?;
    if n < 1 {
        return Err("the driver reports no CUDA device".into());
    }
    let dev = result::device::get(0).map_err(|e| driver_err("cuDeviceGet(0)", e))?;
    let name = result::device::get_name(dev).map_err(|e| driver_err("cuDeviceGetName", e))?;
    // SAFETY: `dev` is a valid device handle returned by cuDeviceGet.
    let total_mem = unsafe { result::device::total_mem(dev) }.map_err(|e| driver_err("cuDeviceTotalMem", e))? as u64;
    let attr = |a| {
        // SAFETY: as above; the attribute is a valid enum value.
        unsafe { result::device::get_attribute(dev, a) }.map_err(|e| driver_err("cuDeviceGetAttribute", e))
    };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    if major < super::kernels::MIN_CC.0 || (major == super::kernels::MIN_CC.0 && minor < super::kernels::MIN_CC.1) {
        return Err(format!(
            "{name} has compute capability {major}.{minor}; the kernels need {}.{} or newer",
            super::kernels::MIN_CC.0,
            super::kernels::MIN_CC.1
        ));
    }
    Ok(Device { ordinal: 0, name, total_mem, cc: (major, minor) })
}

/// The driver and device 0, or why not.
pub fn probe() -> Result<Device, String> {
    PROBED.get_or_init(probe_uncached).clone()
}
