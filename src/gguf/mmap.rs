//! The one place the GGUF reader touches the OS: mapping a file read-only.

use std::fs::File;

use memmap2::Mmap;

/// Maps `file` read-only.
pub fn map_readonly(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only (memmap2 maps it shared, PROT_READ); minfer never writes
    // model files.
    // Another process truncating or rewriting the file while it is mapped is outside what any
    // mmap-based reader (llama.cpp included) can defend against, and is documented as such.
    unsafe { Mmap::map(file) }
}

/// Drops this process's resident pages of `map[offset..offset + len]` (`madvise(DONTNEED)`;
/// memmap2 widens the range to whole pages, so a page shared with a neighbouring tensor goes
/// too). The bytes do not change: a later read faults them back in from the file (the page
/// cache, usually). Advisory: an error (a range outside the map, an OS that refuses) leaves the
/// pages resident and is not reported. For a backend that keeps its own copy of a tensor (a
/// repacked matrix), so the map's pages stop counting twice in the process's memory, as
/// llama.cpp unmaps the fragments of tensors it has copied.
pub fn release(map: &Mmap, offset: usize, len: usize) {
    #[cfg(unix)]
    if offset.checked_add(len).is_some_and(|end| end <= map.len()) {
        // SAFETY: a read-only file mapping (`map_readonly`: shared, PROT_READ) holds no
        // changes of this process to lose: after DONTNEED its pages fault back in from the
        // page cache with the file's bytes, the same bytes any `&[u8]` into the map (held
        // elsewhere) has read so far.
        let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
    }
    #[cfg(not(unix))]
    let _ = (map, offset, len);
}
