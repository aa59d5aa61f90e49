//! Every CUDA kernel source compiles with NVRTC, with no error and no warning, for the oldest
//! and the newest architecture the backend supports, and every file of the kernel folder is
//! in the backend's lists. Runs on a machine without a GPU: NVRTC only needs its library
//! (`MINFER_NVRTC`, set by scripts/test.sh from scripts/nvrtc_env.sh). A missing NVRTC fails
//! the test; it does not skip it.
#![cfg(feature = "cuda")]

use std::collections::BTreeSet;
use std::path::PathBuf;

use minfer::backends::cuda::kernels::{self, HEADERS, SOURCES, TEST_ARCHES};
use minfer::backends::cuda::nvrtc::{self, Image, NvrtcError, Source};

fn kernel_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/backends/cuda/kernels")
}

#[test]
fn every_kernel_file_is_listed() {
    let listed: BTreeSet<&str> = SOURCES.iter().chain(HEADERS).map(|(n, _)| *n).collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(kernel_dir())
        .expect("kernel folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh"))
        .collect();
    let missing: Vec<&String> = on_disk.iter().filter(|n| !listed.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "kernel files not in SOURCES/HEADERS: {missing:?}");
    let stale: Vec<&&str> = listed.iter().filter(|n| !on_disk.contains(**n)).collect();
    assert!(stale.is_empty(), "listed but not on disk: {stale:?}");
}

#[test]
fn every_source_compiles_cleanly_for_every_tested_arch() {
    let version = nvrtc::locate().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("NVRTC {}.{}", version.major, version.minor);
    let mut failures = Vec::new();
    for src in kernels::all() {
        for arch in TEST_ARCHES {
            match nvrtc::compile(src, arch, &[]) {
                Ok(c) if !c.log.is_empty() => failures.push(format!("{} for {arch}: warnings:\n{}", src.name, c.log)),
                Ok(c) => match c.image {
                    Image::Ptx(ptx) => assert!(ptx.contains(".entry"), "{} for {arch}: PTX without a kernel entry", src.name),
                    Image::Cubin(_) => panic!("{arch} is virtual: expected PTX"),
                },
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{} compile failures:\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn a_real_arch_gives_a_cubin() {
    let src = kernels::source("elementwise.cu").expect("listed");
    let c = nvrtc::compile(src, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    match c.image {
        Image::Cubin(b) => assert!(b.starts_with(b"\x7fELF"), "a cubin is an ELF image"),
        Image::Ptx(_) => panic!("sm_90 should give a cubin"),
    }
}

#[test]
fn a_broken_source_is_a_compile_error_with_the_log() {
    let src = Source { name: "broken.cu", text: "extern \"C\" __global__ void k() { undeclared = 1; }", headers: &[] };
    match nvrtc::compile(src, "compute_90", &[]) {
        Err(NvrtcError::Compile { name, log, .. }) => {
            assert_eq!(name, "broken.cu");
            assert!(log.contains("undeclared"), "the log names the error: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn a_source_with_a_nul_byte_is_refused() {
    let src = Source { name: "nul.cu", text: "int x;\0", headers: &[] };
    assert!(matches!(nvrtc::compile(src, "compute_90", &[]), Err(NvrtcError::NulInSource { .. })));
}

/// The module cache: the first start compiles and stores, the second reads the same PTX; a
/// damaged file is compiled again; another option set or architecture is another entry.
#[test]
fn the_module_cache_compiles_once_and_recovers_from_a_damaged_file() {
    use minfer::backends::cuda::module_cache::{Outcome, ptx_in};
    let dir = std::env::temp_dir().join(format!("minfer-module-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = kernels::source("norm.cu").expect("listed");
    let (first, o1) = ptx_in(Ok(&dir), src, "compute_75", &[]).unwrap_or_else(|e| panic!("{e}"));
    let Outcome::Stored(path) = o1 else { panic!("first compile should store, got {o1:?}") };
    let (second, o2) = ptx_in(Ok(&dir), src, "compute_75", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o2, Outcome::Hit(path.clone()));
    assert_eq!(first, second);
    std::fs::write(&path, "garbage").expect("damage the entry");
    let (third, o3) = ptx_in(Ok(&dir), src, "compute_75", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o3, Outcome::Stored(path.clone()), "a damaged entry is compiled again");
    assert_eq!(third, first);
    let (_, o4) = ptx_in(Ok(&dir), src, "compute_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(&o4, Outcome::Stored(p) if *p != path), "another arch is another entry: {o4:?}");
    let (_, o5) = ptx_in(Ok(&dir), src, "compute_75", &["--use_fast_math".to_string()]).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(&o5, Outcome::Stored(p) if *p != path), "other options are another entry: {o5:?}");
    let (_, o6) = ptx_in(Err("off".into()), src, "compute_75", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o6, Outcome::Uncached("off".into()));
    let _ = std::fs::remove_dir_all(&dir);
}
