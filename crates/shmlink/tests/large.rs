//! Large messages with the default options: 64 MiB messages (the default maximum) through
//! the default `shm:` ring (256 KiB per direction), both ways, blocking and non-blocking,
//! into a caller's buffer, into a new vector, read through `recv_ref` and written through
//! `reserve`/`commit`, on the kernel path (two mappings, as between processes) and the
//! in-process one. Then peers that lie about a split message's length in shared memory:
//! the receiver reports a protocol violation and never allocates more than its maximum or
//! writes past the caller's buffer.

mod common;

use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use shmlink::{Connection, ErrorKind, Options};
use shmlink_ring::spsc::{header_word, record_size, FLAG_FIRST, FLAG_MORE, TAIL_OFFSET};
use shmlink_testkit::HostilePeer;

/// The default largest message.
const BIG: usize = 64 << 20;
/// Messages per direction and way of receiving.
const COUNT: u64 = 2;

/// A `len`-byte message for `seq`: 8-byte words that depend on seq and their index, so a
/// lost, reordered, shifted or torn fragment shows.
fn message(seq: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for w in v.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// Compares without printing 64 MiB on failure: the first differing offset.
fn check(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!("{what}: differs at byte {at} of {}", want.len());
    }
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit` (a hang).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => {
            t.join().unwrap();
            v
        }
        Err(_) => match t.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("did not finish within {limit:?}"),
        },
    }
}

/// The ways a blocking receiver takes a message.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// `recv` into a buffer of exactly the message's size (fragments land in it).
    Into,
    /// `recv_vec` (reassembled).
    Vec,
    /// `recv_ref` (reassembled, read through the guard).
    Ref,
}

fn recv_one(conn: &mut Connection, way: Way, buf: &mut Vec<u8>) -> Vec<u8> {
    match way {
        Way::Into => {
            buf.resize(BIG, 0);
            buf.fill(0);
            let n = conn.recv(buf).unwrap();
            assert_eq!(n, BIG);
            std::mem::take(buf)
        }
        Way::Vec => conn.recv_vec().unwrap(),
        Way::Ref => conn.recv_ref().unwrap().bytes().to_vec(),
    }
}

/// Sends `msg` by `send`, or by `reserve`/`commit` (staged, then fragmented).
fn send_one(conn: &mut Connection, msg: &[u8], zero_copy: bool) {
    if zero_copy {
        let mut b = conn.reserve(msg.len()).unwrap();
        b.copy_from_slice(msg);
        b.commit().unwrap();
    } else {
        conn.send(msg).unwrap();
    }
}

/// Blocking, both ways: the client sends, the server takes each message one way and
/// echoes it (by `send` or `reserve`), the client takes the echo another way.
fn blocking_both_ways(transport: &str, opts: Options) {
    assert_eq!(opts.configured_max_msg_size(), BIG, "default maximum");
    let (mut c, mut s) = pair_with(transport, &opts);
    let ways = [Way::Into, Way::Vec, Way::Ref];
    let server = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for (i, way) in ways.iter().enumerate() {
            for k in 0..COUNT {
                let seq = i as u64 * COUNT + k;
                let got = recv_one(&mut s, *way, &mut buf);
                check(&format!("server, {way:?} {seq}"), &got, &message(seq, BIG));
                send_one(&mut s, &got, k % 2 == 1);
                buf = got;
            }
        }
        s
    });
    let mut buf = Vec::new();
    for (i, _) in ways.iter().enumerate() {
        for k in 0..COUNT {
            let seq = i as u64 * COUNT + k;
            let want = message(seq, BIG);
            send_one(&mut c, &want, k % 2 == 0);
            let back = ways[(i + 1) % ways.len()];
            let got = recv_one(&mut c, back, &mut buf);
            check(&format!("client, {back:?} {seq}"), &got, &want);
            buf = got;
        }
    }
    // A message over the default maximum is refused by the sender, which stays usable.
    let err = c.send(&vec![0u8; BIG + 1]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MessageTooLarge);
    let mut s = server.join().unwrap();
    c.send(b"after").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"after");
}

/// Non-blocking, both ways, one thread driving both ends as an event loop would: each
/// end sends a 64 MiB message (accepted at once, its rest kept back and pushed on by the
/// sender's later calls), and receives the other's, waiting on the fds when neither
/// moves.
fn nonblocking_both_ways(transport: &str, opts: Options) {
    let (mut c, mut s) = pair_with(transport, &opts);
    c.set_nonblocking(true);
    s.set_nonblocking(true);
    let deadline = Instant::now() + Duration::from_secs(120);
    for seq in 0..COUNT {
        let (to_s, to_c) = (message(100 + seq, BIG), message(200 + seq, BIG));
        c.send(&to_s).unwrap();
        s.send(&to_c).unwrap();
        let (mut at_s, mut at_c) = (None, None);
        while at_s.is_none() || at_c.is_none() {
            assert!(Instant::now() < deadline, "non-blocking exchange stalled");
            let mut moved = false;
            for (conn, slot) in [(&mut s, &mut at_s), (&mut c, &mut at_c)] {
                match conn.recv_vec() {
                    // Each end's call also pushes on its own kept-back rest.
                    Ok(m) => {
                        assert!(slot.is_none(), "one message each way");
                        *slot = Some(m);
                        moved = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("recv: {e}"),
                }
            }
            if !moved {
                let (fc, fs) = (c.as_raw_fd(), s.as_raw_fd());
                let _ = readable_within(fc, 5) || readable_within(fs, 5);
            }
        }
        check("server, non-blocking", &at_s.unwrap(), &to_s);
        check("client, non-blocking", &at_c.unwrap(), &to_c);
    }
    // Both ends are usable afterwards, in blocking mode too.
    c.set_nonblocking(false);
    s.set_nonblocking(false);
    c.send(b"done").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"done");
}

#[test]
fn sixty_four_mib_blocking_kernel_path() {
    within(Duration::from_secs(300), || {
        blocking_both_ways("shm", kernel_opts())
    });
}

#[test]
fn sixty_four_mib_blocking_in_process() {
    within(Duration::from_secs(300), || {
        blocking_both_ways("inproc", Options::default())
    });
}

#[test]
fn sixty_four_mib_nonblocking_kernel_path() {
    within(Duration::from_secs(300), || {
        nonblocking_both_ways("shm", kernel_opts())
    });
}

#[test]
fn sixty_four_mib_nonblocking_in_process() {
    within(Duration::from_secs(300), || {
        nonblocking_both_ways("inproc", Options::default())
    });
}

/// The largest message a connection accepts (`max_msg_size` at its limit, 1 GiB), once,
/// through the default ring into a caller's buffer. Ignored by default: it needs about
/// 3 GiB of memory; `scripts/test.sh --long` runs it (`cargo test --release -p shmlink
/// --test large -- --ignored`).
#[test]
#[ignore = "needs ~3 GiB of memory; scripts/test.sh --long runs it"]
fn one_gib_at_the_largest_maximum() {
    within(Duration::from_secs(600), || {
        const GIB: usize = shmlink::options::MAX_MSG_SIZE_LIMIT;
        let opts = kernel_opts().max_msg_size(GIB);
        let (mut c, mut s) = pair_with("shm", &opts);
        let want = std::sync::Arc::new(message(1, GIB));
        let w = want.clone();
        let sender = std::thread::spawn(move || c.send(&w).unwrap());
        let mut buf = vec![0u8; GIB];
        assert_eq!(s.recv(&mut buf).unwrap(), GIB);
        sender.join().unwrap();
        check("1 GiB", &buf, &want);
    });
}

/// A ring `large_messages` sized: a 1 MiB message is one record, read in place.
#[test]
fn large_messages_preset_keeps_a_megabyte_in_one_record() {
    within(Duration::from_secs(120), || {
        let opts = kernel_opts().large_messages(1 << 20);
        assert!(opts.configured_ring_size() >= 2 * ((1 << 20) + 16));
        assert_eq!(opts.configured_max_msg_size(), BIG);
        let (mut c, mut s) = pair_with("shm", &opts);
        let want = message(7, 1 << 20);
        let sender = {
            let want = want.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let mut b = c.reserve(want.len()).unwrap();
                    b.copy_from_slice(&want);
                    b.commit().unwrap();
                }
                c
            })
        };
        for _ in 0..3 {
            let m = s.recv_ref().unwrap();
            // In the ring, not reassembled: the bytes are not this process's own.
            assert!(m.bytes().as_local().is_none(), "reassembled");
            check("in place", &m.bytes().to_vec(), &want);
        }
        sender.join().unwrap();
    });
}

/// On the preset, a copying `send` of a message larger than a fragment goes in fragments
/// from the ring's start when the receiver has taken everything (it copies one while the
/// sender writes the next), and whole when the receiver is behind. Every way of
/// receiving gets the same bytes either way; `recv_ref` shows which one came.
#[test]
fn large_messages_preset_splits_a_send_only_for_a_waiting_receiver() {
    within(Duration::from_secs(120), || {
        let opts = kernel_opts().large_messages(1 << 20);
        let (mut c, mut s) = pair_with("shm", &opts);
        let msgs: Vec<Vec<u8>> = (0..4).map(|i| message(i, 1 << 20)).collect();
        // Taken one at a time: each finds the ring empty, and every other one restarts at
        // its start behind a skip record (all fragments fit before the previous ones).
        let mut buf = vec![0u8; 2 << 20];
        for way in [Way::Into, Way::Vec, Way::Ref] {
            for (i, want) in msgs.iter().enumerate() {
                c.send(want).unwrap();
                match way {
                    // Fragments land in the buffer (it may be larger than the message).
                    Way::Into => {
                        buf.fill(0);
                        let n = s.recv(&mut buf).unwrap();
                        check("split, recv", &buf[..n], want);
                    }
                    Way::Vec => check("split, recv_vec", &s.recv_vec().unwrap(), want),
                    Way::Ref => {
                        let m = s.recv_ref().unwrap();
                        assert!(m.bytes().as_local().is_some(), "{i}: not split");
                        check("split, recv_ref", &m.bytes().to_vec(), want);
                    }
                }
            }
        }
        // Two in a row: the first finds the ring empty (split), the second finds the
        // receiver behind (one record, read in place).
        c.send(&msgs[0]).unwrap();
        c.send(&msgs[1]).unwrap();
        let m = s.recv_ref().unwrap();
        assert!(m.bytes().as_local().is_some(), "the first is split");
        check("first", &m.bytes().to_vec(), &msgs[0]);
        drop(m);
        let m = s.recv_ref().unwrap();
        assert!(m.bytes().as_local().is_none(), "the second is one record");
        check("second", &m.bytes().to_vec(), &msgs[1]);
    });
}

/// The preset gives 64 KiB messages a 1 MiB ring, and the two ways of sending use it
/// differently: a copying `send` to a receiver that does not read runs no further ahead
/// than half the level-2 cache or four messages (its copies would land in lines no cache
/// holds any more by the time the receiver copies them out), `reserve` (written in place)
/// fills the ring, and so does a copying `send` on a ring of the same size that the user
/// asked for with `ring_size` (a buffer). Non-blocking, each stops with `WouldBlock`;
/// every message then arrives once, in order, intact.
#[test]
fn a_copying_send_runs_less_far_ahead_than_reserve() {
    within(Duration::from_secs(120), || {
        const LEN: usize = 64 << 10;
        let opts = kernel_opts().large_messages(LEN);
        assert_eq!(opts.configured_ring_size(), 1 << 20);
        // Sends on a fresh connection until the ring refuses, then takes every message:
        // how many went.
        let fill = |opts: &Options, zero_copy: bool| -> usize {
            let (mut c, mut s) = pair_with("shm", opts);
            c.set_nonblocking(true);
            let mut sent = Vec::new();
            loop {
                let msg = message(sent.len() as u64, LEN);
                let r = if zero_copy {
                    c.reserve(LEN).and_then(|mut b| {
                        b.copy_from_slice(&msg);
                        b.commit()
                    })
                } else {
                    c.send(&msg)
                };
                match r {
                    Ok(()) => sent.push(msg),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => panic!("send: {e}"),
                }
                assert!(sent.len() <= 16, "more than the ring holds");
            }
            for want in &sent {
                check("sent", &s.recv_vec().unwrap(), want);
            }
            sent.len()
        };
        let (copied, in_place) = (fill(&opts, false), fill(&opts, true));
        // A ring the user sized is a buffer: a copying send fills it too.
        let buffer = fill(&kernel_opts().ring_size(1 << 20), false);
        let l2 = shmlink_sys::cache::l2_size().unwrap_or(512 << 10);
        let ahead = (l2 / 2).max(4 * (LEN + 16));
        assert!(copied >= 3, "copied {copied}");
        assert!(
            copied * LEN < ahead,
            "copied {copied}, {ahead} bytes ahead at most"
        );
        assert!(in_place >= 14, "in place {in_place}, copied {copied}");
        assert!(buffer >= 14, "into a ring of the user's size {buffer}");
        if ahead < 1 << 20 {
            assert!(in_place > copied, "in place {in_place}, copied {copied}");
        }
    });
}

/// On the default ring, a copying `send` to a waiting receiver is cut into equal
/// fragments from two of the smallest pipeline fragments (16 KiB) on: a 64 KiB message
/// used to go as one record of 64 KiB - 16 bytes and a 16-byte sliver. Shorter messages
/// go whole. Every way of receiving gets the same bytes, into a buffer of exactly the
/// message's size or a larger one (fragments land in it either way); `recv_ref` shows
/// which way the message came. The sender receives on the same thread: a 200 KiB
/// message, larger than one record, must fit the empty 256 KiB ring at once (its
/// fragments used to restart at the ring's start one by one, behind a skip that left no
/// room for the last, and the send waited forever).
#[test]
fn default_ring_cuts_a_message_for_a_waiting_receiver_into_equal_fragments() {
    within(Duration::from_secs(60), || {
        let (mut c, mut s) = pair_with("shm", &kernel_opts());
        for len in [30 << 10, 32 << 10, 40 << 10, 64 << 10, 100_000, 200 << 10] {
            let want = message(len as u64, len);
            for (way, extra) in [
                (Way::Into, 0),
                (Way::Into, 4096),
                (Way::Vec, 0),
                (Way::Ref, 0),
            ] {
                c.send(&want).unwrap();
                match way {
                    Way::Into => {
                        let mut buf = vec![0u8; len + extra];
                        let n = s.recv(&mut buf).unwrap();
                        check(&format!("{len}, recv"), &buf[..n], &want);
                    }
                    Way::Vec => check(&format!("{len}, recv_vec"), &s.recv_vec().unwrap(), &want),
                    Way::Ref => {
                        let m = s.recv_ref().unwrap();
                        let split = m.bytes().as_local().is_some();
                        assert_eq!(split, len >= 32 << 10, "{len}: split {split}");
                        check(&format!("{len}, recv_ref"), &m.bytes().to_vec(), &want);
                    }
                }
            }
        }
    });
}

// --- hostile lengths ----------------------------------------------------------------

/// The hostile peer's ring (client → server) and the victim's maximum.
const RING: usize = 4096;
const MAX: usize = 1 << 20;
/// The producer block's `tail` word in the hostile peer's segment header.
const TAIL: usize = 128 + TAIL_OFFSET;

/// A record a hostile peer writes: flags, the total-length prefix of a first fragment (if
/// any) and the payload length after it.
type Rec = (u32, Option<u64>, usize);

/// Writes `records` into the peer's ring from position 0, publishes them and rings the
/// doorbell.
fn publish(peer: &HostilePeer, records: &[Rec]) {
    let mut pos = 0usize;
    for &(flags, total, len) in records {
        let full = len + total.map_or(0, |_| 8);
        peer.poke_ring(0, pos, header_word(pos as u64, full, flags));
        if let Some(t) = total {
            peer.poke_ring(0, pos + 8, t);
        }
        // Payload words: something recognisable.
        for w in (8 + total.map_or(0, |_| 8)..8 + full).step_by(8) {
            peer.poke_ring(0, pos + w, 0x4141_4141_4141_4141);
        }
        pos += record_size(full);
        assert!(pos + 8 <= RING, "records do not fit the test ring");
    }
    peer.poke_header(TAIL, pos as u64);
    peer.doorbell();
}

/// Each lie, received by `recv` into a buffer (fragments straight into it) and by
/// `recv_vec` (reassembly): a protocol violation, and the bytes around the caller's
/// buffer untouched.
#[test]
fn lying_split_message_lengths_are_violations() {
    let opts = kernel_opts().ring_size(RING).max_msg_size(MAX);
    let (mut l, addr) = bind("shm", &opts);
    let frag = 1000; // bytes per fragment: records of ~1 KiB in the 4 KiB ring
    let lies: [(&str, Vec<Rec>); 6] = [
        (
            "total u64::MAX",
            vec![(FLAG_FIRST | FLAG_MORE, Some(u64::MAX), frag)],
        ),
        (
            "total one over the maximum",
            vec![(FLAG_FIRST | FLAG_MORE, Some(MAX as u64 + 1), frag)],
        ),
        (
            "total smaller than the first fragment",
            vec![(FLAG_FIRST | FLAG_MORE, Some(10), frag)],
        ),
        (
            "fragments exceed the total",
            vec![
                (FLAG_FIRST | FLAG_MORE, Some(2500), frag),
                (FLAG_MORE, None, frag),
                (FLAG_MORE, None, frag),
            ],
        ),
        (
            "last fragment short of the total",
            vec![(FLAG_FIRST | FLAG_MORE, Some(3000), frag), (0, None, frag)],
        ),
        (
            "a second first fragment inside a message",
            vec![
                (FLAG_FIRST | FLAG_MORE, Some(3000), frag),
                (FLAG_FIRST | FLAG_MORE, Some(3000), frag),
            ],
        ),
    ];
    for (what, records) in lies {
        for into in [true, false] {
            let a = addr.clone();
            let peer = std::thread::spawn(move || HostilePeer::connect(&a, RING).unwrap());
            let mut victim = l.accept().unwrap();
            let peer = peer.join().unwrap();
            publish(&peer, &records);
            // `recv` gets a buffer of the claimed size where that is plausible (larger
            // than one record: fragments land in it), else one of 3000 bytes; guard bytes
            // follow it.
            let claimed = match records[0].1 {
                Some(t) if t as usize <= MAX && t as usize > frag => t as usize,
                _ => 3000,
            };
            let (err, guard_ok) = within(Duration::from_secs(30), move || {
                let mut space = vec![0x5au8; MAX + 4096];
                let r = if into {
                    victim.recv(&mut space[..claimed]).map(drop)
                } else {
                    victim.recv_vec().map(drop)
                };
                let guard_ok = space[claimed..].iter().all(|&b| b == 0x5a);
                drop(peer);
                (r.map_err(|e| (e.kind(), e.to_string())), guard_ok)
            });
            let (kind, msg) = err.expect_err(&format!("{what}: accepted"));
            assert_eq!(
                kind,
                ErrorKind::ProtocolViolation,
                "{what} (recv into a buffer: {into}): {msg}"
            );
            assert!(guard_ok, "{what}: written past the caller's buffer");
        }
    }
}
