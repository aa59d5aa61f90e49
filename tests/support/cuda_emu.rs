//! A host emulator of a CUDA device, for checking the CUDA executor and its kernels on a
//! machine without a GPU: [`EmuDevice`] implements minfer's CUDA [`Device`] seam with host
//! memory, and compiles each kernel source — the same `.cu` text NVRTC compiles — with g++,
//! with `cuda_emu/emu.h` defining the CUDA dialect the kernels use and `cuda_emu/runtime.cpp`
//! running every CUDA thread as a fiber (barriers and warp shuffles switch between them).
//!
//! What it checks: the kernels' arithmetic and indexing, the launch shapes and argument lists
//! the executor passes (a wrong count or order gives wrong numbers), barriers and shuffles
//! (a divergent barrier is a reported deadlock). What it does not: timing, memory-model races
//! between blocks (blocks run one after another), PTX-only instructions (`mma`; kernels keep
//! a portable path beside them), and the device's float contraction (g++ does not fuse
//! multiply-adds here; NVRTC does) — so results are judged by tolerances, as a GPU's are.
//!
//! x86-64 Linux only (the fiber switch); modules are cached under the test target's temp
//! folder by a hash of the source, the headers and the emulator files.
//!
//! This is an FFI module of the tests: the unsafe blocks are raw host memory behind device
//! addresses and calls into the compiled modules.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::process::Command;

use minfer::backends::cuda::device::{Arg, DevPtr, Device, DeviceError, FuncId, GraphId, Launch};
use minfer::backends::cuda::module_cache;
use minfer::backends::cuda::nvrtc::Source;

const EMU_H: &str = include_str!("cuda_emu/emu.h");
const RUNTIME: &str = include_str!("cuda_emu/runtime.cpp");

/// Serializes module compiles (see [`EmuDevice::compile`]).
static COMPILE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Serializes launches across emulated devices (see [`EmuDevice::launch`]).
static LAUNCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

type LaunchFn = unsafe extern "C" fn(*const c_void, u32, u32, *const u64, i32, *const f32, i32, *mut u8, i32) -> i32;

/// A compiled module: its library (kept loaded) and its `emu_launch`.
struct Module {
    lib: libloading::Library,
    launch: LaunchFn,
}

/// The launches of a recorded graph, in order.
type Recording = Vec<(FuncId, Launch, Vec<Arg>)>;

/// The emulated device.
pub struct EmuDevice {
    allocs: HashMap<u64, Layout>,
    modules: HashMap<String, Module>,
    /// `(module name, kernel address)` per function id.
    funcs: Vec<(String, usize)>,
    dir: PathBuf,
    /// Recorded graphs (`None` once dropped) and the one being recorded.
    graphs: Vec<Option<Recording>>,
    recording: Option<Recording>,
    /// Graphs replayed, readable after the device is boxed into a backend.
    pub replays: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl EmuDevice {
    /// A device compiling its modules under the tests' temp folder. Fails where the
    /// emulator cannot run (not x86-64 Linux, no g++).
    pub fn new() -> Result<EmuDevice, String> {
        if !cfg!(all(target_arch = "x86_64", target_os = "linux")) {
            return Err("the CUDA emulator runs on x86-64 Linux only".into());
        }
        let ok = Command::new("g++").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
        if !ok {
            return Err("the CUDA emulator needs g++".into());
        }
        let base = option_env!("CARGO_TARGET_TMPDIR").map(PathBuf::from).filter(|p| p.is_dir()).unwrap_or_else(std::env::temp_dir);
        Ok(EmuDevice { allocs: HashMap::new(), modules: HashMap::new(), funcs: Vec::new(), dir: base.join("cuda-emu"), graphs: Vec::new(), recording: None, replays: Default::default() })
    }

    fn compile(&self, src: &Source) -> Result<PathBuf, DeviceError> {
        let fail = |why: String| DeviceError::new(format!("emulator compile {}", src.name), why);
        let key = module_cache::key(src, "emu", &[EMU_H.to_string(), RUNTIME.to_string()], (0, 0));
        let dir = self.dir.join(format!("{key:016x}"));
        let so = dir.join("module.so");
        // One compile at a time in this process (devices of concurrent tests share modules);
        // other processes write their own temporary file and rename it over.
        let _one_at_a_time = COMPILE.lock().unwrap_or_else(|p| p.into_inner());
        if so.is_file() {
            return Ok(so);
        }
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let mut files: Vec<(&str, &str)> = vec![("emu.h", EMU_H), ("runtime.cpp", RUNTIME), (src.name, src.text)];
        files.extend(src.headers.iter().copied());
        for (name, text) in files {
            std::fs::write(dir.join(name), text).map_err(|e| fail(format!("{name}: {e}")))?;
        }
        let tmp = dir.join(format!("module.{}.so", std::process::id()));
        let out = Command::new("g++")
            .args(["-std=c++17", "-O2", "-fPIC", "-shared", "-w", "-include"])
            .arg(dir.join("emu.h"))
            .arg("-I")
            .arg(&dir)
            .args(["-x", "c++"])
            .arg(dir.join(src.name))
            .arg(dir.join("runtime.cpp"))
            .arg("-o")
            .arg(&tmp)
            .output()
            .map_err(|e| fail(format!("g++: {e}")))?;
        if !out.status.success() {
            return Err(fail(String::from_utf8_lossy(&out.stderr).into_owned()));
        }
        std::fs::rename(&tmp, &so).map_err(|e| fail(format!("{}: {e}", so.display())))?;
        Ok(so)
    }
}

fn oom(bytes: usize) -> DeviceError {
    DeviceError::new(format!("emulator alloc({bytes})"), "out of host memory")
}

impl Device for EmuDevice {
    fn name(&self) -> &str {
        "CUDA host emulator"
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevPtr, DeviceError> {
        if self.recording.is_some() {
            return Err(DeviceError::new("emulator alloc", "an allocation while launches are recorded"));
        }
        let layout = Layout::from_size_align(bytes.max(1), 256).map_err(|_| oom(bytes))?;
        // SAFETY: a non-zero-size layout; freed in `free` with the same layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom(bytes));
        }
        self.allocs.insert(p as u64, layout);
        Ok(p as u64)
    }

    fn free(&mut self, ptr: DevPtr) {
        if let Some(layout) = self.allocs.remove(&ptr) {
            // SAFETY: allocated by `alloc` with this layout, freed once (removed from the map).
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }

    fn upload(&mut self, dst: DevPtr, data: &[u8]) -> Result<(), DeviceError> {
        if self.recording.is_some() {
            return Err(DeviceError::new("emulator upload", "a transfer while launches are recorded"));
        }
        // SAFETY: the executor bounds-checked the range inside one allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
        Ok(())
    }

    fn download(&mut self, src: DevPtr, out: &mut [u8]) -> Result<(), DeviceError> {
        if self.recording.is_some() {
            return Err(DeviceError::new("emulator download", "a transfer while launches are recorded"));
        }
        // SAFETY: as `upload`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), DeviceError> {
        // SAFETY: as `upload`; `copy` (memmove) tolerates overlap anyway.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn function(&mut self, src: Source<'static>, name: &str) -> Result<FuncId, DeviceError> {
        if !self.modules.contains_key(src.name) {
            let so = self.compile(&src)?;
            let load = |e: libloading::Error| DeviceError::new(format!("emulator load {}", src.name), e.to_string());
            // SAFETY: a module this emulator compiled; its initialisers are the C++ runtime's.
            let lib = unsafe { libloading::Library::new(&so) }.map_err(load)?;
            // SAFETY: `emu_launch` has the signature of `LaunchFn` in runtime.cpp.
            let launch = unsafe { lib.get::<LaunchFn>(b"emu_launch\0") }.map_err(load)?;
            let launch = *launch;
            self.modules.insert(src.name.to_string(), Module { lib, launch });
        }
        let module = &self.modules[src.name];
        let sym = format!("{name}\0");
        // SAFETY: looked up as an address only; called through `emu_launch`.
        let f = unsafe { module.lib.get::<*const c_void>(sym.as_bytes()) }
            .map_err(|e| DeviceError::new(format!("emulator kernel {name}"), e.to_string()))?;
        let addr = *f as usize;
        self.funcs.push((src.name.to_string(), addr));
        Ok(FuncId(self.funcs.len() as u32 - 1))
    }

    fn launch(&mut self, f: FuncId, shape: Launch, args: &[Arg]) -> Result<(), DeviceError> {
        if let Some(r) = &mut self.recording {
            r.push((f, shape, args.to_vec()));
            return Ok(());
        }
        let (module, addr) = self.funcs.get(f.0 as usize).cloned().ok_or_else(|| DeviceError::new("launch", format!("no function #{}", f.0)))?;
        let launch = self.modules[&module].launch;
        let (mut ints, mut floats) = (Vec::new(), Vec::new());
        for a in args {
            match *a {
                Arg::Ptr(p) => ints.push(p),
                Arg::I32(v) => ints.push(v as i64 as u64),
                Arg::I64(v) => ints.push(v as u64),
                Arg::F32(v) => floats.push(v),
            }
        }
        let mut err = vec![0u8; 256];
        // A module's runtime (its fibers and stacks) is one per process however many devices
        // load it: launches are serialized.
        let _one_at_a_time = LAUNCH.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `addr` is a kernel of this module; the argument classes and order are the
        // kernel's (the executor's launch table), which `emu_launch` forwards by the ABI.
        let rc = unsafe {
            launch(addr as *const c_void, shape.grid, shape.block, ints.as_ptr(), ints.len() as i32, floats.as_ptr(), floats.len() as i32, err.as_mut_ptr(), err.len() as i32)
        };
        if rc != 0 {
            let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
            return Err(DeviceError::new("emulator launch", String::from_utf8_lossy(&err[..end]).into_owned()));
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn begin_capture(&mut self) -> Result<bool, DeviceError> {
        match self.recording {
            Some(_) => Err(DeviceError::new("begin_capture", "already recording")),
            None => {
                self.recording = Some(Vec::new());
                Ok(true)
            }
        }
    }

    fn end_capture(&mut self) -> Result<GraphId, DeviceError> {
        let g = self.recording.take().ok_or_else(|| DeviceError::new("end_capture", "not recording"))?;
        self.graphs.push(Some(g));
        Ok(GraphId(self.graphs.len() as u32 - 1))
    }

    fn replay(&mut self, graph: GraphId) -> Result<(), DeviceError> {
        let launches = self.graphs.get(graph.0 as usize).cloned().flatten().ok_or_else(|| DeviceError::new("replay", format!("no graph #{}", graph.0)))?;
        self.replays.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (f, shape, args) in launches {
            self.launch(f, shape, &args)?;
        }
        Ok(())
    }

    fn drop_graph(&mut self, graph: GraphId) {
        if let Some(g) = self.graphs.get_mut(graph.0 as usize) {
            *g = None;
        }
    }
}

impl Drop for EmuDevice {
    fn drop(&mut self) {
        for (ptr, layout) in self.allocs.drain() {
            // SAFETY: as `free`.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }
}
