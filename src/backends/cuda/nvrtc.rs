//! NVRTC: finding the library at run time and compiling the kernel sources to PTX or a cubin.
//!
//! The library is looked for, in order, at `$MINFER_NVRTC` (the path of `libnvrtc.so.12`, e.g.
//! from the `nvidia-cuda-nvrtc-cu12` wheel), in `$CUDA_HOME/lib64` and `/usr/local/cuda/lib64`,
//! then by its bare name on the loader's path. A library found by path is loaded by that path
//! (with its `libnvrtc-builtins` beside it) before cudarc's own `dlopen("libnvrtc.so.12")`,
//! which the loader then answers with the library already loaded. Nothing here panics when the
//! library is absent: [`locate`] says so first, and cudarc is only called after it succeeded.
//!
//! Compiling keeps the log of a *successful* compile too: a kernel source that compiles with a
//! warning is an error in the conformance test (`tests/cuda_kernels.rs`).
//! This file and `driver.rs` are the CUDA backend's FFI modules.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

/// Environment variable naming the `libnvrtc.so.12` to load.
pub const NVRTC_ENV: &str = "MINFER_NVRTC";

/// Why NVRTC could not be used or a source did not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvrtcError {
    #[error("libnvrtc.so.12 not found (set {NVRTC_ENV} to its path, or install the CUDA toolkit or the nvidia-cuda-nvrtc-cu12 wheel): {detail}")]
    NotFound { detail: String },
    #[error("{NVRTC_ENV}={path} cannot be loaded: {detail}")]
    BadPath { path: String, detail: String },
    #[error("kernel source {name} contains a NUL byte")]
    NulInSource { name: String },
    #[error("NVRTC failed to {step} for {name}: {code}")]
    Call { name: String, step: &'static str, code: String },
    #[error("kernel {name} does not compile for {arch}:\n{log}")]
    Compile { name: String, arch: String, log: String },
}

/// What a compile produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    /// PTX text (for `compute_XY`), NUL-free.
    Ptx(String),
    /// A cubin (for `sm_XY`).
    Cubin(Vec<u8>),
}

/// A successful compile: the image and NVRTC's log (warnings; empty when clean).
#[derive(Debug, Clone)]
pub struct Compiled {
    pub image: Image,
    pub log: String,
}

/// The NVRTC version, once the library is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub major: i32,
    pub minor: i32,
}

static LOCATED: OnceLock<Result<Version, NvrtcError>> = OnceLock::new();

fn candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(home) = std::env::var("CUDA_HOME") {
        v.push(Path::new(&home).join("lib64/libnvrtc.so.12"));
    }
    v.push(PathBuf::from("/usr/local/cuda/lib64/libnvrtc.so.12"));
    v
}

/// Loads `path` and its builtins library (same folder) and keeps them loaded for the process.
fn preload(path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        let builtins = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so")));
        if let Some(b) = builtins {
            // SAFETY: loading a shared library runs its initialisers; libnvrtc-builtins is
            // NVIDIA's library with no initialisers that touch our state. The handle is leaked
            // on purpose: the library must stay mapped for the life of the process.
            if let Ok(lib) = unsafe { libloading::Library::new(&b) } {
                std::mem::forget(lib);
            }
        }
    }
    // SAFETY: as above, for libnvrtc itself; leaked so cudarc's later dlopen of the same
    // soname finds it already loaded.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    std::mem::forget(lib);
    Ok(())
}

fn locate_uncached() -> Result<Version, NvrtcError> {
    match std::env::var(NVRTC_ENV) {
        Ok(p) if !p.is_empty() => {
            preload(Path::new(&p)).map_err(|detail| NvrtcError::BadPath { path: p.clone(), detail })?;
        }
        _ => {
            let found = candidates().into_iter().find(|c| c.is_file());
            match found {
                Some(c) => preload(&c).map_err(|detail| NvrtcError::NotFound { detail })?,
                None => {
                    // The bare soname on the loader's path (LD_LIBRARY_PATH, ldconfig).
                    // SAFETY: as in `preload`.
                    let lib = unsafe { libloading::Library::new("libnvrtc.so.12") }.map_err(|e| NvrtcError::NotFound { detail: e.to_string() })?;
                    std::mem::forget(lib);
                }
            }
        }
    }
    // SAFETY: is_culib_present only tries to dlopen cudarc's candidate names; it never panics.
    if !unsafe { sys::is_culib_present() } {
        return Err(NvrtcError::NotFound { detail: "loaded, but cudarc's loader does not see it".into() });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); both out-pointers are valid locals.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(NvrtcError::Call { name: "nvrtc".into(), step: "report its version", code: format!("{rc:?}") });
    }
    Ok(Version { major, minor })
}

/// Finds and loads NVRTC once per process; later calls return the first answer.
pub fn locate() -> Result<Version, NvrtcError> {
    LOCATED.get_or_init(locate_uncached).clone()
}

fn log_of(prog: sys::nvrtcProgram) -> String {
    // SAFETY: `prog` is a live program created by `create_program` and not yet destroyed.
    match unsafe { result::get_program_log(prog) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// One source to compile: its file name, text, and the headers it may `#include` by name.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub name: &'a str,
    pub text: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
}

fn c_string(name: &str, text: &str) -> Result<CString, NvrtcError> {
    CString::new(text).map_err(|_| NvrtcError::NulInSource { name: name.to_string() })
}

/// Compiles `src` for `arch`: `compute_XY` gives PTX, `sm_XY` a cubin. `extra` options are
/// appended after the fixed ones.
pub fn compile(src: Source, arch: &str, extra: &[String]) -> Result<Compiled, NvrtcError> {
    locate()?;
    let name = src.name;
    let call = |step: &'static str, code: String| NvrtcError::Call { name: name.to_string(), step, code };
    let src_c = c_string(name, src.text)?;
    let name_c = c_string(name, name)?;
    let mut header_texts = Vec::with_capacity(src.headers.len());
    let mut header_names = Vec::with_capacity(src.headers.len());
    for (h_name, h_text) in src.headers {
        header_names.push(c_string(h_name, h_name)?);
        header_texts.push(c_string(h_name, h_text)?);
    }
    let text_ptrs: Vec<*const std::ffi::c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let name_ptrs: Vec<*const std::ffi::c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a NUL-terminated CString or a Vec of them that outlives the
    // program (all are dropped after `destroy_program` below); the counts match the vectors.
    let rc = unsafe {
        sys::nvrtcCreateProgram(&mut prog, src_c.as_ptr(), name_c.as_ptr(), text_ptrs.len() as i32, text_ptrs.as_ptr(), name_ptrs.as_ptr())
    };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(call("create a program", format!("{rc:?}")));
    }
    let mut opts = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "-default-device".to_string(), "--fmad=true".to_string()];
    opts.extend(extra.iter().cloned());
    // SAFETY: `prog` is live; the options are owned strings converted to C strings by cudarc.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let log = log_of(prog);
    let out = match compiled {
        Err(_) => Err(NvrtcError::Compile { name: name.to_string(), arch: arch.to_string(), log }),
        Ok(()) if arch.starts_with("sm_") => cubin_of(prog).map_err(|c| call("return the cubin", c)).map(|b| Compiled { image: Image::Cubin(b), log }),
        Ok(()) => {
            // SAFETY: `prog` is live and compiled.
            match unsafe { result::get_ptx(prog) } {
                Ok(chars) => {
                    // SAFETY: NVRTC returns a NUL-terminated buffer.
                    let text = unsafe { CStr::from_ptr(chars.as_ptr()) }.to_string_lossy().into_owned();
                    Ok(Compiled { image: Image::Ptx(text), log })
                }
                Err(e) => Err(call("return the PTX", format!("{e:?}"))),
            }
        }
    };
    // SAFETY: `prog` is live and destroyed exactly once, here.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn cubin_of(prog: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut n = 0usize;
    // SAFETY: `prog` is live and compiled for a real arch; `n` is a valid out-pointer.
    let rc = unsafe { sys::nvrtcGetCUBINSize(prog, &mut n) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("{rc:?}"));
    }
    let mut bytes = vec![0u8; n];
    // SAFETY: `bytes` holds exactly the size NVRTC reported.
    let rc = unsafe { sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast()) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("{rc:?}"));
    }
    Ok(bytes)
}
