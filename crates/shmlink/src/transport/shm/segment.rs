//! The shared segment of one `shm:` connection: a header page (identification and the two
//! ring control blocks) and two ring data areas, in one sealed memfd.
//!
//! ```text
//! offset 0     SegHeader   magic, version, header length, ring sizes
//! offset 64    u32         CPU the client last waited on (a hint only)
//! offset 128   RingCtl     ring 0: client → server
//! offset 768   RingCtl     ring 1: server → client
//! offset 1408  u32         CPU the server last waited on (own cache line)
//! page         ring 0 data (mapped twice)
//! page + c2s   ring 1 data (mapped twice)
//! ```

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};
use crate::ring::{RingCtl, RingRef};
use crate::sync::{AtomicU32, Ordering};
use crate::sys::memfd::{self, Mapping};
use crate::sys::page_size;

/// "SHMLSEG1", little endian.
const SEG_MAGIC: u64 = u64::from_le_bytes(*b"SHMLSEG1");
const SEG_VERSION: u32 = 1;
const CTL_OFFSET: usize = 128;
/// Each side's CPU slot, on a cache line of its own.
const CPU_OFFSET: [usize; 2] = [64, CTL_OFFSET + 2 * std::mem::size_of::<RingCtl>()];
/// A side that has not waited yet.
const NO_CPU: u32 = u32::MAX;

/// Ring 0 carries client → server, ring 1 server → client.
pub const C2S: usize = 0;
/// See [`C2S`].
pub const S2C: usize = 1;

/// Identification at the start of the segment.
#[repr(C)]
struct SegHeader {
    magic: u64,
    version: u32,
    header_len: u32,
    ring_size: [u64; 2],
}

fn header_len() -> usize {
    let need = CPU_OFFSET[1] + 128;
    need.next_multiple_of(page_size())
}

/// A mapped segment and the two rings in it.
pub struct Segment {
    map: Mapping,
    sizes: [usize; 2],
}

impl Segment {
    /// Creates, sizes, seals and maps a new segment (server side). The memfd is returned
    /// to be passed to the client.
    pub fn create(sizes: [usize; 2]) -> Result<(Segment, OwnedFd)> {
        let hl = header_len();
        let fd = memfd::create_sealed("shmlink", Mapping::file_size(hl, &sizes))
            .map_err(|e| Error::io("shared segment: memfd", e))?;
        let map = Mapping::map(fd.as_fd(), hl, &sizes)
            .map_err(|e| Error::io("shared segment: mmap", e))?;
        let header = SegHeader {
            magic: SEG_MAGIC,
            version: SEG_VERSION,
            header_len: hl as u32,
            ring_size: sizes.map(|s| s as u64),
        };
        // SAFETY: the header area is at least one page, writable, page-aligned, and not
        // yet shared with anyone.
        unsafe { map.header().cast::<SegHeader>().write(header) };
        let seg = Segment { map, sizes };
        seg.ring(C2S).start_armed();
        seg.ring(S2C).start_armed();
        for side in [C2S, S2C] {
            seg.cpu(side).store(NO_CPU, Ordering::Relaxed);
        }
        Ok((seg, fd))
    }

    /// Maps a segment received from the server, after checking its seals and size, and
    /// validates its header against the sizes the handshake announced (client side).
    pub fn attach(fd: &OwnedFd, sizes: [usize; 2]) -> Result<Segment> {
        let hl = header_len();
        let bad = |why: String| Error::violation(format!("shared segment: {why}"));
        memfd::check_sealed(fd.as_fd(), Mapping::file_size(hl, &sizes))
            .map_err(|e| bad(e.to_string()))?;
        let map = Mapping::map(fd.as_fd(), hl, &sizes)
            .map_err(|e| Error::io("shared segment: mmap", e))?;
        // Copy the header into a local once; the server may change it any time.
        // SAFETY: the header area is mapped, readable and page-aligned.
        let h = unsafe { map.header().cast::<SegHeader>().read_volatile() };
        if h.magic != SEG_MAGIC {
            return Err(bad(format!("bad magic {:#018x}", h.magic)));
        }
        if h.version != SEG_VERSION {
            return Err(Error::new(
                ErrorKind::VersionMismatch,
                format!(
                    "shared segment version {} (this side knows {SEG_VERSION})",
                    h.version
                ),
            ));
        }
        if h.header_len as usize != hl || h.ring_size != sizes.map(|s| s as u64) {
            return Err(bad(format!(
                "header says header {} and rings {:?}, handshake said {hl} and {sizes:?}",
                h.header_len, h.ring_size
            )));
        }
        Ok(Segment { map, sizes })
    }

    /// Ring `i` ([`C2S`] or [`S2C`]).
    pub fn ring(&self, i: usize) -> RingRef {
        let (data, cap) = self.ring_data(i);
        debug_assert_eq!(cap, self.sizes[i]);
        // SAFETY: the control block lies inside the header page (header_len covers
        // CTL_OFFSET + 2 control blocks), 128-aligned (CTL_OFFSET and the block size are
        // multiples of 128), zero-initialised by the memfd; the data area is mapped twice
        // by `Mapping`. Both live as long as `self.map`, and the rings built from them are
        // owned next to this Segment by the connection, which drops them together.
        unsafe { RingRef::new(NonNull::new_unchecked(self.ring_ctl(i).cast()), data, cap) }
    }

    /// The CPU slot of side `side` (the index of the ring it sends on).
    fn cpu(&self, side: usize) -> &AtomicU32 {
        // SAFETY: both slots lie inside the header page (see `header_len`), 4-aligned; a
        // slot is only ever accessed atomically, and any value is valid (it is a hint).
        unsafe { &*self.base().add(CPU_OFFSET[side]).cast::<AtomicU32>() }
    }

    /// Records that side `me` is about to wait on `cpu`; returns whether the other side
    /// last waited on the same CPU (then busy-polling cannot help: the peer cannot run
    /// until we stop). The peer may write anything here; it only steers spinning.
    pub fn note_cpu(&self, me: usize, cpu: u32) -> bool {
        // Store only on a change, so the slot's line stays shared rather than bouncing.
        if self.cpu(me).load(Ordering::Relaxed) != cpu {
            self.cpu(me).store(cpu, Ordering::Relaxed);
        }
        self.cpu(1 - me).load(Ordering::Relaxed) == cpu
    }

    /// Start of the mapping (the segment header).
    pub fn base(&self) -> *mut u8 {
        self.map.header().as_ptr()
    }

    /// Start of ring `i`'s control block.
    pub fn ring_ctl(&self, i: usize) -> *mut u8 {
        let off = CTL_OFFSET + i * std::mem::size_of::<RingCtl>();
        // SAFETY: the offset lies inside the header page (see `header_len`).
        unsafe { self.base().add(off) }
    }

    /// Ring `i`'s data area and size (mapped twice: `2 * size` bytes are valid).
    pub fn ring_data(&self, i: usize) -> (NonNull<u8>, usize) {
        self.map.ring(i)
    }
}
