//! The one place the GGUF reader touches the OS: mapping a file read-only.

use std::fs::File;

use memmap2::Mmap;

/// Maps `file` read-only.
pub fn map_readonly(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and private to this process; minfer never writes model files.
    // Another process truncating or rewriting the file while it is mapped is outside what any
    // mmap-based reader (llama.cpp included) can defend against, and is documented as such.
    unsafe { Mmap::map(file) }
}
