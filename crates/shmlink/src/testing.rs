//! Hostile peers and fuzz entry points for shmlink's own tests and fuzz targets, and the
//! workspace's one way to skip a test visibly ([`skip`]). Not part of the stable API: it
//! exists so tests can break the protocol on purpose.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::addr::{Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::WaitPolicy;
use crate::ring::FenceMode;
use crate::ring::{
    CLOSED_OFFSET, CONSUMER_WAITING_OFFSET, HEAD_OFFSET, PRODUCER_WAITING_OFFSET, TAIL_OFFSET,
};
use crate::sys::{memfd, socket};
use crate::transport::shm::handshake::{Packet, Params, MAX_PACKET};
use crate::transport::shm::segment::{self, Half, Segment, Side, CONSUMER_OFFSET, PRODUCER_OFFSET};
use crate::transport::shm::{Setup, ShmConn};
use crate::transport::ConnOps;

pub use crate::pubsub::handshake::{
    Packet as TopicPacket, Subscribe as TopicSubscribe, Subscribed as TopicSubscribed,
};
pub use crate::transport::auto::Msg as AutoMsg;
pub use crate::transport::shm::handshake::{Packet as HandshakePacket, Params as HandshakeParams};
pub use crate::transport::shm::handshake::{RefuseCode, FEATURE_PIPE_BELL, VERSION};
pub use crate::transport::vm::bell::{bell_stats, read_msg as ivshmem_read_msg, BellStats};

mod skips;
pub use skips::{skip, REQUIRE_ENV, SKIP_LOG_ENV};

/// This kernel's boot id, as an `auto:` client sends it.
pub fn boot_id() -> Vec<u8> {
    crate::transport::local::boot_id()
}

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
    let mut buf = [0u8; MAX_PACKET];
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
    let mut buf = [0u8; MAX_PACKET];
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
    let mut buf = [0u8; MAX_PACKET];
    let mut fds = Vec::new();
    let n = socket::recv_until(sock.as_fd(), &mut buf, &mut fds, deadline)
        .map_err(|e| Error::io("accept", e))?;
    let Packet::Accept(p) = Packet::decode(&buf[..n])? else {
        return Err(Error::violation("listener did not accept"));
    };
    let memfd = fds
        .pop()
        .ok_or_else(|| Error::violation("no memfd in accept"))?;
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
    victim: Half,
    /// Our segment, mapped read-write.
    own: Half,
}

impl HostilePeer {
    /// Connects to the `shm:` listener at `addr`, asking for rings of `ring_size` bytes.
    pub fn connect(addr: &str, ring_size: usize) -> Result<HostilePeer> {
        let (sock, p, memfd) = hello_accepted(addr, ring_size)?;
        let victim = Half::attach(&memfd, Side::Server, p.ring_s2c as usize)?;
        let (own, own_fd) = Half::create(Side::Client, p.ring_c2s as usize)?;
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
        assert!(off % 8 == 0 && off + 8 <= segment::header_len());
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
        let size = segment::header_len() + self.victim.ring_data().1;
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
        let header_words = segment::header_len() / 8;
        // The words the ring reads, where naive values do the most damage.
        let ctl = [
            PRODUCER_OFFSET + TAIL_OFFSET,
            PRODUCER_OFFSET + CLOSED_OFFSET,
            PRODUCER_OFFSET + PRODUCER_WAITING_OFFSET,
            CONSUMER_OFFSET + HEAD_OFFSET,
            CONSUMER_OFFSET + CONSUMER_WAITING_OFFSET,
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
            let _ = crate::sys::poll_fd(listen.as_fd(), crate::sys::Interest::READABLE, None);
        };
        let mut buf = [0u8; MAX_PACKET];
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
    Half::create(Side::Server, ring_size).map(|(_, fd)| fd)
}

/// A segment for fake peers to break: a listener's (`server`) or a client's with a ring
/// of `ring_size` bytes, its header page changed by `pokes` (byte offset, 8-byte value:
/// offset 8 is the layout version), then sealed with `seals` only (a genuine segment has
/// `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE`).
pub fn segment_memfd_with(
    server: bool,
    ring_size: usize,
    pokes: &[(usize, u64)],
    seals: std::ffi::c_int,
) -> Result<OwnedFd> {
    let side = if server { Side::Server } else { Side::Client };
    let (half, fd) = Half::create_unsealed(side, ring_size)?;
    for &(off, value) in pokes {
        assert!(off % 8 == 0 && off + 8 <= segment::header_len());
        // SAFETY: the offset lies inside the writable header page of the segment we just
        // created.
        unsafe { half.base().add(off).cast::<u64>().write_volatile(value) };
    }
    memfd::add_seals(fd.as_fd(), seals).map_err(|e| Error::io("seal", e))?;
    Ok(fd)
}

/// The layout version of `shm:` segments this build writes.
pub const SEGMENT_VERSION: u32 = segment::SEG_VERSION;

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
    let mut buf = [0u8; MAX_PACKET];
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

/// Fuzz entry point: the handshake parsers (`shm:` packets, `ls` status answers and topic
/// status answers included,
/// `auto:` negotiation messages, subscribe handshakes and the records of a topic served
/// over the network)
/// must reject or accept any bytes without panicking, and what they accept must survive
/// a round trip.
pub fn fuzz_handshake(data: &[u8]) {
    crate::pubsub::wire::fuzz_records(data);
    crate::pubsub::status::fuzz_answer(data);
    if let Ok(m) = AutoMsg::decode(data) {
        assert_eq!(
            AutoMsg::decode(&m.encode()).expect("re-encoded message parses"),
            m
        );
    }
    if let Ok(p) = Packet::decode(data) {
        let again = Packet::decode(&p.encode()).expect("re-encoded packet parses");
        if let Packet::Refuse(code, _) = &p {
            assert!(matches!(again, Packet::Refuse(c, _) if c == *code));
        } else {
            assert_eq!(again, p);
        }
    }
    // The subscribe handshake (refusals are the `shm:` ones above; a `shm:` client's
    // packet is recognised, not re-encoded).
    if let Ok(
        p @ (TopicPacket::Subscribe(_)
        | TopicPacket::Subscribed(_)
        | TopicPacket::Upgrade(..)
        | TopicPacket::Upgraded(..)),
    ) = TopicPacket::decode(data)
    {
        assert_eq!(
            TopicPacket::decode(&p.encode()).expect("re-encoded packet parses"),
            p
        );
    }
}

/// Fuzz entry point: a receiving `shm:` connection set up from a listener's answer with
/// arbitrary numbers (ring sizes, features, largest message), over a ring whose control
/// block and contents are arbitrary bytes, changed again between receives, must refuse
/// the answer, or deliver messages or fail with an error — never panic, hang or touch
/// memory outside the mapping.
///
/// Layout of `data`: 1 byte of flags (bit 0: the peer is gone; bit 1: take the answer's
/// numbers raw instead of folding them into plausible ranges), four words of answer
/// (features, ring sizes both ways, largest message), then 8-byte words that fill the
/// peer's data area and then are written, in turn, to the peer's producer position and
/// closed flag. The peer's segment is mapped read-only by the connection, as in a real
/// one; the fuzzer writes it through its creator's mapping.
pub fn fuzz_shm_reader(data: &[u8]) {
    /// The client's ring size (the largest ring a listener may choose).
    const RING: usize = 16384;
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut words = rest.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    });
    let mut take = || words.next().unwrap_or(0);
    let raw = [take(), take(), take(), take()];
    let answer = if flags & 2 != 0 {
        Params {
            features: raw[0],
            ring_c2s: raw[1],
            ring_s2c: raw[2],
            max_msg: raw[3],
        }
    } else {
        Params {
            features: raw[0] % 2,
            ring_c2s: 4096 << (raw[1] % 4),
            ring_s2c: 4096 << (raw[2] % 4),
            max_msg: raw[3] % (1 << 20),
        }
    };
    let offered = crate::transport::shm::handshake::FEATURE_ASYM_FENCE;
    if crate::transport::shm::check_accept(&answer, RING, offered).is_err() {
        return; // refused: the outcome a bad answer must have
    }
    let ring = answer.ring_s2c as usize;
    let Ok((own, _own_fd)) = Half::create(Side::Client, answer.ring_c2s as usize) else {
        return;
    };
    // The listener's segment: written here through its creator's mapping, read by the
    // connection through a read-only one, as in a real connection.
    let Ok((theirs, their_fd)) = Half::create(Side::Server, ring) else {
        return;
    };
    let Ok(peer) = Half::attach(&their_fd, Side::Server, ring) else {
        return;
    };
    let (ours, other_end) = socket::seqpacket_pair().expect("socketpair");
    // Bit 0 set: the peer's end is closed (it died); otherwise it stays open till the end.
    let _peer = (flags & 1 == 0).then_some(other_end);
    // Fill the data area first (the peer's records), then play with the positions.
    let (data_area, _) = theirs.ring_data();
    for i in 0..ring / 8 {
        let Some(w) = words.next() else { break };
        // SAFETY: i * 8 + 8 <= ring, inside the writable mapping of the data area.
        unsafe {
            data_area
                .as_ptr()
                .add(i * 8)
                .cast::<u64>()
                .write_volatile(w)
        };
    }
    // SAFETY: the producer block lies inside the writable header page.
    let ctl = unsafe { theirs.base().add(PRODUCER_OFFSET) }.as_ptr();
    let mut conn = ShmConn::new(Setup {
        seg: Segment::new(own, peer),
        fence: FenceMode::Symmetric,
        sock: ours,
        bell: None,
        wait: WaitPolicy::BLOCKING,
        max_send: answer.max_msg.min(1 << 16) as usize,
        max_recv: 1 << 16,
        local: "shm:fuzz".into(),
        peer: "shm:fuzz".into(),
    });
    for _ in 0..64 {
        if let Some(tail) = words.next() {
            // SAFETY: the producer block is mapped writable; TAIL_OFFSET is its tail word.
            unsafe { ctl.add(TAIL_OFFSET).cast::<u64>().write_volatile(tail) };
        }
        if let Some(closed) = words.next() {
            // SAFETY: the producer block is mapped writable; CLOSED_OFFSET is its closed
            // flag.
            unsafe {
                ctl.add(CLOSED_OFFSET)
                    .cast::<u32>()
                    .write_volatile(closed as u32)
            };
        }
        match conn.recv_next(false) {
            Ok(n) => {
                assert_eq!(conn.current().len(), n);
                conn.release();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
    }
}

// --- publish/subscribe ----------------------------------------------------------------

use crate::pubsub::handshake::{
    Packet as SubPacket, Subscribe as SubRequest, MAX_PACKET as SUB_MAX_PACKET, POLICY_BLOCK,
};
use crate::pubsub::ring::PAYLOAD_OFFSET;
use crate::pubsub::segment::{BellSegment, CursorSegment};
use crate::pubsub::shm_subscriber::ShmSubscriber as PubSubscriber;
use crate::sys::memfd::Region;

/// What a fake publisher announces: the numbers of its `Subscribed` answer, the same
/// numbers again in the topic segment's header (they may disagree), and the real size of
/// the topic memfd it passes.
#[derive(Clone, Copy, Debug)]
pub struct FakeTopic {
    /// Slot count, slot size, largest message and header length in the answer.
    pub announced: [u64; 4],
    /// The same four in the topic segment's header.
    pub in_header: [u64; 4],
    /// Bytes of the topic memfd (sealed against resizing).
    pub file_size: usize,
}

impl FakeTopic {
    /// An honest topic of `slots` slots of `slot_size` bytes: everything agrees.
    pub fn honest(slots: u64, slot_size: u64) -> FakeTopic {
        let hl = crate::pubsub::segment::header_len();
        let numbers = [
            slots,
            slot_size,
            slot_size - PAYLOAD_OFFSET as u64,
            hl as u64,
        ];
        FakeTopic {
            announced: numbers,
            in_header: numbers,
            file_size: hl + (slots * slot_size) as usize,
        }
    }

    /// The `Subscribed` packet and its three descriptors (topic, bell page, cursor
    /// page), for [`fake_listener`].
    pub fn answer(&self) -> (Vec<u8>, Vec<OwnedFd>) {
        use std::os::unix::fs::FileExt;
        let [slots, slot_size, max_msg, header_len] = self.announced;
        let packet = SubPacket::Subscribed(crate::pubsub::handshake::Subscribed {
            slot: 0,
            policy: POLICY_BLOCK,
            slots,
            slot_size,
            max_msg,
            header_len,
            start: 0,
        });
        let topic = memfd::create_unsealed("fake-topic", self.file_size).expect("memfd");
        let [s, z, m, h] = self.in_header;
        let ident = crate::pubsub::segment::ident_bytes(POLICY_BLOCK, s, z, m, h);
        let file = std::fs::File::from(topic);
        file.write_all_at(&ident, 0)
            .expect("write the topic header");
        let topic = OwnedFd::from(file);
        memfd::add_seals(topic.as_fd(), memfd::SEALS).expect("seal");
        let page = || memfd::create_sealed("fake-page", crate::sys::page_size()).expect("memfd");
        (packet.encode(), vec![topic, page(), page()])
    }
}

/// A subscriber that completes a genuine subscribe handshake and then has raw access to
/// what it was given — the topic memfd, the bell page, its cursor page and the socket —
/// to attack the topic like a buggy or malicious process.
pub struct HostileSubscriber {
    sock: OwnedFd,
    topic: OwnedFd,
    topic_len: usize,
    bell: Region,
    page: Region,
    /// Our slot in the topic (our bell bit).
    slot: usize,
}

impl HostileSubscriber {
    /// Subscribes to the topic at `addr` (a `shm:` address).
    pub fn connect(addr: &str) -> Result<HostileSubscriber> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let sock =
            socket::connect(&socket_path(addr)?, deadline).map_err(|e| Error::io(addr, e))?;
        let req = SubPacket::Subscribe(SubRequest {
            features: 0,
            history: 0,
            max_msg: 0,
        });
        socket::send(sock.as_fd(), &req.encode()).map_err(|e| Error::io("request", e))?;
        let mut buf = [0u8; SUB_MAX_PACKET];
        let mut fds = Vec::new();
        let n = socket::recv_until(sock.as_fd(), &mut buf, &mut fds, deadline)
            .map_err(|e| Error::io("answer", e))?;
        let SubPacket::Subscribed(ok) = SubPacket::decode(&buf[..n])? else {
            return Err(Error::violation("publisher did not accept"));
        };
        let [topic, bell, page] = <[OwnedFd; 3]>::try_from(fds)
            .map_err(|_| Error::violation("expected three descriptors"))?;
        let page_size = crate::sys::page_size();
        let map = |fd: &OwnedFd| {
            Region::map(fd.as_fd(), page_size, true).map_err(|e| Error::io("mmap", e))
        };
        let (bell, page) = (map(&bell)?, map(&page)?);
        let topic_len = (ok.header_len + ok.slots * ok.slot_size) as usize;
        Ok(HostileSubscriber {
            sock,
            topic,
            topic_len,
            bell,
            page,
            slot: ok.slot as usize,
        })
    }

    /// Tries everything that could change the topic's messages for the other
    /// subscribers; returns what each attempt got (`Ok` would be a hole).
    pub fn attack_topic(&self) -> Vec<(&'static str, io::Result<()>)> {
        let fd = self.topic.as_fd();
        let mut out = Vec::new();
        out.push((
            "mmap read-write",
            Region::map(fd, self.topic_len, true).map(drop),
        ));
        let mprotect = Region::map(fd, self.topic_len, false).and_then(|ro| ro.make_writable());
        out.push(("mprotect read-only mapping to read-write", mprotect));
        let w = memfd::write_at(fd, 4096, &[0xffu8; 8]);
        out.push((
            "pwrite",
            w.and_then(|n| {
                if n == 8 {
                    Ok(())
                } else {
                    Err(io::Error::new(io::ErrorKind::WriteZero, "short write"))
                }
            }),
        ));
        out.push(("ftruncate", memfd::truncate(fd, 4096)));
        // Reopening through /proc gives a new open file on the same sealed inode.
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let reopen = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .and_then(|f| Region::map(f.as_fd(), self.topic_len, true).map(drop));
        out.push(("reopen through /proc and mmap read-write", reopen));
        out
    }

    /// Writes `count` random 8-byte values at random places of the bell page and of our
    /// cursor page (everything this subscriber can write), driven by the xorshift state
    /// `seed`.
    pub fn scribble(&self, seed: &mut u64, count: usize) {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        let words = crate::sys::page_size() / 8;
        for _ in 0..count {
            let (place, value) = (next(), next());
            let value = match place % 4 {
                0 => value % 4096,
                1 => 0,
                _ => value,
            };
            let region = if place & 256 == 0 {
                &self.bell
            } else {
                &self.page
            };
            let off = ((place >> 16) as usize % words) * 8;
            // SAFETY: `off + 8` lies inside the one-page writable mapping.
            unsafe {
                region
                    .base()
                    .as_ptr()
                    .add(off)
                    .cast::<u64>()
                    .write_volatile(value)
            };
        }
    }

    /// Sends `bytes` to the publisher on the control socket (doorbell floods, garbage).
    pub fn send(&self, bytes: &[u8]) -> io::Result<usize> {
        socket::send(self.sock.as_fd(), bytes)
    }

    /// Our cursor page, as the publisher shares it with us.
    fn cursor_page(&self) -> &crate::pubsub::ring::CursorPage {
        // SAFETY: `page` maps the one-page cursor page (page-aligned, writable) for as
        // long as `self` lives; a CursorPage is all atomics, valid for any bytes.
        unsafe { &*self.page.base().as_ptr().cast() }
    }

    /// Our cursor as it stands in the cursor page.
    pub fn cursor(&self) -> u64 {
        self.cursor_page().load_cursor()
    }

    /// Moves our cursor to `cursor` without reading anything and without ringing the
    /// publisher (a subscriber that trickles progress).
    pub fn store_cursor(&self, cursor: u64) {
        self.cursor_page().advance(cursor, 0, false);
    }

    /// Announces sleep exactly as a genuine subscriber does (wake-me flag, bell bit),
    /// whether or not anything is left to read: repeated after every message, it asks
    /// the publisher for a doorbell per message.
    pub fn announce_sleep(&self) {
        // SAFETY: `bell` maps the one-page bell page (page-aligned, writable) for as long
        // as `self` lives; a BellPage is all atomics, valid for any bytes.
        let bell = unsafe { &*self.bell.base().as_ptr().cast() };
        crate::pubsub::ring::arm_subscriber(self.cursor_page(), bell, self.slot);
    }

    /// Takes every doorbell waiting in our socket; how many there were.
    pub fn take_doorbells(&self) -> usize {
        let mut buf = [0u8; 64];
        let mut n = 0;
        while socket::recv(self.sock.as_fd(), &mut buf).is_ok_and(|len| len > 0) {
            n += 1;
        }
        n
    }
}

/// Fuzz entry point: a subscriber given a topic by a hostile or broken publisher — an
/// announcement with arbitrary numbers, then shared memory holding arbitrary bytes that
/// keep changing — must refuse the announcement, or deliver messages or fail with an
/// error: never panic, hang, or touch memory outside its mapping.
///
/// Layout of `data`: 1 byte of flags (bit 0: the publisher's socket is closed; bit 1:
/// `block` policy; bit 2: take the announcement's numbers raw instead of folding them
/// into plausible ranges; bit 3: the segment's header disagrees with the announcement),
/// four words of announcement (slots, slot size, largest message, header length) and one
/// of file-size error, then 8-byte words: first the slot area, then, round after round,
/// `written`, `closed`, a slot word's index and value, and the cursor page's detach mark.
pub fn fuzz_pubsub_reader(data: &[u8]) {
    use crate::pubsub::handshake::{Subscribed, POLICY_OVERWRITE};
    use crate::pubsub::segment::header_len;
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut words = rest.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    });
    let mut take = || words.next().unwrap_or(0);
    let hl = header_len() as u64;
    let raw = [take(), take(), take(), take()];
    let announced = if flags & 4 != 0 {
        raw
    } else {
        // Mostly-valid numbers, so the reading below runs often.
        let slots = 1 << (raw[0] % 6);
        let slot_size = 8 * (2 + raw[1] % 32);
        let max_msg = raw[2] % (slot_size - PAYLOAD_OFFSET as u64 + 2);
        let header = if raw[3] % 8 == 0 { raw[3] } else { hl };
        [slots, slot_size, max_msg, header]
    };
    let [slots, slot_size, max_msg, header] = announced;
    let policy_code = if flags & 2 != 0 {
        POLICY_BLOCK
    } else {
        POLICY_OVERWRITE
    };
    let ok = Subscribed {
        slot: 0,
        policy: policy_code,
        slots,
        slot_size,
        max_msg,
        header_len: header,
        start: 0,
    };
    // The file: what the announcement implies, off by a fuzzed amount now and then.
    let error = take();
    let in_header = if flags & 8 != 0 { raw } else { announced };
    let Some((topic, writer, file)) = fuzz_topic(policy_code, announced, in_header, error) else {
        return;
    };
    let base = writer.base().as_ptr();
    let Ok((seg, policy)) = crate::pubsub::shm_subscriber::attach_topic(&ok, &topic) else {
        return; // refused: the outcome a lying announcement must have
    };
    let geom = seg.geometry();
    assert!(geom.valid());
    assert_eq!(hl as usize + geom.data_len(), file);
    let (Ok((bell, _)), Ok((page, _))) = (
        BellSegment::create("fuzz-bell"),
        CursorSegment::create("fuzz-cursor"),
    ) else {
        return;
    };
    let header = hl as usize;
    let slot_words = geom.data_len() / 8;
    let write = |off: usize, v: u64| {
        // SAFETY: every offset used below lies inside the writable mapping of the
        // segment (the header page or the slot area, which `attach_topic` matched to
        // the file's size), 8-aligned.
        unsafe { base.add(off).cast::<u64>().write_volatile(v) }
    };
    for i in 0..slot_words {
        let Some(w) = words.next() else { break };
        write(header + i * 8, w);
    }
    let page_base = page.base().as_ptr();
    let (ours, theirs) = socket::seqpacket_pair().expect("socketpair");
    let _peer = (flags & 1 == 0).then_some(theirs);
    let mut sub = PubSubscriber::over(seg, bell, page, ours, policy, geom.max_msg);
    let mut buf = vec![0u8; geom.max_msg.min(256)];
    for _ in 0..64 {
        let mut step = || words.next();
        if let Some(written) = step() {
            write(crate::pubsub::segment::WRITTEN_OFFSET, written);
        }
        if let Some(closed) = step() {
            write(crate::pubsub::segment::CLOSED_OFFSET, closed & 1);
        }
        if let (Some(at), Some(v)) = (step(), step()) {
            write(header + (at as usize % slot_words) * 8, v);
        }
        if let Some(mark) = step() {
            // SAFETY: the detach mark lies in the mapped cursor page, 4-aligned.
            unsafe {
                page_base
                    .add(crate::pubsub::ring::CursorPage::DETACHED_OFFSET)
                    .cast::<u32>()
                    .write_volatile(mark as u32 & 1)
            };
        }
        match sub.recv(&mut buf) {
            Ok(n) => assert!(n <= geom.max_msg),
            Err(e) => match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::Lagged | ErrorKind::MessageTooLarge => {}
                _ => break,
            },
        }
    }
}

/// Fuzz entry point: the subscriber's side of the subscribe handshake against a hostile
/// or broken publisher. The answer packet (`Subscribed`, or `Upgraded` to an `auto:`
/// subscriber), its numbers, the descriptors that travel with it and what they hold all
/// come from the input; the subscriber must refuse, or come up consistent with what it
/// asked for — never panic, hang or map past a file's end.
///
/// Layout of `data`: 1 byte of flags (bit 0: the subscriber upgrades with a token and
/// the answer is `Upgraded`; bit 1: the proof is wrong; bit 2: the numbers are raw
/// instead of folded into plausible ranges; bit 3: the topic header disagrees with the
/// answer; bits 4–5: descriptors sent (3, 3, 2 or 4); bit 6: the answer is the raw rest
/// of the input instead of a packet built from the words; bit 7: the cursor page starts
/// elsewhere than the answer says), then words: slot, policy, slots, slot size, largest
/// message, header length, start, file-size error, the subscriber's own message limit.
pub fn fuzz_pubsub_handshake(data: &[u8]) {
    pubsub_handshake_accepted(data);
}

/// [`fuzz_pubsub_handshake`]; returns whether the subscriber accepted the answer.
fn pubsub_handshake_accepted(data: &[u8]) -> bool {
    use crate::pubsub::handshake::{Subscribed, POLICY_OVERWRITE};
    use crate::pubsub::segment::header_len;
    let Some((&flags, rest)) = data.split_first() else {
        return false;
    };
    let mut words = rest.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    });
    let mut take = || words.next().unwrap_or(0);
    let raw = [take(), take(), take(), take(), take(), take(), take()];
    let (error, limit) = (take(), take());
    let hl = header_len() as u64;
    let built = if flags & 4 != 0 {
        Subscribed {
            slot: raw[0] as u32,
            policy: raw[1] as u32,
            slots: raw[2],
            slot_size: raw[3],
            max_msg: raw[4],
            header_len: raw[5],
            start: raw[6],
        }
    } else {
        let slot_size = 8 * (2 + raw[3] % 32);
        Subscribed {
            slot: (raw[0] % 80) as u32,
            policy: [POLICY_BLOCK, POLICY_OVERWRITE, 0, 3][raw[1] as usize % 4],
            slots: 1 << (raw[2] % 6),
            slot_size,
            max_msg: raw[4] % (slot_size - PAYLOAD_OFFSET as u64 + 2),
            header_len: if raw[5] % 8 == 0 { raw[5] } else { hl },
            start: raw[6] % 4096,
        }
    };
    let (token, proof) = ([0x5a; 16], [0xa5; 16]);
    let upgrade = (flags & 1 != 0).then_some((token, proof));
    let packet = if flags & 64 != 0 {
        rest[..rest.len().min(SUB_MAX_PACKET)].to_vec()
    } else if upgrade.is_some() {
        let sent = if flags & 2 != 0 { token } else { proof };
        SubPacket::Upgraded(built, sent).encode()
    } else {
        SubPacket::Subscribed(built).encode()
    };
    // The descriptors describe what the packet announces, where it parses.
    let ok = match SubPacket::decode(&packet) {
        Ok(SubPacket::Subscribed(ok) | SubPacket::Upgraded(ok, _)) => ok,
        _ => built,
    };
    let announced = [ok.slots, ok.slot_size, ok.max_msg, ok.header_len];
    let in_header = if flags & 8 != 0 {
        [raw[2], raw[3], raw[4], raw[5]]
    } else {
        announced
    };
    let Some((topic, _map, _file)) = fuzz_topic(ok.policy, announced, in_header, error) else {
        return false;
    };
    let (Ok((_bell, bell_fd)), Ok((page, page_fd))) = (
        BellSegment::create("fuzz-bell"),
        CursorSegment::create("fuzz-cursor"),
    ) else {
        return false;
    };
    page.get()
        .init(ok.start.wrapping_add((flags >> 7) as u64 * (1 + error % 7)));
    let fds = [topic.as_raw_fd(), bell_fd.as_raw_fd(), page_fd.as_raw_fd()];
    let fds: &[_] = match (flags >> 4) & 3 {
        2 => &fds[..2],
        3 => &[fds[0], fds[1], fds[2], fds[2]],
        _ => &fds,
    };
    let (ours, theirs) = socket::seqpacket_pair().expect("socketpair");
    if socket::send_with_fds(theirs.as_fd(), &packet, fds).is_err() {
        return false;
    }
    let opts = crate::PubSubOptions {
        max_msg_size: (limit % 4 == 0).then_some((limit >> 2) as usize % 512),
        ..Default::default()
    };
    // The answer is already queued: the deadline only bounds a bug.
    let deadline = Instant::now() + Duration::from_secs(10);
    let Ok(mut sub) = PubSubscriber::handshake_on(ours, "shm:fuzz", upgrade, &opts, deadline)
    else {
        return false; // refused: the outcome a bad answer must have
    };
    // Accepted: only what this subscriber asked for and what the kernel vouches for.
    assert!(sub.slot() < crate::pubsub::MAX_SUBSCRIBERS);
    assert_eq!(sub.position(), ok.start);
    assert!(sub.position() <= crate::pubsub::ring::MAX_POSITION);
    if let Some(max) = opts.max_msg_size {
        assert!(sub.max_msg_size() <= max);
    }
    if upgrade.is_some() {
        assert!(
            flags & 2 == 0 || flags & 64 != 0,
            "a wrong proof was accepted"
        );
    }
    sub.set_nonblocking(true);
    let mut buf = vec![0u8; sub.max_msg_size().min(256)];
    for _ in 0..4 {
        match sub.recv(&mut buf) {
            Ok(n) => assert!(n <= sub.max_msg_size()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => {}
        }
    }
    drop(theirs);
    true
}

/// A topic memfd as a fake publisher passes it: sized as `announced` implies (where that
/// is small enough to make), off by a fuzzed amount when `error % 4 == 0`, its header
/// naming `in_header` (which may disagree), sealed against resizing. Returns the memfd,
/// a writable mapping of it and its size.
fn fuzz_topic(
    policy: u32,
    announced: [u64; 4],
    in_header: [u64; 4],
    error: u64,
) -> Option<(OwnedFd, Region, usize)> {
    /// The largest topic file the fuzzers make (larger announcements must be refused
    /// before the file's size matters).
    const MAX_FILE: u64 = 1 << 20;
    let hl = crate::pubsub::segment::header_len() as u64;
    let [slots, slot_size, ..] = announced;
    let implied = slots
        .checked_mul(slot_size)
        .and_then(|n| n.checked_add(hl))
        .filter(|&n| n <= MAX_FILE)
        .unwrap_or(hl);
    let file = match error % 4 {
        0 => (implied as i64 + (error as i64 >> 2) % 4096).clamp(1, MAX_FILE as i64) as usize,
        _ => implied as usize,
    };
    let topic = memfd::create_unsealed("fuzz-topic", file).ok()?;
    let writer = Region::map(topic.as_fd(), file, true).ok()?;
    let [s, z, m, h] = in_header;
    let ident = crate::pubsub::segment::ident_bytes(policy, s, z, m, h);
    // SAFETY: the mapping is at least one byte; the header is copied only as far as the
    // file reaches, and nobody else maps it yet.
    unsafe {
        writer
            .base()
            .as_ptr()
            .copy_from_nonoverlapping(ident.as_ptr(), ident.len().min(file))
    };
    memfd::add_seals(topic.as_fd(), memfd::SEALS).ok()?;
    Some((topic, writer, file))
}

#[cfg(test)]
mod tests {
    /// The fuzz entry point over pseudo-random inputs in a debug build, where arithmetic
    /// overflow panics (fuzzing runs optimised, where it would wrap silently).
    #[test]
    fn pubsub_reader_survives_random_shared_memory() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..300 {
            let len = 1 + (next() % 2048) as usize;
            let data: Vec<u8> = (0..len)
                .map(|i| {
                    let v = next();
                    // Mostly small or structured values: the ones that pass naive checks.
                    match (round + i) % 4 {
                        0 => (v % 4) as u8,
                        1 => 0,
                        _ => v as u8,
                    }
                })
                .collect();
            super::fuzz_pubsub_reader(&data);
        }
    }

    /// The subscribe-handshake entry point accepts an honest answer (so the fuzzer
    /// reaches the accepting path), refuses a wrong upgrade proof, a missing descriptor
    /// and a cursor page that disagrees, and survives pseudo-random inputs in a debug
    /// build.
    #[test]
    fn pubsub_handshake_accepts_honest_answers_only() {
        // slot 0, block, 4 slots of 64 bytes, 10-byte messages, the real header length,
        // start 0, a file of the implied size, no limit of our own.
        let words = [0u64, 0, 2, 6, 10, 1, 0, 1, 1];
        let input = |flags: u8| -> Vec<u8> {
            std::iter::once(flags)
                .chain(words.iter().flat_map(|w| w.to_le_bytes()))
                .collect()
        };
        assert!(super::pubsub_handshake_accepted(&input(0)));
        assert!(super::pubsub_handshake_accepted(&input(1)), "upgraded");
        assert!(
            !super::pubsub_handshake_accepted(&input(1 | 2)),
            "wrong proof"
        );
        assert!(
            !super::pubsub_handshake_accepted(&input(2 << 4)),
            "2 descriptors"
        );
        assert!(
            !super::pubsub_handshake_accepted(&input(128)),
            "cursor elsewhere"
        );
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..300 {
            let mut data = input(next() as u8);
            let flips = next() % 4;
            for _ in 0..flips {
                let at = next() as usize % data.len();
                data[at] = next() as u8;
            }
            super::fuzz_pubsub_handshake(&data);
        }
    }
}
