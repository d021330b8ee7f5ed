//! Registered memory: page-aligned anonymous memory, pre-faulted, with its memory region.
//! The region is deregistered before the memory is unmapped, on every path.

use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::memlock;
use crate::error::{Error, Result};

pub struct RegisteredBuf {
    mr: Option<Arc<MemoryRegion>>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value (freed after its MR is
// deregistered, in Drop), and the MR handle is thread-safe in libibverbs.
unsafe impl Send for RegisteredBuf {}
// SAFETY: threads touch disjoint lanes of the buffer, and bytes that the NIC or a peer
// writes are read with volatile loads, never through references that assume no change.
unsafe impl Sync for RegisteredBuf {}

impl RegisteredBuf {
    /// What asking for `len` bytes maps and registers: whole pages, at least one.
    pub fn mapped_len(len: usize) -> usize {
        len.max(64).next_multiple_of(4096)
    }

    /// Maps and registers `len` bytes for local write and remote read/write/atomic access.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize) -> Result<RegisteredBuf> {
        let len = Self::mapped_len(len);
        // SAFETY: anonymous private mapping; checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::Environment(format!(
                "cannot allocate {} for the buffer: {}",
                memlock::human_bytes(len as u64),
                std::io::Error::last_os_error()
            )));
        }
        let ptr = ptr.cast::<u8>();
        let access =
            AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead | AccessFlags::RemoteAtomic;
        // SAFETY: `ptr` is valid for `len` bytes until `drop`, which deregisters first.
        match unsafe { pd.reg_mr(ptr as usize, len, access) } {
            Ok(mr) => Ok(RegisteredBuf { mr: Some(mr), ptr, len }),
            Err(e) => {
                let os = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| format!("{e:?}"));
                // SAFETY: unmapping what we mapped above; nothing else refers to it.
                unsafe { libc::munmap(ptr.cast(), len) };
                Err(memlock::registration_error(len as u64, &os, memlock::memlock_limit(), memlock::has_ipc_lock()))
            }
        }
    }

    fn mr(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("registered until drop")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub fn lkey(&self) -> u32 {
        self.mr().lkey()
    }

    pub fn rkey(&self) -> u32 {
        self.mr().rkey()
    }

    /// The memory as bytes. The device writes into it behind the compiler's back, so
    /// loops that wait for a remote write use `load_volatile`.
    ///
    /// # Safety
    /// No RDMA operation may write the range while the slice is alive.
    pub unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.len);
        // SAFETY: the range is inside the live allocation (asserted); the caller promises
        // that nothing writes it while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }

    /// # Safety
    /// No RDMA operation may read or write the range while the slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len);
        // SAFETY: the range is inside the live allocation (asserted); the caller promises
        // that nothing else reads or writes it while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }

    /// Reads one byte that a remote write may change at any time.
    #[inline(always)]
    pub fn load_volatile(&self, offset: usize) -> u8 {
        debug_assert!(offset < self.len);
        // SAFETY: in bounds; volatile because the NIC writes this memory.
        unsafe { std::ptr::read_volatile(self.ptr.add(offset)) }
    }

    #[inline(always)]
    pub fn store(&self, offset: usize, value: u8) {
        debug_assert!(offset < self.len);
        // SAFETY: in bounds; volatile so the store is not elided or moved past the post.
        unsafe { std::ptr::write_volatile(self.ptr.add(offset), value) }
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        drop(self.mr.take()); // deregister before the memory goes away
        // SAFETY: the mapping is ours and no longer registered.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
