//! The hooks into the library's internals that its tests, fuzz targets and the test kit
//! (`crates/shmlink-testkit`, where the skips, raw clients, fake listeners and hostile
//! `shm:` peers live) cannot do without: the handshake packets, the raw `shm:` segment
//! layout ([`RawSegment`]), the pub/sub fakes ([`FakeTopic`], [`HostileSubscriber`],
//! built on the topic's private layout), the doorbell counters and the fuzz entry
//! points. Cargo feature `testing`, hidden from the docs: not part of the API, it changes
//! without notice.

use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use crate::addr::{Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::WaitPolicy;
use crate::ring::FenceMode;
use crate::ring::{CLOSED_OFFSET, TAIL_OFFSET};
use crate::sys::socket;
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

/// This kernel's boot id, as an `auto:` client sends it.
pub fn boot_id() -> Vec<u8> {
    crate::transport::local::boot_id()
}

pub(crate) fn socket_path(addr: &str) -> Result<UnixName> {
    match Address::parse(addr)? {
        Address::Shm { socket, .. } => Ok(socket),
        other => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{other} is not a shm: address"),
        )),
    }
}

/// The layout version of `shm:` segments this build writes.
pub const SEGMENT_VERSION: u32 = segment::SEG_VERSION;

/// The largest `shm:` handshake packet (a receive buffer of this size takes any).
pub const MAX_HANDSHAKE_PACKET: usize = MAX_PACKET;

/// Bytes of a `shm:` segment's header page (the rings' control blocks and the CPU slot;
/// the ring's data follows it).
pub fn segment_header_len() -> usize {
    segment::header_len()
}

/// Offset of the producer's control block (`tail`, end mark, sleep announcement) in a
/// segment's header page; add `shmlink_ring::spsc::TAIL_OFFSET` and the like.
pub const SEGMENT_PRODUCER_OFFSET: usize = PRODUCER_OFFSET;
/// Offset of the consumer's control block (`head`, sleep announcement) in a segment's
/// header page.
pub const SEGMENT_CONSUMER_OFFSET: usize = CONSUMER_OFFSET;

/// One side's half of a `shm:` segment, mapped, as the transport lays it out: for the
/// test kit's fake and hostile peers, which write it raw. A listener's half (`server`)
/// or a client's, with a ring of `ring_size` bytes.
pub struct RawSegment(Half);

impl RawSegment {
    fn side(server: bool) -> Side {
        if server {
            Side::Server
        } else {
            Side::Client
        }
    }

    /// Creates a half and seals it as the transport does; returns it mapped read-write
    /// and its memfd.
    pub fn create(server: bool, ring_size: usize) -> Result<(RawSegment, OwnedFd)> {
        Half::create(Self::side(server), ring_size).map(|(h, fd)| (RawSegment(h), fd))
    }

    /// [`create`](Self::create) without the seals (the caller adds its own).
    pub fn create_unsealed(server: bool, ring_size: usize) -> Result<(RawSegment, OwnedFd)> {
        Half::create_unsealed(Self::side(server), ring_size).map(|(h, fd)| (RawSegment(h), fd))
    }

    /// Maps a half received from a peer, read-only, checking it as the transport does.
    pub fn attach(fd: &OwnedFd, server: bool, ring_size: usize) -> Result<RawSegment> {
        Half::attach(fd, Self::side(server), ring_size).map(RawSegment)
    }

    /// The start of the mapping: the header page, then the ring's data.
    pub fn base(&self) -> NonNull<u8> {
        self.0.base()
    }

    /// The ring's data area and its size.
    pub fn ring_data(&self) -> (NonNull<u8>, usize) {
        self.0.ring_data()
    }
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

/// A fuzz input's 8-byte little-endian words, the last one padded with zeros.
fn fuzz_words(rest: &[u8]) -> impl Iterator<Item = u64> + '_ {
    rest.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    })
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
    let mut words = fuzz_words(rest);
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
        sock_nonblocking: None,
        bell: None,
        wait: WaitPolicy::BLOCKING,
        max_send: answer.max_msg.min(1 << 16) as usize,
        max_recv: 1 << 16,
        copy_ahead: false,
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

mod pubsub;
pub use pubsub::{fuzz_pubsub_handshake, fuzz_pubsub_reader, FakeTopic, HostileSubscriber};
