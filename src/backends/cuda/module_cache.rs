//! The compiled-module disk cache: NVRTC's PTX for a kernel source, kept on disk so that the
//! second start of `minfer` compiles nothing.
//!
//! A module is keyed by everything that changes its PTX: the source's name and text, every
//! header's name and text, the target architecture, the compile options and the NVRTC
//! version. The key is a 64-bit FNV-1a hash of those ([`Fnv`]), in the file name
//! (`<source>-<arch>-<hash>.ptx`). A file that is unreadable or not a PTX image for that
//! architecture is compiled again and replaced; files are written to a temporary name and
//! renamed, so a concurrent start never reads half a file.
//!
//! The folder is `$MINFER_CUDA_CACHE`, else `$XDG_CACHE_HOME/minfer/cuda`, else
//! `$HOME/.cache/minfer/cuda`. `MINFER_CUDA_CACHE=off` (or `0`) disables the cache. A folder
//! that cannot be created or written is not an error: the module is compiled in memory and
//! the outcome says why it was not cached.

use std::path::{Path, PathBuf};

use super::fnv::Fnv;
use super::nvrtc::{self, Image, NvrtcError, Source};

/// Environment variable naming the cache folder (`off` or `0`: no cache).
pub const CACHE_ENV: &str = "MINFER_CUDA_CACHE";

/// How a module was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Read from this file.
    Hit(PathBuf),
    /// Compiled and written to this file.
    Stored(PathBuf),
    /// Compiled; not cached, for this reason.
    Uncached(String),
}

/// The cache key of `src` compiled for `arch` with `options` by NVRTC `version`.
pub fn key(src: &Source, arch: &str, options: &[String], version: (i32, i32)) -> u64 {
    let ver = format!("{}.{}", version.0, version.1);
    let mut h = Fnv::default();
    [src.name.as_bytes(), src.text.as_bytes(), arch.as_bytes(), ver.as_bytes()].into_iter().for_each(|f| h.field(f));
    for (n, t) in src.headers {
        h.field(n.as_bytes());
        h.field(t.as_bytes());
    }
    options.iter().for_each(|o| h.field(o.as_bytes()));
    h.0
}

/// The cache folder, or why there is none.
pub fn folder() -> Result<PathBuf, String> {
    match std::env::var_os(CACHE_ENV) {
        Some(v) if v == "off" || v == "0" => Err(format!("{CACHE_ENV}={}", v.to_string_lossy())),
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
        _ => match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
            (Some(x), _) if !x.is_empty() => Ok(PathBuf::from(x).join("minfer/cuda")),
            (_, Some(h)) if !h.is_empty() => Ok(PathBuf::from(h).join(".cache/minfer/cuda")),
            _ => Err(format!("no {CACHE_ENV}, XDG_CACHE_HOME or HOME")),
        },
    }
}

/// Is `text` a PTX image for `arch` (a `compute_XY` name)?
fn is_ptx_for(text: &str, arch: &str) -> bool {
    let target = arch.replace("compute_", "sm_");
    text.contains(".version") && text.lines().any(|l| l.trim_start().starts_with(".target") && l.contains(&target)) && text.contains(".entry")
}

/// The PTX of `src` for the virtual architecture `arch` (`compute_90`), from `dir` when it
/// holds it, else compiled by NVRTC and stored there. `dir: None` compiles without a cache.
pub fn ptx_in(dir: Result<&Path, String>, src: Source, arch: &str, options: &[String]) -> Result<(String, Outcome), NvrtcError> {
    let version = nvrtc::locate()?;
    let compile = || -> Result<String, NvrtcError> {
        match nvrtc::compile(src, arch, options)?.image {
            Image::Ptx(p) => Ok(p),
            Image::Cubin(_) => Err(NvrtcError::Compile { name: src.name.to_string(), arch: arch.to_string(), log: "expected PTX for a virtual architecture".into() }),
        }
    };
    let dir = match dir {
        Ok(d) => d,
        Err(why) => return Ok((compile()?, Outcome::Uncached(why))),
    };
    let k = key(&src, arch, options, (version.major, version.minor));
    let path = dir.join(format!("{}-{arch}-{k:016x}.ptx", src.name.trim_end_matches(".cu")));
    if let Ok(text) = std::fs::read_to_string(&path)
        && is_ptx_for(&text, arch)
    {
        return Ok((text, Outcome::Hit(path)));
    }
    let ptx = compile()?;
    let stored = std::fs::create_dir_all(dir).and_then(|_| {
        let tmp = dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("module"), std::process::id()));
        std::fs::write(&tmp, &ptx)?;
        std::fs::rename(&tmp, &path)
    });
    let outcome = match stored {
        Ok(()) => Outcome::Stored(path),
        Err(e) => Outcome::Uncached(format!("{}: {e}", dir.display())),
    };
    Ok((ptx, outcome))
}

/// [`ptx_in`] the [`folder`] of this environment.
pub fn ptx(src: Source, arch: &str, options: &[String]) -> Result<(String, Outcome), NvrtcError> {
    let dir = folder();
    ptx_in(dir.as_deref().map_err(Clone::clone), src, arch, options)
}
