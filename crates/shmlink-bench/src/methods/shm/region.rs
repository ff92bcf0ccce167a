//! The shared region of the `shm-*` methods: a memfd mapped by both processes, holding
//! two byte rings (one per direction) and their wait slots.
//!
//! ```text
//! 0     ring 0 (driver → peer): tail @+0, head @+128, data slot @+256, space slot @+384
//! 512   ring 1 (peer → driver): the same
//! 1024  pid of the driver (u32), 1028 pid of the peer (u32)
//! 4096  ring 0 data (CAP bytes), then ring 1 data
//! ```
//!
//! A wait slot is `waiting` (u32: the waiter is about to sleep or sleeps) and `word`
//! (u32: bumped by every wake-up, the futex word).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::sys::{ctx, syscall};

/// Bytes per ring (a power of two).
pub const CAP: usize = 1 << 20;
/// Bytes before the ring data.
const HEADER: usize = 4096;
/// Total size of the region.
pub const LEN: usize = HEADER + 2 * CAP;

/// Offset of ring `r`'s header.
fn ring(r: usize) -> usize {
    r * 512
}
pub fn tail(r: usize) -> usize {
    ring(r)
}
pub fn head(r: usize) -> usize {
    ring(r) + 128
}
/// The slot the reader of ring `r` waits in for data.
pub fn data_slot(r: usize) -> usize {
    ring(r) + 256
}
/// The slot the writer of ring `r` waits in for space.
pub fn space_slot(r: usize) -> usize {
    ring(r) + 384
}
/// Offset of the pid of end `e` (0 driver, 1 peer).
pub fn pid(e: usize) -> usize {
    1024 + 4 * e
}

/// The mapping; unmapped on drop.
pub struct Region {
    ptr: *mut u8,
}

impl Region {
    /// Creates the memfd (close-on-exec; the peer inherits it explicitly) and maps it.
    pub fn create() -> io::Result<(Region, OwnedFd)> {
        let name = c"shmlink-bench";
        // SAFETY: `name` is a valid C string.
        let fd = syscall!(memfd_create(name.as_ptr(), libc::MFD_CLOEXEC))
            .map_err(ctx("memfd_create"))?;
        // SAFETY: memfd_create returned a new fd that nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: ftruncate takes an fd and a length.
        syscall!(ftruncate(fd.as_raw_fd(), LEN as libc::off_t)).map_err(ctx("ftruncate memfd"))?;
        Ok((Region::map(&fd)?, fd))
    }

    /// Maps the region of `fd` (read-write, shared).
    pub fn map(fd: &OwnedFd) -> io::Result<Region> {
        // SAFETY: a new shared mapping of an fd of at least LEN bytes; no existing memory
        // is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(ctx("mmap")(io::Error::last_os_error()));
        }
        Ok(Region { ptr: ptr.cast() })
    }

    /// The u64 atomic at `off` (a multiple of 8 inside the header).
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= HEADER);
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned); AtomicU64 has
        // the layout of u64, and the mapping lives as long as `self`.
        unsafe { &*self.ptr.add(off).cast::<AtomicU64>() }
    }

    /// The u32 atomic at `off` (a multiple of 4 inside the header).
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= HEADER);
        // SAFETY: as in `u64_at`, for 4 bytes.
        unsafe { &*self.ptr.add(off).cast::<AtomicU32>() }
    }

    /// Copies `src` into ring `r` at byte position `pos` (wrapping); the caller owns that
    /// part of the ring (it is free space the reader has released).
    pub fn write(&self, r: usize, pos: u64, src: &[u8]) {
        assert!(src.len() <= CAP);
        let idx = (pos as usize) & (CAP - 1);
        let first = src.len().min(CAP - idx);
        let base = HEADER + r * CAP;
        // SAFETY: both pieces lie inside ring r's data (idx + first <= CAP, the rest
        // starts at 0 and is shorter than CAP); the ring protocol gives the writer these
        // bytes exclusively until it publishes them.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(base + idx), first);
            std::ptr::copy_nonoverlapping(
                src.as_ptr().add(first),
                self.ptr.add(base),
                src.len() - first,
            );
        }
    }

    /// Copies from ring `r` at byte position `pos` (wrapping) into `dst`; the caller owns
    /// that part of the ring (published by the writer, not yet released).
    pub fn read(&self, r: usize, pos: u64, dst: &mut [u8]) {
        assert!(dst.len() <= CAP);
        let idx = (pos as usize) & (CAP - 1);
        let first = dst.len().min(CAP - idx);
        let base = HEADER + r * CAP;
        // SAFETY: as in `write`; the writer does not touch published, unreleased bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(base + idx), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(
                self.ptr.add(base),
                dst.as_mut_ptr().add(first),
                dst.len() - first,
            );
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` is a mapping of LEN bytes made in `map`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), LEN) };
    }
}
