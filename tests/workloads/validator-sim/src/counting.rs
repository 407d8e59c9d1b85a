//! The global allocator, counting what the program asks of it: the ground truth for
//! phaseprof's allocation totals. It forwards to the system allocator (glibc's malloc family),
//! which is what phaseprof probes.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct Counting;

/// Bytes requested: every allocation's size, a realloc's new size.
pub static BYTES: AtomicU64 = AtomicU64::new(0);
/// Allocations, reallocs included (glibc's realloc is one allocator call).
pub static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Frees; a realloc that moves its block also frees the old one inside the allocator.
pub static FREES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to System with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size() as u64, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        FREES.fetch_add(1, Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES.fetch_add(new_size as u64, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}
