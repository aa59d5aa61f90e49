//! Host memory for the CPU backend: zero-filled, 16-byte aligned, and **fallible** — a request
//! the system cannot satisfy is `None`, never an abort (`Vec` aborts on allocation failure).
//!
//! The allocation comes from `alloc_zeroed` with the allocator's natural alignment, which the
//! system allocator serves with `calloc`: large buffers are mapped lazily, so an arena reserved
//! for the worst-case graph, or a KV region for the whole context, costs resident memory only
//! where something writes. (A larger alignment would make `alloc_zeroed` an aligned allocation
//! followed by a `memset` that touches every page: the 0.5B model's 4096-token KV alone is
//! 96 MiB.) Regions inside a buffer sit at multiples of [`ALIGN`] from its start.
//! This file is the CPU backend's one FFI-like module: the `unsafe` of owning raw memory lives
//! here and nowhere else.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// Byte alignment of the regions inside a buffer (offsets the planner hands out).
pub const ALIGN: usize = 64;

/// Byte alignment of a buffer's start: what `calloc` guarantees on 64-bit targets.
pub const BASE_ALIGN: usize = 16;

/// An owned, zero-initialised, 16-byte aligned byte buffer.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: a HostBuffer owns its allocation exclusively (like `Vec<u8>`); moving it to another
// thread moves that ownership, and `&HostBuffer` only hands out shared byte slices.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// `len` zero bytes, or `None` when the allocator refuses.
    pub fn zeroed(len: usize) -> Option<HostBuffer> {
        let layout = Layout::from_size_align(len.max(1), BASE_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (at least 1 byte) and a valid power-of-two
        // alignment; a null result is handled below.
        let raw = unsafe { alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| HostBuffer { ptr, len, layout })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size() >= len` initialised (zeroed, then only written
        // through `bytes_mut`) bytes owned by `self`, alive for the borrow of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` guarantees the slice is the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed exactly once, here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Returns the heap's free pages to the system (glibc's `malloc_trim`). Loading a model leaves
/// megabytes of parser and tokenizer temporaries freed but resident; the compute arena is one
/// fresh mapping and cannot reuse them, so the engine hands them back once it has reserved.
/// A no-op on other C libraries.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only walks glibc's own free lists; it is safe
    // to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_writable() {
        let mut b = HostBuffer::zeroed(1000).unwrap();
        assert!(b.bytes().iter().all(|&x| x == 0));
        assert_eq!(b.bytes().as_ptr() as usize % BASE_ALIGN, 0);
        b.bytes_mut()[999] = 7;
        assert_eq!(b.bytes()[999], 7);
        assert!(HostBuffer::zeroed(0).is_some_and(|b| b.is_empty()));
        assert!(HostBuffer::zeroed(usize::MAX / 2).is_none(), "an impossible request is refused, not an abort");
    }
}
