//! `floor-c`: the hardware floor the shmlink rows are compared with. The minimal C
//! ring (csrc/floor.c, compiled into the bench by build.rs): one ring of fixed-size
//! slots per direction in a shared memfd, a word per slot that the sender stores after
//! copying the message in and the receiver spins on, and the receiver's count of
//! messages taken, which the sender reloads only when the ring looks full. No wake-up, no
//! validation, no record headers: two flags and a copy each way. Busy polls (with
//! `sched_yield` when both ends share a CPU).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::method::{arg, Ctx, Endpoint, Method, Prepared};
use crate::sys::{ctx, err, inherited_fd, syscall};

/// Bytes before the first slot of a ring (the receiver's count, on its own lines).
const SLOTS_AT: usize = 128;
/// Ring bytes per direction for small messages (like the `shm-*` methods' 1 MiB); a
/// ring always holds at least two slots.
const RING: usize = 1 << 20;

/// `struct floor_end` in floor.c.
#[repr(C)]
struct FloorEnd {
    tx: *mut u8,
    rx: *mut u8,
    nslots: u64,
    stride: u64,
    sent: u64,
    tx_taken: u64,
    received: u64,
    yield_: libc::c_int,
}

extern "C" {
    fn floor_send(e: *mut FloorEnd, msg: *const u8, len: u64);
    fn floor_recv(e: *mut FloorEnd, buf: *mut u8, cap: u64) -> i64;
}

/// Slot stride and count for `size`-byte messages: the word and the bytes, rounded up
/// to whole cache lines; as many slots as fit in [`RING`], at least 2.
fn geometry(size: usize) -> (usize, usize) {
    let stride = (8 + size.max(8)).next_multiple_of(64);
    let nslots = (RING / stride).max(2);
    (stride, nslots)
}

/// Bytes of one direction's ring.
fn ring_len(size: usize) -> usize {
    let (stride, nslots) = geometry(size);
    (SLOTS_AT + stride * nslots).next_multiple_of(4096)
}

/// The shared memory of both rings (of `floor-line`'s two lines too); unmapped on drop.
pub(super) struct Map {
    pub(super) ptr: *mut u8,
    len: usize,
}

impl Map {
    pub(super) fn new(fd: &OwnedFd, len: usize) -> io::Result<Map> {
        // SAFETY: a new shared mapping of an fd of at least `len` bytes; no existing
        // memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(ctx("mmap")(io::Error::last_os_error()));
        }
        Ok(Map {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: `ptr` is a mapping of `len` bytes made in `new`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A new memfd of `len` zero bytes, for the peer to inherit.
pub(super) fn memfd(len: usize) -> io::Result<OwnedFd> {
    let name = c"shmlink-bench-floor";
    // SAFETY: `name` is a valid C string.
    let fd =
        syscall!(memfd_create(name.as_ptr(), libc::MFD_CLOEXEC)).map_err(ctx("memfd_create"))?;
    // SAFETY: memfd_create returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate takes an fd and a length.
    syscall!(ftruncate(fd.as_raw_fd(), len as libc::off_t)).map_err(ctx("ftruncate memfd"))?;
    Ok(fd)
}

/// One end: sends on ring `me`, receives on the other.
struct FloorC {
    end: FloorEnd,
    _map: Map,
}

// SAFETY: the raw pointers in `end` point into `_map`, which moves with it.
unsafe impl Send for FloorC {}

impl FloorC {
    fn new(map: Map, size: usize, me: usize, same_core: bool) -> FloorC {
        let (stride, nslots) = geometry(size);
        let len = ring_len(size);
        // SAFETY: the mapping holds two rings of `len` bytes each.
        let (r0, r1) = unsafe { (map.ptr, map.ptr.add(len)) };
        let (tx, rx) = if me == 0 { (r0, r1) } else { (r1, r0) };
        FloorC {
            end: FloorEnd {
                tx,
                rx,
                nslots: nslots as u64,
                stride: stride as u64,
                sent: 0,
                tx_taken: 0,
                received: 0,
                yield_: same_core.into(),
            },
            _map: map,
        }
    }
}

impl Endpoint for FloorC {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        if msg.len() + 8 > self.end.stride as usize {
            return Err(err(format!(
                "a {}-byte message does not fit a {}-byte slot",
                msg.len(),
                self.end.stride
            )));
        }
        // SAFETY: `end` describes two live rings of `nslots` slots of `stride` bytes,
        // and the message fits a slot (checked above).
        unsafe { floor_send(&mut self.end, msg.as_ptr(), msg.len() as u64) };
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        // SAFETY: `buf` has room for `buf.len()` bytes; `end` as in `send`.
        let n = unsafe { floor_recv(&mut self.end, buf.as_mut_ptr(), buf.len() as u64) };
        if n != buf.len() as i64 {
            return Err(err(format!(
                "received a message of {} bytes, expected {}",
                if n < 0 {
                    "more".to_string()
                } else {
                    n.to_string()
                },
                buf.len()
            )));
        }
        Ok(())
    }
}

pub struct Floor;

impl Method for Floor {
    fn name(&self) -> &'static str {
        "floor-c"
    }

    fn about(&self) -> &'static str {
        "the floor: a minimal C ring (a flag and a copy each way, busy polling; csrc/floor.c)"
    }

    fn busy_polls(&self) -> bool {
        true
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let len = 2 * ring_len(c.size);
        let fd = memfd(len)?;
        let end = FloorC::new(Map::new(&fd, len)?, c.size, 0, c.same_core);
        Ok(Prepared::ready(
            vec![fd.as_raw_fd().to_string()],
            vec![fd],
            end,
        ))
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let fd = inherited_fd(arg(args, 0, "memfd")?)?;
        let map = Map::new(&fd, 2 * ring_len(c.size))?;
        Ok(Box::new(FloorC::new(map, c.size, 1, c.same_core)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_the_word_and_the_message_in_whole_lines() {
        assert_eq!(geometry(64), (128, RING / 128));
        assert_eq!(geometry(56), (64, RING / 64));
        assert_eq!(geometry(1 << 20), ((1 << 20) + 64, 2));
        assert!(ring_len(16 << 20) >= SLOTS_AT + 2 * ((16 << 20) + 8));
    }
}
