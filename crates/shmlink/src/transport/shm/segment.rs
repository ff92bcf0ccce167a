//! The shared memory of one `shm:` connection: one sealed memfd per side, holding what
//! only that side writes (docs/design.md §9.1). Each side creates its segment, maps it
//! read-write, seals it with `F_SEAL_FUTURE_WRITE` and passes it on; the peer maps it
//! read-only, and the kernel refuses it any writable mapping from then on.
//!
//! ```text
//! offset 0     SegHeader     magic, version, header length, side, outbound ring size
//! offset 64    u32           CPU this side last waited on (a hint only)
//! offset 72    2 × u32       where this side sleeps for data / for room: 0 the control
//!                            socket, 1 its doorbell pipe (design §4.4)
//! offset 128   ProducerCtl   outbound ring: tail, closed, sleep announcements (3 lines)
//! offset 512   ConsumerCtl   inbound ring: head, sleep announcements (2 lines)
//! page         outbound ring data (mapped twice)
//! ```
//!
//! The client's segment carries the client → server ring, the listener's the server →
//! client ring. A side sends on a ring built from its own `ProducerCtl` and data area and
//! the peer's `ConsumerCtl`, and receives on one built from the peer's `ProducerCtl` and
//! data area and its own `ConsumerCtl`.

use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, ErrorKind, Result};
use crate::ring::{ConsumerCtl, ProducerCtl, RingRef};
use crate::sync::{fence, AtomicU32, Ordering};
use crate::sys::memfd::{self, Mapping};
use crate::sys::page_size;

/// "SHMLSEG1", little endian (the layout's version is in `version`).
const SEG_MAGIC: u64 = u64::from_le_bytes(*b"SHMLSEG1");
/// Version 1 was one segment holding both rings, written by both sides; version 2 is one
/// segment per side, written by its creator only.
pub const SEG_VERSION: u32 = 2;
const CPU_OFFSET: usize = 64;
/// Where this side's waits for data (`+ 0`) and for room (`+ 4`) sleep ([`Place`]).
const PLACE_OFFSET: usize = 72;
/// Offset of the outbound ring's [`ProducerCtl`].
pub const PRODUCER_OFFSET: usize = 128;
/// Offset of the inbound ring's [`ConsumerCtl`].
pub const CONSUMER_OFFSET: usize = PRODUCER_OFFSET + std::mem::size_of::<ProducerCtl>();
/// A side that has not waited yet.
const NO_CPU: u32 = u32::MAX;

/// Where a side sleeps while it waits, so the peer knows where to ring its doorbell:
/// the one it stored last before announcing the wait (design §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Place {
    /// The control socket (the connection's fd): non-blocking calls and event loops.
    Socket = 0,
    /// The doorbell pipe: a blocking call's sleep.
    Pipe = 1,
}

/// Which of a side's two waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// For records in its receive ring.
    Data = 0,
    /// For room in its send ring.
    Room = 1,
}

/// Which end of a connection wrote a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Side {
    /// The connecting side: its segment carries the client → server ring.
    Client = 0,
    /// The listener's side: its segment carries the server → client ring.
    Server = 1,
}

/// Identification at the start of a segment.
#[repr(C)]
#[derive(Clone, Copy)]
struct SegHeader {
    magic: u64,
    version: u32,
    header_len: u32,
    side: u32,
    _reserved: u32,
    ring_size: u64,
}

/// Bytes before the ring's data area.
pub fn header_len() -> usize {
    let need = CONSUMER_OFFSET + std::mem::size_of::<ConsumerCtl>();
    need.next_multiple_of(page_size())
}

/// The file size of a segment whose outbound ring has `ring` bytes.
pub fn file_size(ring: usize) -> usize {
    Mapping::file_size(header_len(), &[ring])
}

/// A peer's segment that fails a check: a protocol violation.
fn peer_segment(why: impl std::fmt::Display) -> Error {
    Error::violation(format!("peer's shared segment: {why}"))
}

/// Checks a peer's segment header against what the handshake said.
fn check_header(h: &SegHeader, side: Side, ring: usize) -> Result<()> {
    let hl = header_len();
    if h.magic != SEG_MAGIC {
        return Err(peer_segment(format!("bad magic {:#018x}", h.magic)));
    }
    if h.version != SEG_VERSION {
        return Err(Error::new(
            ErrorKind::VersionMismatch,
            format!(
                "peer's shared segment has version {} (this side knows {SEG_VERSION})",
                h.version
            ),
        ));
    }
    if h.header_len as usize != hl || h.ring_size != ring as u64 || h.side != side as u32 {
        return Err(peer_segment(format!(
            "header says header {}, ring {} and side {}, handshake said {hl}, {ring} and \
             {side:?} ({})",
            h.header_len, h.ring_size, h.side, side as u32
        )));
    }
    Ok(())
}

/// One side's segment, mapped: read-write if this process created it, read-only if the
/// peer did.
pub struct Half {
    map: Mapping,
    ring: usize,
}

impl Half {
    /// Creates, maps (read-write) and seals this side's segment with an outbound ring of
    /// `ring` bytes (a valid ring size). The memfd is returned to be passed to the peer,
    /// who can then only map it read-only.
    pub fn create(side: Side, ring: usize) -> Result<(Half, OwnedFd)> {
        let (half, fd) = Half::create_unsealed(side, ring)?;
        // After our own writable mapping: it stays writable, no other can be made. Fail
        // closed on kernels without the seal (before 5.1): the peer could write our state.
        memfd::add_seals(fd.as_fd(), memfd::OWNER_SEALS)
            .map_err(|e| Error::io("shared segment: seal (F_SEAL_FUTURE_WRITE)", e))?;
        Ok((half, fd))
    }

    /// [`Half::create`] without the seals, for tests that seal (or not) themselves.
    pub(crate) fn create_unsealed(side: Side, ring: usize) -> Result<(Half, OwnedFd)> {
        let hl = header_len();
        let name = match side {
            Side::Client => "shmlink-client",
            Side::Server => "shmlink-server",
        };
        let fd = memfd::create_unsealed(name, file_size(ring))
            .map_err(|e| Error::io("shared segment: memfd", e))?;
        let map = Mapping::map(fd.as_fd(), hl, &[ring], true)
            .map_err(|e| Error::io("shared segment: mmap", e))?;
        let header = SegHeader {
            magic: SEG_MAGIC,
            version: SEG_VERSION,
            header_len: hl as u32,
            side: side as u32,
            _reserved: 0,
            ring_size: ring as u64,
        };
        // SAFETY: the header area is at least one page, writable, page-aligned, and not
        // yet shared with anyone.
        unsafe { map.header().cast::<SegHeader>().write(header) };
        let half = Half { map, ring };
        // Fault the ring's first page in now (a zero over the zero that is there): the
        // first message lands in it, and a segment made ahead (a spare, design §5.1b) then
        // takes no page fault on the connection's first send. The page stays ours: the
        // segment is not shared yet.
        let (data, _) = half.ring_data();
        // SAFETY: `data` is the start of our writable ring data area, 8-aligned, at least
        // a page long; nobody else maps the segment yet.
        unsafe { data.cast::<u64>().as_ptr().write_volatile(0) };
        // SAFETY: the block lies inside our writable header page (see `consumer_ctl`),
        // which lives as long as `half`.
        unsafe { half.consumer_ctl().as_ref() }.start_armed();
        half.cpu().store(NO_CPU, Ordering::Relaxed);
        Ok((half, fd))
    }

    /// Maps the peer's segment read-only after checking that only the peer can write it
    /// (all of [`memfd::OWNER_SEALS`]) and that it has the size the handshake implies, and
    /// validates its header: written by `side`, with an outbound ring of `ring` bytes.
    pub fn attach(fd: &OwnedFd, side: Side, ring: usize) -> Result<Half> {
        memfd::check_owner_sealed(fd.as_fd(), file_size(ring)).map_err(peer_segment)?;
        let map = Mapping::map(fd.as_fd(), header_len(), &[ring], false)
            .map_err(|e| Error::io("peer's shared segment: mmap", e))?;
        // Copy the header into a local once; the peer may change it any time.
        // SAFETY: the header area is mapped, readable and page-aligned.
        let h = unsafe { map.header().cast::<SegHeader>().read_volatile() };
        check_header(&h, side, ring)?;
        Ok(Half { map, ring })
    }

    /// The checks of [`Half::attach`] without mapping the segment: its seals and size,
    /// and its header read with one `pread`. A listener answers a client after these and
    /// maps the client's segment while the client maps its own (the client may still
    /// change its header meanwhile: `attach` checks it again).
    pub fn check(fd: &OwnedFd, side: Side, ring: usize) -> Result<()> {
        memfd::check_owner_sealed(fd.as_fd(), file_size(ring)).map_err(peer_segment)?;
        let mut b = [0u8; std::mem::size_of::<SegHeader>()];
        let read = memfd::read_at(fd.as_fd(), 0, &mut b)
            .map_err(|e| Error::io("peer's shared segment: read its header", e))?;
        if read != b.len() {
            return Err(peer_segment(format!("header of {read} bytes")));
        }
        // SAFETY: `b` holds size_of::<SegHeader>() bytes and every bit pattern is a valid
        // SegHeader (integers only); read_unaligned needs no alignment.
        let h = unsafe { b.as_ptr().cast::<SegHeader>().read_unaligned() };
        check_header(&h, side, ring)
    }

    /// Start of the mapping (the segment header). Writable only in the process that
    /// created the segment.
    pub fn base(&self) -> NonNull<u8> {
        self.map.header()
    }

    /// The outbound ring's data area and size (mapped twice: `2 * size` bytes are valid).
    pub fn ring_data(&self) -> (NonNull<u8>, usize) {
        let (data, size) = self.map.ring(0);
        debug_assert_eq!(size, self.ring);
        (data, size)
    }

    /// The outbound ring's producer block.
    fn producer_ctl(&self) -> NonNull<ProducerCtl> {
        // SAFETY: PRODUCER_OFFSET + the block's size lies inside the header page (see
        // `header_len`); the offset is a multiple of 128 in a page-aligned mapping.
        unsafe { self.base().add(PRODUCER_OFFSET).cast() }
    }

    /// The inbound ring's consumer block.
    fn consumer_ctl(&self) -> NonNull<ConsumerCtl> {
        // SAFETY: as in `producer_ctl`: CONSUMER_OFFSET (a multiple of 128) + the block's
        // size lies inside the header page.
        unsafe { self.base().add(CONSUMER_OFFSET).cast() }
    }

    /// This side's place slot for `wait`.
    fn place(&self, wait: Wait) -> &AtomicU32 {
        // SAFETY: as `cpu`: inside the header page, 4-aligned, only accessed atomically,
        // and any value is valid (anything but `Place::Pipe` reads as the socket).
        unsafe {
            self.base()
                .add(PLACE_OFFSET + 4 * wait as usize)
                .cast::<AtomicU32>()
                .as_ref()
        }
    }

    /// Records in this side's CPU slot that this side runs on `cpu`: [`Segment::note_cpu`]
    /// before each wait, and the handshake before the segment goes to the peer, so that
    /// the peer's first wait already knows whether spinning can help.
    pub fn set_cpu(&self, cpu: u32) {
        // Store only on a change, so the slot's line stays shared rather than bouncing.
        if self.cpu().load(Ordering::Relaxed) != cpu {
            self.cpu().store(cpu, Ordering::Relaxed);
        }
    }

    /// This side's CPU slot.
    fn cpu(&self) -> &AtomicU32 {
        // SAFETY: the slot lies inside the header page, 4-aligned; it is only ever
        // accessed atomically (loads only, in the peer's read-only mapping), and any value
        // is valid (it is a hint).
        unsafe { self.base().add(CPU_OFFSET).cast::<AtomicU32>().as_ref() }
    }
}

/// Both segments of a connection: ours (mapped read-write) and the peer's (read-only),
/// and the two rings built from them.
pub struct Segment {
    own: ManuallyDrop<Half>,
    peer: ManuallyDrop<Half>,
    /// Whether dropping leaves the unmapping to [`reap_one`] (see [`Segment::retire`]).
    retire: bool,
}

/// Most halves of closed connections that wait to be unmapped (four connections' worth;
/// more are unmapped at once).
const MAX_RETIRED: usize = 8;

/// Halves of closed connections not unmapped yet: unmapping them (two `munmap`s per side
/// and connection, with their TLB flushes) is left to a moment when this process waits
/// anyway: a client's wait for a listener's answer, a listener's step before it sleeps
/// (design §5.1b). Nothing refers to them any more; the peer may still map them, which
/// it does in any case until it drops its side.
static RETIRED: Mutex<Vec<Half>> = Mutex::new(Vec::new());

fn retired() -> MutexGuard<'static, Vec<Half>> {
    RETIRED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether any half of a closed connection waits to be unmapped.
pub fn any_retired() -> bool {
    !retired().is_empty()
}

/// Unmaps one half of a closed connection whose unmapping was left for later; returns
/// whether there was one.
pub fn reap_one() -> bool {
    let half = retired().pop();
    half.is_some()
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: each field is taken exactly once, here, and not touched again: `self`
        // is being dropped. The rings built from them (`tx`/`rx`) are owned next to this
        // Segment by the connection, which drops them first (design: fields in order).
        let (own, peer) = unsafe {
            (
                ManuallyDrop::take(&mut self.own),
                ManuallyDrop::take(&mut self.peer),
            )
        };
        if self.retire {
            let mut list = retired();
            if list.len() + 2 <= MAX_RETIRED {
                list.push(own);
                list.push(peer);
                return;
            }
        }
        drop((own, peer));
    }
}

impl Segment {
    /// Joins our segment (from [`Half::create`]) and the peer's (from [`Half::attach`]).
    pub fn new(own: Half, peer: Half) -> Segment {
        Segment {
            own: ManuallyDrop::new(own),
            peer: ManuallyDrop::new(peer),
            retire: false,
        }
    }

    /// With `retire`, dropping this Segment leaves both mappings to be unmapped later, at
    /// a [`reap_one`] (at most [`MAX_RETIRED`] halves wait; beyond that they are unmapped
    /// at once): a connection's close then costs no `munmap` while the next connection
    /// is being set up.
    pub fn retire(mut self, retire: bool) -> Segment {
        self.retire = retire;
        self
    }

    /// The ring we send on: our producer block and data area, the peer's consumer block.
    pub fn tx(&self) -> RingRef {
        let (data, cap) = self.own.ring_data();
        // SAFETY: the blocks lie in the header pages (see `Half::producer_ctl`), 128-
        // aligned, initialised by the memfd's zeros and `create`; what a Producer writes
        // (our block, our data area) is in our writable mapping, the consumer block it
        // only loads from is in the peer's read-only one. The data area is mapped twice
        // by `Mapping`, `cap` is a valid ring size (checked by the handshake). Both
        // mappings live as long as `self`, and the rings built from them are owned next to
        // this Segment by the connection, which drops them together.
        unsafe { RingRef::new(self.own.producer_ctl(), self.peer.consumer_ctl(), data, cap) }
    }

    /// The ring we receive on: the peer's producer block and data area, our consumer
    /// block.
    pub fn rx(&self) -> RingRef {
        let (data, cap) = self.peer.ring_data();
        // SAFETY: as in `tx`, the other way round: a Consumer writes only our consumer
        // block (in our writable mapping) and loads from the peer's producer block and
        // data area (its read-only mapping).
        unsafe { RingRef::new(self.peer.producer_ctl(), self.own.consumer_ctl(), data, cap) }
    }

    /// Records that we are about to wait on `cpu`; returns whether the peer last waited
    /// on the same CPU (then busy-polling cannot help: the peer cannot run until we
    /// stop). The peer may put anything in its slot; it only steers spinning.
    pub fn note_cpu(&self, cpu: u32) -> bool {
        self.own.set_cpu(cpu);
        self.peer.cpu().load(Ordering::Relaxed) == cpu
    }
}

impl Segment {
    /// Records where we will sleep for `wait`, before announcing it. Stores only on a
    /// change, so the line stays shared while a side keeps its habits.
    #[inline]
    pub fn set_place(&self, wait: Wait, place: Place) {
        let slot = self.own.place(wait);
        if slot.load(Ordering::Relaxed) != place as u32 {
            slot.store(place as u32, Ordering::Relaxed);
            // SYNC POINT (place): pairs with the Acquire fence in `peer_place`. The
            // announcement's count store follows (Relaxed, in `arm`): a waker that loads
            // that count and then fences sees this place or a later one. The SeqCst
            // fences of the announcement do not give this: a waker may read a count
            // stored after its own fence (its fence came first, the sleeper's re-check
            // then sees only records it had already taken, and it sleeps) — without this
            // pair it could read the place before it, ring there, and remember the
            // count as woken (loom found it: `loom_sleeps_alternate_between_socket_and_pipe`).
            fence(Ordering::Release);
        }
    }

    /// Where the peer sleeps for `wait`, as it last said, read after the load of its
    /// announcement (`commit`/`advance` returned true). Any value but `Pipe` is the socket.
    #[inline]
    pub fn peer_place(&self, wait: Wait) -> Place {
        // SYNC POINT (place): pairs with the Release fence in `set_place`, through the
        // announcement count the waker just loaded.
        fence(Ordering::Acquire);
        if self.peer.place(wait).load(Ordering::Relaxed) == Place::Pipe as u32 {
            Place::Pipe
        } else {
            Place::Socket
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permissions `/proc/self/maps` shows for the mapping that holds `addr`.
    fn perms_at(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find_map(|l| {
                let (range, rest) = l.split_once(' ')?;
                let (start, end) = range.split_once('-')?;
                let start = usize::from_str_radix(start, 16).ok()?;
                let end = usize::from_str_radix(end, 16).ok()?;
                (start..end).contains(&addr).then(|| rest[..4].to_string())
            })
            .unwrap_or_else(|| panic!("no mapping holds {addr:#x}"))
    }

    #[test]
    fn own_segment_is_writable_the_peers_read_only() {
        let ring = 4 * page_size();
        let (own, _own_fd) = Half::create(Side::Client, ring).unwrap();
        let (_theirs, their_fd) = Half::create(Side::Server, ring).unwrap();
        let peer = Half::attach(&their_fd, Side::Server, ring).unwrap();
        for (half, want) in [(&own, "rw-s"), (&peer, "r--s")] {
            let (data, size) = half.ring_data();
            // The header, both copies of the ring.
            for addr in [
                half.base().as_ptr() as usize,
                data.as_ptr() as usize,
                data.as_ptr() as usize + size,
            ] {
                assert_eq!(perms_at(addr), want, "mapping at {addr:#x}");
            }
        }
        assert!(memfd::seals(their_fd.as_fd()).unwrap() & memfd::SEAL_FUTURE_WRITE != 0);
    }

    /// Whether the page holding `addr` is resident (`mincore`).
    fn resident(addr: *const u8) -> bool {
        crate::sys::page_resident(addr).expect("mincore")
    }

    #[test]
    fn a_new_segments_first_ring_page_is_faulted_in_and_zero() {
        let ring = 16 * page_size();
        let (own, _fd) = Half::create(Side::Client, ring).unwrap();
        let (data, _) = own.ring_data();
        assert!(resident(data.as_ptr()), "the first send's page");
        // SAFETY: the first page of our own ring, readable.
        let first = unsafe { std::slice::from_raw_parts(data.as_ptr(), page_size()) };
        assert!(first.iter().all(|&b| b == 0), "a fresh ring is all zero");
    }

    /// A client-side segment (ours and a read-only copy of a listener's).
    fn client_segment(ring: usize) -> Segment {
        let (own, _own_fd) = Half::create(Side::Client, ring).unwrap();
        let (_theirs, their_fd) = Half::create(Side::Server, ring).unwrap();
        Segment::new(own, Half::attach(&their_fd, Side::Server, ring).unwrap())
    }

    #[test]
    fn a_retired_segment_stays_mapped_until_reaped() {
        let seg = client_segment(page_size()).retire(true);
        let own = seg.own.base().as_ptr() as usize;
        let peer = seg.peer.base().as_ptr() as usize;
        drop(seg);
        // Other tests of this binary retire and reap too: look under the list's lock,
        // which no reap can pass.
        let ours = |list: &Vec<Half>| {
            list.iter()
                .filter(|h| [own, peer].contains(&(h.base().as_ptr() as usize)))
                .count()
        };
        {
            let list = retired();
            assert_eq!(ours(&list), 2, "both halves wait to be unmapped");
            assert_eq!(perms_at(own), "rw-s", "ours, still mapped");
            assert_eq!(perms_at(peer), "r--s", "the peer's, still mapped");
        }
        while ours(&retired()) > 0 {
            assert!(reap_one(), "a reap while halves wait unmaps one");
        }
        // Not retired: not on the list.
        let seg = client_segment(page_size());
        let own = seg.own.base().as_ptr() as usize;
        drop(seg);
        assert!(retired().iter().all(|h| h.base().as_ptr() as usize != own));
    }

    #[test]
    fn at_most_max_retired_halves_wait() {
        let segs: Vec<Segment> = (0..MAX_RETIRED)
            .map(|_| client_segment(page_size()).retire(true))
            .collect();
        drop(segs);
        // (Other tests may have reaped some meanwhile: the bound is what is checked.)
        let waiting = retired().len();
        assert!(
            waiting <= MAX_RETIRED,
            "{waiting} halves wait, at most {MAX_RETIRED}"
        );
        while reap_one() {}
    }

    #[test]
    fn attach_checks_seals_side_and_size() {
        let ring = page_size();
        let (_s, server_fd) = Half::create(Side::Server, ring).unwrap();
        let err = |r: Result<Half>| r.err().map(|e| e.kind());
        assert_eq!(err(Half::attach(&server_fd, Side::Server, ring)), None);
        assert_eq!(
            err(Half::attach(&server_fd, Side::Client, ring)),
            Some(ErrorKind::ProtocolViolation),
            "a segment of the wrong side (a reflected one)"
        );
        assert_eq!(
            err(Half::attach(&server_fd, Side::Server, 2 * ring)),
            Some(ErrorKind::ProtocolViolation),
            "the wrong size"
        );
        let (_u, unsealed) = Half::create_unsealed(Side::Server, ring).unwrap();
        assert_eq!(
            err(Half::attach(&unsealed, Side::Server, ring)),
            Some(ErrorKind::ProtocolViolation)
        );
        memfd::add_seals(unsealed.as_fd(), memfd::SEALS).unwrap();
        assert_eq!(
            err(Half::attach(&unsealed, Side::Server, ring)),
            Some(ErrorKind::ProtocolViolation),
            "sealed against resizing, but writable by its creator's peer"
        );
    }

    #[test]
    fn check_without_mapping_agrees_with_attach() {
        let ring = page_size();
        let (s, server_fd) = Half::create(Side::Server, ring).unwrap();
        let (_u, unsealed) = Half::create_unsealed(Side::Server, ring).unwrap();
        let kinds = |fd: &OwnedFd, side: Side, ring: usize| {
            (
                Half::check(fd, side, ring).err().map(|e| e.kind()),
                Half::attach(fd, side, ring).err().map(|e| e.kind()),
            )
        };
        assert_eq!(kinds(&server_fd, Side::Server, ring), (None, None));
        let bad = Some(ErrorKind::ProtocolViolation);
        assert_eq!(kinds(&server_fd, Side::Client, ring), (bad, bad));
        assert_eq!(kinds(&server_fd, Side::Server, 2 * ring), (bad, bad));
        assert_eq!(kinds(&unsealed, Side::Server, ring), (bad, bad));
        // A header its writer changed: another version, then garbage.
        let header = s.base().cast::<SegHeader>().as_ptr();
        // SAFETY: our own segment's header, mapped read-write here; integer fields, and
        // no reference to them is held.
        unsafe { (*header).version += 1 };
        let old = Some(ErrorKind::VersionMismatch);
        assert_eq!(kinds(&server_fd, Side::Server, ring), (old, old));
        // SAFETY: as above.
        unsafe { (*header).magic = 0 };
        assert_eq!(kinds(&server_fd, Side::Server, ring), (bad, bad));
    }

    #[test]
    fn rings_cross_between_the_two_segments() {
        let ring = page_size();
        let (c_own, c_fd) = Half::create(Side::Client, ring).unwrap();
        let (s_own, s_fd) = Half::create(Side::Server, ring).unwrap();
        let client = Segment::new(c_own, Half::attach(&s_fd, Side::Server, ring).unwrap());
        let server = Segment::new(s_own, Half::attach(&c_fd, Side::Client, ring).unwrap());
        let mode = crate::ring::FenceMode::Symmetric;
        for (from, to) in [(&client, &server), (&server, &client)] {
            let mut p = crate::ring::Producer::new(from.tx(), mode);
            let mut c = crate::ring::Consumer::new(to.rx(), mode);
            let dst = p.try_reserve(8).unwrap().unwrap();
            // SAFETY: 8 bytes reserved at `dst`, 8-aligned, in our writable mapping.
            unsafe { dst.cast::<u64>().as_ptr().write(0x1234) };
            assert!(p.commit(8, 0), "the consumer starts armed");
            let rec = c.peek().unwrap().unwrap();
            // SAFETY: peek validated the record inside the (read-only) mapping.
            let got = unsafe { rec.ptr.cast::<u64>().as_ptr().read_volatile() };
            assert_eq!(got, 0x1234);
            c.advance(rec.size());
            // All of it free again, but the next record's header slot.
            assert!(p.has_room(ring - crate::ring::HEADER).unwrap());
        }
        assert!(!client.note_cpu(3));
        assert!(server.note_cpu(3));
        assert_eq!(
            server.peer_place(Wait::Data),
            Place::Socket,
            "zeroed: the socket"
        );
        client.set_place(Wait::Data, Place::Pipe);
        assert_eq!(server.peer_place(Wait::Data), Place::Pipe);
        assert_eq!(server.peer_place(Wait::Room), Place::Socket);
        assert_eq!(client.peer_place(Wait::Data), Place::Socket);
    }
}
