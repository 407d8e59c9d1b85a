//! Array maps created with BPF_F_MMAPABLE, mapped into our memory: user space writes them
//! without a syscall per element (the unwind rows: millions of them) and can update a word
//! atomically against the programs' own atomic operations (the targets bitmap).
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};

pub(super) struct MappedArray {
    ptr: *mut u8,
    len: usize,
}

impl MappedArray {
    /// Maps `bytes` (rounded up to pages) of the array map `fd`, shared and writable.
    pub(super) fn map(fd: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        let len = bytes.next_multiple_of(4096);
        // SAFETY: maps `len` bytes of the map's fd (the kernel refuses more than the map
        // holds); accessed only within `len` below, unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping a BPF array");
        }
        Ok(MappedArray {
            ptr: ptr.cast(),
            len,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Copies `bytes` in at byte offset `at`.
    pub(super) fn write(&self, at: usize, bytes: &[u8]) -> Result<()> {
        if at.checked_add(bytes.len()).is_none_or(|end| end > self.len) {
            bail!(
                "{} bytes at {at} past the array's {} bytes",
                bytes.len(),
                self.len
            );
        }
        // SAFETY: at..at+len lies within the mapping (checked above); the memory is the
        // kernel's array, which programs may read concurrently (plain data, no invariants).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from `at`.
    pub(super) fn read(&self, at: usize, out: &mut [u8]) -> Result<()> {
        if at.checked_add(out.len()).is_none_or(|end| end > self.len) {
            bail!(
                "{} bytes at {at} past the array's {} bytes",
                out.len(),
                self.len
            );
        }
        // SAFETY: as in `write`; a program writing meanwhile leaves plain data.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Sets `bits` in the u64 at index `word`, atomically (the programs OR into it too).
    pub(super) fn fetch_or_u64(&self, word: usize, bits: u64) -> Result<()> {
        if (word + 1) * 8 > self.len {
            bail!("word {word} past the array's {} bytes", self.len);
        }
        // SAFETY: the word lies within the mapping (checked above) and is 8-byte aligned (the
        // mapping is page-aligned); the kernel's array value is a plain u64 the programs update
        // with atomic instructions only.
        let w = unsafe { &*(self.ptr.add(word * 8) as *const AtomicU64) };
        w.fetch_or(bits, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
