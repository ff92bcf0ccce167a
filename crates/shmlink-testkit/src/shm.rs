//! Raw `shm:` clients and listeners for tests that break the protocol on purpose: raw
//! handshakes, a silent client, a scripted fake listener, segments with chosen flaws, a
//! [`HostilePeer`] that scribbles over its own segment, and the attacks on a read-only
//! memfd. Built on the public API, shmlink-sys and the library's `testing` hooks
//! (packets and the segment layout).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use shmlink::testing::{
    segment_header_len, HandshakePacket as Packet, HandshakeParams as Params, RawSegment,
    MAX_HANDSHAKE_PACKET, SEGMENT_CONSUMER_OFFSET, SEGMENT_PRODUCER_OFFSET,
};
use shmlink::{Address, Error, ErrorKind, Result, UnixName};
use shmlink_ring::spsc::{
    CLOSED_OFFSET, CONSUMER_WAITING_OFFSET, HEAD_OFFSET, PRODUCER_WAITING_OFFSET, TAIL_OFFSET,
};
use shmlink_sys::memfd::{self, Region};
use shmlink_sys::{libc, socket};

fn socket_path(addr: &str) -> Result<UnixName> {
    match Address::parse(addr)? {
        Address::Shm { socket, .. } => Ok(socket),
        other => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{other} is not a shm: address"),
        )),
    }
}

/// Connects to a `shm:` listener, sends `bytes` as the hello, and returns the answer
/// packet (empty if the listener closed without answering) and any descriptors with it.
pub fn raw_handshake(addr: &str, bytes: &[u8]) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let sock = socket::connect(&socket_path(addr)?, deadline).map_err(|e| Error::io(addr, e))?;
    socket::send(sock.as_fd(), bytes).map_err(|e| Error::io("send", e))?;
    let mut buf = [0u8; MAX_HANDSHAKE_PACKET];
    let mut fds = Vec::new();
    let n = socket::recv_until(sock.as_fd(), &mut buf, &mut fds, deadline)
        .map_err(|e| Error::io("receive answer", e))?;
    Ok((buf[..n].to_vec(), fds))
}

/// [`raw_handshake`] with descriptors attached to the first packet (a hello carrying a
/// client's segment, or something posing as one).
pub fn raw_handshake_with_fds(
    addr: &str,
    bytes: &[u8],
    fds: &[OwnedFd],
) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let sock = socket::connect(&socket_path(addr)?, deadline).map_err(|e| Error::io(addr, e))?;
    let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
    socket::send_with_fds(sock.as_fd(), bytes, &raw).map_err(|e| Error::io("send", e))?;
    let mut buf = [0u8; MAX_HANDSHAKE_PACKET];
    let mut got = Vec::new();
    let n = socket::recv_until(sock.as_fd(), &mut buf, &mut got, deadline)
        .map_err(|e| Error::io("receive answer", e))?;
    Ok((buf[..n].to_vec(), got))
}

/// Connects to a `shm:` listener and says nothing (the socket stays open while the
/// returned descriptor lives).
pub fn silent_client(addr: &str) -> Result<OwnedFd> {
    let deadline = Instant::now() + Duration::from_secs(5);
    socket::connect(&socket_path(addr)?, deadline).map_err(|e| Error::io(addr, e))
}

/// Connects to the `shm:` listener at `addr` with a genuine hello for rings of
/// `ring_size` bytes; returns the socket, the listener's answer and its memfd.
fn hello_accepted(addr: &str, ring_size: usize) -> Result<(OwnedFd, Params, OwnedFd)> {
    let hello = Packet::Hello(Params {
        features: 0,
        ring_c2s: ring_size as u64,
        ring_s2c: ring_size as u64,
        max_msg: 1 << 20,
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let sock = socket::connect(&socket_path(addr)?, deadline).map_err(|e| Error::io(addr, e))?;
    socket::send(sock.as_fd(), &hello.encode()).map_err(|e| Error::io("hello", e))?;
    let mut buf = [0u8; MAX_HANDSHAKE_PACKET];
    let mut fds = Vec::new();
    let n = socket::recv_until(sock.as_fd(), &mut buf, &mut fds, deadline)
        .map_err(|e| Error::io("accept", e))?;
    let Packet::Accept(p) = Packet::decode(&buf[..n])? else {
        return Err(Error::new(
            ErrorKind::ProtocolViolation,
            "listener did not accept",
        ));
    };
    let memfd = fds
        .pop()
        .ok_or_else(|| Error::new(ErrorKind::ProtocolViolation, "no memfd in accept"))?;
    Ok((sock, p, memfd))
}

/// A client that completes a genuine handshake and then has raw access to everything it
/// may write — its own segment: the client → server ring's records, tail, end mark and
/// sleep announcements, the server → client ring's head and sleep announcements — to
/// scribble over it like a buggy or malicious peer. The listener's segment it maps
/// read-only, as every client does; [`HostilePeer::attack_victim_segment`] tries the ways
/// around that.
pub struct HostilePeer {
    sock: OwnedFd,
    /// The listener's memfd, as received.
    memfd: OwnedFd,
    /// The listener's segment, mapped read-only.
    victim: RawSegment,
    /// Our segment, mapped read-write.
    own: RawSegment,
}

impl HostilePeer {
    /// Connects to the `shm:` listener at `addr`, asking for rings of `ring_size` bytes.
    pub fn connect(addr: &str, ring_size: usize) -> Result<HostilePeer> {
        let (sock, p, memfd) = hello_accepted(addr, ring_size)?;
        let victim = RawSegment::attach(&memfd, true, p.ring_s2c as usize)?;
        let (own, own_fd) = RawSegment::create(false, p.ring_c2s as usize)?;
        socket::send_with_fds(
            sock.as_fd(),
            &Packet::Segment.encode(),
            &[own_fd.as_raw_fd()],
        )
        .map_err(|e| Error::io("segment", e))?;
        Ok(HostilePeer {
            sock,
            memfd,
            victim,
            own,
        })
    }

    /// The listener's memfd, as received, to try `ftruncate` and friends on.
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// The listener's segment file size.
    pub fn file_size(&self) -> usize {
        memfd::file_size(self.memfd.as_fd()).unwrap_or(0)
    }

    /// Writes `value` at byte offset `off` (8-aligned, within the header page) of our own
    /// segment: its header, our CPU slot, the client → server ring's producer block
    /// (`tail` at 128, see [`TAIL_OFFSET`]) and the server → client ring's consumer block
    /// (`head` at [`HEAD_OFFSET`]).
    pub fn poke_header(&self, off: usize, value: u64) {
        assert!(off % 8 == 0 && off + 8 <= segment_header_len());
        // SAFETY: the offset lies inside the mapped header page of our own segment, which
        // we created and mapped writable.
        unsafe { self.own.base().add(off).cast::<u64>().write_volatile(value) };
    }

    /// Writes `value` at byte offset `off` (8-aligned, below the ring's size) of ring
    /// `ring`'s data area. Only ring 0 (client → server) is ours; the server → client
    /// ring lives in the listener's segment, which no client can write.
    pub fn poke_ring(&self, ring: usize, off: usize, value: u64) {
        assert_eq!(ring, 0, "a client can write only the client → server ring");
        let (data, size) = self.own.ring_data();
        assert!(off % 8 == 0 && off + 8 <= size);
        // SAFETY: the offset lies inside the mapped, writable data area of our segment.
        unsafe { data.as_ptr().add(off).cast::<u64>().write_volatile(value) };
    }

    /// A word of the listener's segment (8-aligned offset within its header page, or in
    /// its ring: `off - header_len`), read through our read-only mapping.
    pub fn peek_victim(&self, off: usize) -> u64 {
        let size = segment_header_len() + self.victim.ring_data().1;
        assert!(off % 8 == 0 && off + 8 <= size);
        // SAFETY: the offset lies inside the readable mapping of the listener's segment
        // (the header page and the first copy of the ring follow each other).
        unsafe {
            self.victim
                .base()
                .as_ptr()
                .add(off)
                .cast::<u64>()
                .read_volatile()
        }
    }

    /// Fills our header page and our ring with random 8-byte values at `count` random
    /// places, driven by the xorshift state `seed`.
    pub fn scribble(&self, seed: &mut u64, count: usize) {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        let header_words = segment_header_len() / 8;
        // The words the ring reads, where naive values do the most damage.
        let ctl = [
            SEGMENT_PRODUCER_OFFSET + TAIL_OFFSET,
            SEGMENT_PRODUCER_OFFSET + CLOSED_OFFSET,
            SEGMENT_PRODUCER_OFFSET + PRODUCER_WAITING_OFFSET,
            SEGMENT_CONSUMER_OFFSET + HEAD_OFFSET,
            SEGMENT_CONSUMER_OFFSET + CONSUMER_WAITING_OFFSET,
        ];
        let words = self.own.ring_data().1 / 8;
        for _ in 0..count {
            let (place, value) = (next(), next());
            // Small values are the dangerous ones (they pass naive checks): mix them in.
            let value = match place % 4 {
                0 => value % 4096,
                1 => value & !7,
                _ => value,
            };
            match (place >> 8) % 3 {
                0 => self.poke_header((value as usize % header_words) * 8, value),
                1 => self.poke_header(ctl[(place >> 16) as usize % ctl.len()], value),
                _ => self.poke_ring(0, ((place >> 16) as usize % words) * 8, value),
            }
        }
    }

    /// Tries every way a client could get write access to the listener's segment with what
    /// it was given; returns what each attempt got (`Ok` would be a hole).
    pub fn attack_victim_segment(&self) -> Vec<(&'static str, io::Result<()>)> {
        attack_read_only(self.memfd.as_fd(), self.file_size())
    }

    /// Rings the listener side's doorbell.
    pub fn doorbell(&self) {
        self.control(&[1]);
    }

    /// Sends `packet` on the control socket, where only one-byte doorbells belong.
    pub fn control(&self, packet: &[u8]) {
        let _ = socket::send(self.sock.as_fd(), packet);
    }
}

impl AsRawFd for HostilePeer {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

/// Every way to write a memfd of `len` bytes that a process received read-only: a
/// writable shared mapping, `mprotect` of a read-only one, `pwrite`, `ftruncate`, new
/// seals, and a writable reopen through `/proc`. Returns what each attempt got.
pub fn attack_read_only(fd: BorrowedFd<'_>, len: usize) -> Vec<(&'static str, io::Result<()>)> {
    let check = |ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    let mut out = Vec::new();
    out.push(("mmap read-write", Region::map(fd, len, true).map(drop)));
    let mprotect = Region::map(fd, len, false).and_then(|ro| ro.make_writable());
    out.push(("mprotect read-only mapping to read-write", mprotect));
    let w = memfd::write_at(fd, 128, &[0xffu8; 8]);
    out.push(("pwrite", w.and_then(|n| check(n == 8))));
    out.push(("ftruncate", memfd::truncate(fd, 4096)));
    out.push(("add F_SEAL_WRITE", memfd::add_seals(fd, memfd::SEAL_WRITE)));
    // Reopening through /proc gives a new open file on the same sealed inode.
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let reopen = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .and_then(|f| Region::map(f.as_fd(), len, true).map(drop));
    out.push(("reopen through /proc and mmap read-write", reopen));
    out
}

/// Serves one client on the `shm:` address `addr` with a scripted answer, in a thread:
/// `answer` gets the client's hello (or subscribe request) and returns the packet to
/// send and the descriptors to pass with it. The connection stays open until the client
/// closes it (what it sends meanwhile, such as its segment, is read and dropped).
pub fn fake_listener(
    addr: &str,
    answer: impl FnOnce(&[u8]) -> (Vec<u8>, Vec<OwnedFd>) + Send + 'static,
) -> Result<std::thread::JoinHandle<()>> {
    let name = socket_path(addr)?;
    if let UnixName::Path(p) = &name {
        let _ = std::fs::remove_file(p);
    }
    let listen = socket::listen(&name, 4).map_err(|e| Error::io("bind", e))?;
    Ok(std::thread::spawn(move || {
        let sock = loop {
            if let Ok(Some(s)) = socket::accept(listen.as_fd()) {
                break s;
            }
            let _ = shmlink_sys::poll_fd(listen.as_fd(), shmlink_sys::Interest::READABLE, None);
        };
        let mut buf = [0u8; MAX_HANDSHAKE_PACKET];
        let deadline = Instant::now() + Duration::from_secs(5);
        let Ok(n) = socket::recv_until(sock.as_fd(), &mut buf, &mut Vec::new(), deadline) else {
            return;
        };
        let (reply, fds) = answer(&buf[..n]);
        if !reply.is_empty() {
            let fds: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
            let _ = socket::send_with_fds(sock.as_fd(), &reply, &fds);
        }
        // Hold the connection until the client hangs up (or the deadline).
        while let Ok(n) = socket::recv_until(sock.as_fd(), &mut buf, &mut Vec::new(), deadline) {
            if n == 0 {
                break;
            }
        }
        if let UnixName::Path(p) = &name {
            let _ = std::fs::remove_file(p);
        }
    }))
}

/// A sealed memfd of `size` bytes, or an unsealed one, for fake listeners.
pub fn memfd(size: usize, sealed: bool) -> io::Result<OwnedFd> {
    if sealed {
        memfd::create_sealed("fake", size)
    } else {
        memfd::create_unsealed("fake", size)
    }
}

/// A genuine listener segment with a ring of `ring_size` bytes, sealed as a listener seals
/// it, for fake listeners that want to start from a valid one.
pub fn segment_memfd(ring_size: usize) -> Result<OwnedFd> {
    RawSegment::create(true, ring_size).map(|(_, fd)| fd)
}

/// A segment for fake peers to break: a listener's (`server`) or a client's with a ring
/// of `ring_size` bytes, its header page changed by `pokes` (byte offset, 8-byte value:
/// offset 8 is the layout version), then sealed with `seals` only (a genuine segment has
/// `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE`).
pub fn segment_memfd_with(
    server: bool,
    ring_size: usize,
    pokes: &[(usize, u64)],
    seals: libc::c_int,
) -> Result<OwnedFd> {
    let (half, fd) = RawSegment::create_unsealed(server, ring_size)?;
    for &(off, value) in pokes {
        assert!(off % 8 == 0 && off + 8 <= segment_header_len());
        // SAFETY: the offset lies inside the writable header page of the segment we just
        // created.
        unsafe { half.base().add(off).cast::<u64>().write_volatile(value) };
    }
    memfd::add_seals(fd.as_fd(), seals).map_err(|e| Error::io("seal", e))?;
    Ok(fd)
}

/// What a listener did after the answer, in [`raw_segment_handshake`].
#[derive(Debug, PartialEq, Eq)]
pub enum AfterAnswer {
    /// It sent this packet (a refusal).
    Packet(Vec<u8>),
    /// It closed the connection without a word.
    Closed,
    /// Nothing happened within the wait.
    Silent,
}

/// Connects to the `shm:` listener at `addr` with a genuine hello for rings of
/// `ring_size` bytes, checks that it accepts, then sends `second` (a packet and its
/// descriptors; `None`: nothing) in place of the client's segment, and watches the
/// listener for `wait`. `second` gets the listener's memfd, to send it back.
pub fn raw_segment_handshake(
    addr: &str,
    ring_size: usize,
    second: impl FnOnce(&OwnedFd) -> Option<(Vec<u8>, Vec<OwnedFd>)>,
    wait: Duration,
) -> Result<AfterAnswer> {
    let (sock, _, theirs) = hello_accepted(addr, ring_size)?;
    let mut buf = [0u8; MAX_HANDSHAKE_PACKET];
    if let Some((packet, fds)) = second(&theirs) {
        let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
        socket::send_with_fds(sock.as_fd(), &packet, &raw).map_err(|e| Error::io("send", e))?;
    }
    let until = Instant::now() + wait;
    Ok(
        match socket::recv_until(sock.as_fd(), &mut buf, &mut Vec::new(), until) {
            Ok(0) => AfterAnswer::Closed,
            Ok(n) => AfterAnswer::Packet(buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => AfterAnswer::Silent,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => AfterAnswer::Closed,
            Err(e) => return Err(Error::io("receive answer", e)),
        },
    )
}
