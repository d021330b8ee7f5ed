//! Registered memory: page-aligned anonymous memory (or huge pages), pre-faulted, with its
//! memory region. The region is deregistered before the memory is unmapped, on every path.

use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::memlock;
use crate::error::{Error, Result};

/// How a buffer's memory is backed and registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Ask for PCIe relaxed ordering (an optional access flag: a device or kernel that
    /// cannot honour it registers without it, as perftest relies on).
    pub relaxed_ordering: bool,
    /// Back the buffer with huge pages (MAP_HUGETLB, the system's default huge page size).
    pub huge_pages: bool,
    /// Register for on-demand paging: the device faults pages in instead of pinning them.
    pub on_demand: bool,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions { relaxed_ordering: true, huge_pages: false, on_demand: false }
    }
}

/// The system's default huge page size, from /proc/meminfo (2 MiB when it does not say).
pub fn huge_page_bytes() -> usize {
    meminfo_kib("Hugepagesize:").map_or(2 << 20, |k| k as usize * 1024)
}

/// A /proc/meminfo value in kB (or a count, for the HugePages_ lines).
fn meminfo_kib(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
}

/// Why a huge-page mapping failed, with the pool's state and the fix.
fn no_huge_pages(len: usize, page: usize, os: &std::io::Error) -> Error {
    let free = meminfo_kib("HugePages_Free:").unwrap_or(0);
    let needed = len / page;
    Error::Environment(format!(
        "--hugepages: cannot map {} of {} huge pages ({os}); {free} are free (HugePages_Free in /proc/meminfo), \
         {needed} needed: reserve them as root (`echo {} > /proc/sys/vm/nr_hugepages`, or hugepages-{}kB in a \
         pod's resources) or drop --hugepages",
        memlock::human_bytes(len as u64),
        memlock::human_bytes(page as u64),
        needed + free as usize,
        page / 1024
    ))
}

pub struct RegisteredBuf {
    mr: Option<Arc<MemoryRegion>>,
    ptr: *mut u8,
    len: usize,
    opts: MemoryOptions,
    page: usize,
}

// SAFETY: the buffer is plain memory owned by this value (freed after its MR is
// deregistered, in Drop), and the MR handle is thread-safe in libibverbs.
unsafe impl Send for RegisteredBuf {}
// SAFETY: threads touch disjoint lanes of the buffer, and bytes that the NIC or a peer
// writes are read with volatile loads, never through references that assume no change.
unsafe impl Sync for RegisteredBuf {}

impl RegisteredBuf {
    /// What asking for `len` bytes maps and registers: whole pages (of `page` bytes), at
    /// least one.
    pub fn mapped_len(len: usize, page: usize) -> usize {
        len.max(64).next_multiple_of(page)
    }

    /// The page a buffer with these options is made of.
    pub fn page_bytes(opts: MemoryOptions) -> usize {
        if opts.huge_pages { huge_page_bytes() } else { 4096 }
    }

    /// Maps and registers `len` bytes for local write and remote read/write/atomic access.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, opts: MemoryOptions) -> Result<RegisteredBuf> {
        let page = Self::page_bytes(opts);
        let len = Self::mapped_len(len, page);
        let huge = if opts.huge_pages { libc::MAP_HUGETLB } else { 0 };
        // SAFETY: anonymous private mapping; checked for MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | huge,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let os = std::io::Error::last_os_error();
            if opts.huge_pages {
                return Err(no_huge_pages(len, page, &os));
            }
            return Err(Error::Environment(format!(
                "cannot allocate {} for the buffer: {os}",
                memlock::human_bytes(len as u64)
            )));
        }
        let ptr = ptr.cast::<u8>();
        let mut access =
            AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead | AccessFlags::RemoteAtomic;
        if opts.relaxed_ordering {
            access |= AccessFlags::RelaxedOrdering;
        }
        if opts.on_demand {
            access |= AccessFlags::OnDemand;
        }
        // SAFETY: `ptr` is valid for `len` bytes until `drop`, which deregisters first.
        match unsafe { pd.reg_mr(ptr as usize, len, access) } {
            Ok(mr) => Ok(RegisteredBuf { mr: Some(mr), ptr, len, opts, page }),
            Err(e) => {
                let os = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| format!("{e:?}"));
                // SAFETY: unmapping what we mapped above; nothing else refers to it.
                unsafe { libc::munmap(ptr.cast(), len) };
                if opts.on_demand {
                    return Err(Error::Usage(format!(
                        "--odp: the device refused an on-demand-paging registration ({os}): the device or its kernel \
                         driver has no ODP support; drop --odp to register pinned memory"
                    )));
                }
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

    /// How this buffer was backed and registered, and its page size.
    pub fn backing(&self) -> (MemoryOptions, usize) {
        (self.opts, self.page)
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
