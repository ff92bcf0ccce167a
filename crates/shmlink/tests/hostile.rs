//! Hostile peers on `shm:`: a client that scribbles over everything it can write (its own
//! segment) and tries to write the listener's, clients that send malformed handshakes or
//! segments, and listeners that answer with broken segments. The honest side must report
//! an error, never crash, hang or read outside its mapping, and a listener must keep
//! serving.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use shmlink::{Connection, ErrorKind, Listener, Options};
use shmlink_testkit::{
    fake_listener, memfd, raw_handshake, raw_handshake_with_fds, raw_segment_handshake,
    segment_memfd, segment_memfd_with, silent_client, AfterAnswer, HandshakePacket as Packet,
    HandshakeParams as Params, HostilePeer, RefuseCode, FEATURE_PIPE_BELL, SEGMENT_VERSION,
    VERSION,
};

const RING: usize = 4096;
/// The seals a genuine segment carries.
const OWNER_SEALS: libc::c_int =
    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL | libc::F_SEAL_FUTURE_WRITE;
/// The same without `F_SEAL_FUTURE_WRITE`: the creator's peer could map it writable.
const RESIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// A segment's header page (the ring follows it).
const HEADER: usize = 4096;
/// The header word at byte 8: the layout version (low half) and header length.
fn version_word(version: u32) -> (usize, u64) {
    (8, version as u64 | (HEADER as u64) << 32)
}

fn small_opts() -> Options {
    kernel_opts().ring_size(RING).max_msg_size(1 << 20)
}

/// A listener and, per call, a (victim, hostile peer) pair connected through it.
fn hostile_pair(l: &mut Listener, addr: &str) -> (Connection, HostilePeer) {
    let a = addr.to_string();
    let peer = std::thread::spawn(move || HostilePeer::connect(&a, RING).unwrap());
    let victim = l.accept().unwrap();
    (victim, peer.join().unwrap())
}

#[test]
fn scribbling_peer_gets_protocol_violations_never_a_crash() {
    let (mut l, addr) = bind("shm", &small_opts());
    let mut seed = 0x5eed_1234_u64;
    let mut violations = 0;
    for round in 0..300 {
        let (mut victim, peer) = hostile_pair(&mut l, &addr);
        victim.set_nonblocking(true);
        peer.scribble(&mut seed, 1 + round % 16);
        peer.doorbell();
        for i in 0..40 {
            let results = [
                victim.recv_vec().map(drop),
                victim.send(&payload(i, 100 + round)),
            ];
            for r in results {
                match r.map_err(|e| e.kind()) {
                    Ok(()) | Err(ErrorKind::WouldBlock) => {}
                    Err(ErrorKind::ProtocolViolation) => violations += 1,
                    Err(ErrorKind::EndOfStream | ErrorKind::ConnectionReset) => {}
                    Err(other) => panic!("round {round}: unexpected {other:?}"),
                }
            }
        }
    }
    assert!(violations > 0, "no scribble was ever detected");
    // The listener is unharmed.
    let (mut c, mut s) = {
        let a = addr.clone();
        let t = std::thread::spawn(move || Connection::connect(&a, &small_opts()).unwrap());
        let s = l.accept().unwrap();
        (t.join().unwrap(), s)
    };
    c.send(b"still fine").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"still fine");
}

#[test]
fn parked_receiver_wakes_with_a_violation() {
    let (mut l, addr) = bind("shm", &small_opts());
    let (mut victim, peer) = hostile_pair(&mut l, &addr);
    let (tx, rx) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        tx.send(victim.recv_vec().map(drop)).unwrap()
    });
    // Once the receiver has spun out and parked (asleep in the kernel, waiting on its
    // connection), corrupt its producer position.
    let tid = tid_rx.recv().unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || sleeps_waiting_for_io(tid)),
        "the receiver never parked"
    );
    assert!(
        rx.try_recv().is_err(),
        "the receiver returned with nothing sent"
    );
    peer.poke_header(128, 7); // the client → server ring's tail (ours): unaligned
    peer.doorbell();
    let r = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("receiver hung");
    assert_eq!(r.unwrap_err().kind(), ErrorKind::ProtocolViolation);
    t.join().unwrap();
}

/// Anything but a one-byte doorbell on the control socket (in transparent mode: bytes a
/// program wrote to a moved fd past the preload) breaks the connection for good, whether
/// the receiver is parked or polls: never drained and forgotten.
#[test]
fn a_packet_that_is_not_a_doorbell_breaks_the_connection() {
    let (mut l, addr) = bind("shm", &small_opts());
    for packet in [&b"raw bytes"[..], &[1, 1], &[7]] {
        let (mut victim, peer) = hostile_pair(&mut l, &addr);
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let r = victim.recv_vec().map(drop);
            tx.send(r.map_err(|e| e.kind())).unwrap();
            victim
        });
        peer.control(packet);
        let r = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("receiver hung");
        assert_eq!(r, Err(ErrorKind::ProtocolViolation), "{packet:?}");
        let mut victim = t.join().unwrap();
        victim.set_nonblocking(true);
        for _ in 0..3 {
            assert_eq!(
                victim.recv_vec().map(drop).map_err(|e| e.kind()),
                Err(ErrorKind::ProtocolViolation),
                "{packet:?}: the connection stays broken"
            );
        }
    }
}

#[test]
fn peer_cannot_resize_or_reseal_the_segment() {
    let (mut l, addr) = bind("shm", &small_opts());
    let (mut victim, peer) = hostile_pair(&mut l, &addr);
    let fd = peer.memfd().as_raw_fd();
    let size = peer.file_size();
    for len in [0, 4096, size as i64 * 2] {
        // SAFETY: plain integer arguments on an open descriptor.
        let r = unsafe { libc::ftruncate(fd, len) };
        assert_eq!(r, -1, "ftruncate to {len} succeeded");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EPERM)
        );
    }
    // SAFETY: plain integer arguments on an open descriptor.
    let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
    assert_eq!(r, -1, "the seals were changed");
    victim.set_nonblocking(true);
    victim.send(b"x").unwrap();
}

/// The listener's segment reaches the client as a memfd sealed with
/// `F_SEAL_FUTURE_WRITE`: nothing the client can do with it gives it a writable mapping
/// (tried out of process memory: the attempts fail, nothing is written in-process).
#[test]
fn received_segment_cannot_be_made_writable() {
    let (mut l, addr) = bind("shm", &small_opts());
    let (_victim, peer) = hostile_pair(&mut l, &addr);
    let attempts = peer.attack_victim_segment();
    assert_eq!(attempts.len(), 6);
    for (what, r) in &attempts {
        let e = r
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{what} succeeded"));
        let errno = e.raw_os_error();
        match *what {
            "mmap read-write" | "pwrite" | "ftruncate" | "add F_SEAL_WRITE" => {
                assert_eq!(errno, Some(libc::EPERM), "{what}: {e}")
            }
            // A mapping without VM_MAYWRITE: mprotect says EACCES.
            "mprotect read-only mapping to read-write" => {
                assert_eq!(errno, Some(libc::EACCES), "{what}: {e}")
            }
            _ => assert!(errno.is_some(), "{what}: {e}"),
        }
    }
}

/// The old attack: while the listener fills a `SendBuf` in place, the client writes into
/// it (and into the listener's head and flags). Now the client can write only its own
/// segment: after it wrote everything it can and tried every way into the listener's,
/// the bytes being filled, the listener's head and its announcements are what the
/// listener put there, and the record arrives intact.
#[test]
fn hostile_peer_cannot_touch_a_sendbuf_or_the_victims_state() {
    let (mut l, addr) = bind("shm", &small_opts());
    let (mut victim, peer) = hostile_pair(&mut l, &addr);
    victim.set_nonblocking(true);
    // The listener's segment: header page, then its (server → client) ring.
    let head_at = 512; // its consumer block: head of the client → server ring
    let announced_at = 512 + 128; // and its sleep announcements
    let before = (peer.peek_victim(head_at), peer.peek_victim(announced_at));
    let pattern = payload(7, 256);
    let mut buf = victim.reserve(pattern.len()).unwrap();
    buf.copy_from_slice(&pattern);
    let mut seed = 0xfeed_u64;
    peer.scribble(&mut seed, 2000);
    for (what, r) in peer.attack_victim_segment() {
        assert!(r.is_err(), "{what} succeeded");
    }
    assert_eq!(
        &buf[..],
        &pattern[..],
        "the SendBuf changed under the writer"
    );
    buf.commit().unwrap();
    assert_eq!(
        (peer.peek_victim(head_at), peer.peek_victim(announced_at)),
        before,
        "the listener's head or announcements changed"
    );
    // The record as the client reads it: header word (length in the low 32 bits, the
    // rest flags and the position stamp), then the payload.
    assert_eq!(peer.peek_victim(HEADER) & 0xffff_ffff, pattern.len() as u64);
    let mut got = Vec::new();
    for off in (0..pattern.len()).step_by(8) {
        got.extend_from_slice(&peer.peek_victim(HEADER + 8 + off).to_le_bytes());
    }
    assert_eq!(got, pattern);
}

/// Handshake parameters: `ring`-byte rings both ways, messages up to 1 KiB.
fn params(features: u64, ring: u64) -> Params {
    Params {
        features,
        ring_c2s: ring,
        ring_s2c: ring,
        max_msg: 1024,
    }
}

/// A valid hello, as bytes.
fn hello(ring: u64) -> Vec<u8> {
    Packet::Hello(params(0, ring)).encode()
}

/// Checks that `reply` is a refusal with `code` and a reason (`what` names the case);
/// the reason.
fn expect_refusal(what: &str, reply: &[u8], code: RefuseCode) -> String {
    match Packet::decode(reply) {
        Ok(Packet::Refuse(c, reason)) => {
            assert_eq!(c, code, "{what}: {reason}");
            assert!(!reason.is_empty(), "{what}: refusal without a reason");
            reason
        }
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// A `shm:` listener with `handshake_timeout` that serves `clients` genuine clients
/// (an echo of one message each) on a thread; only genuine clients ever come out of
/// `accept`.
fn echo_listener(handshake_timeout: Duration, clients: usize) -> (JoinHandle<()>, String) {
    let (mut l, addr) = bind("shm", &small_opts().handshake_timeout(handshake_timeout));
    let served = std::thread::spawn(move || {
        for _ in 0..clients {
            let mut c = l.accept().unwrap();
            let m = c.recv_vec().unwrap();
            c.send(&m).unwrap();
        }
    });
    (served, addr)
}

/// A genuine client of `addr` gets `msg` echoed.
fn echoed(addr: &str, msg: &[u8]) {
    let mut c = Connection::connect(addr, &small_opts()).unwrap();
    c.send(msg).unwrap();
    assert_eq!(c.recv_vec().unwrap(), msg);
}

#[test]
fn malformed_handshakes_are_refused_and_the_listener_keeps_serving() {
    let (served, addr) = echo_listener(Duration::from_secs(30), 2);
    let mut wrong_version = hello(RING as u64);
    wrong_version[4..6].copy_from_slice(&(VERSION + 1).to_le_bytes());
    // Version 1 shared one segment written by both sides.
    let mut old_version = hello(RING as u64);
    old_version[4..6].copy_from_slice(&1u16.to_le_bytes());
    let mut next = xorshift(88172645463325252);
    let random: Vec<u8> = (0..64).map(|_| next() as u8).collect();
    let cases: Vec<(&str, Vec<u8>, RefuseCode)> = vec![
        ("random bytes", random, RefuseCode::Protocol),
        ("wrong version", wrong_version, RefuseCode::Version),
        ("old version", old_version, RefuseCode::Version),
        (
            "truncated",
            hello(RING as u64)[..20].to_vec(),
            RefuseCode::Protocol,
        ),
        ("oversized", vec![0x55; 8192], RefuseCode::Protocol),
        ("bad ring size", hello(5000), RefuseCode::Invalid),
        ("empty", vec![], RefuseCode::Protocol),
    ];
    let mut silent = Vec::new();
    for (what, bytes, code) in cases {
        if bytes.is_empty() {
            // A client that connects and says nothing must not hold up the others.
            silent.push(silent_client(&addr).unwrap());
            continue;
        }
        let (reply, fds) = raw_handshake(&addr, &bytes).unwrap();
        assert!(fds.is_empty(), "{what}: a refusal carried descriptors");
        expect_refusal(what, &reply, code);
        // The listener keeps serving genuine clients in between.
        if what == "wrong version" {
            echoed(&addr, b"hi");
        }
    }
    echoed(&addr, b"last");
    served.join().unwrap();
}

/// Connects to a fake listener that answers with `answer`; returns the client's error.
fn against_fake(
    answer: impl FnOnce(&[u8]) -> (Vec<u8>, Option<OwnedFd>) + Send + 'static,
) -> shmlink::Error {
    let addr = fresh_addr("shm");
    let fake = fake_listener(&addr, move |hello| {
        let (packet, fd) = answer(hello);
        (packet, fd.into_iter().collect())
    })
    .unwrap();
    let opts = small_opts().connect_timeout(Duration::from_millis(500));
    let err = Connection::connect(&addr, &opts).unwrap_err();
    fake.join().unwrap();
    err
}

/// A fake listener's scripted answer: the packet and the descriptor to send with it.
type Answer = Box<dyn FnOnce() -> (Vec<u8>, Option<OwnedFd>) + Send>;

fn accept_packet(ring: u64) -> Vec<u8> {
    Packet::Accept(params(0, ring)).encode()
}

#[test]
fn broken_listener_answers_are_rejected_by_the_client() {
    let ring = RING as u64;
    let cases: Vec<(&str, ErrorKind, Answer)> = vec![
        (
            "garbage",
            ErrorKind::ProtocolViolation,
            Box::new(|| (b"HTTP/1.1 200 OK".to_vec(), None)),
        ),
        (
            "version refusal",
            ErrorKind::VersionMismatch,
            Box::new(|| {
                (
                    Packet::Refuse(RefuseCode::Version, "v9 only".into()).encode(),
                    None,
                )
            }),
        ),
        (
            "accept without memfd",
            ErrorKind::ProtocolViolation,
            Box::new(move || (accept_packet(ring), None)),
        ),
        (
            "unsealed memfd",
            ErrorKind::ProtocolViolation,
            Box::new(move || {
                (
                    accept_packet(ring),
                    Some(memfd(HEADER + RING, false).unwrap()),
                )
            }),
        ),
        (
            "segment without F_SEAL_FUTURE_WRITE",
            ErrorKind::ProtocolViolation,
            Box::new(move || {
                (
                    accept_packet(ring),
                    Some(segment_memfd_with(true, RING, &[], RESIZE_SEALS).unwrap()),
                )
            }),
        ),
        (
            "a client's segment",
            ErrorKind::ProtocolViolation,
            Box::new(move || {
                (
                    accept_packet(ring),
                    Some(segment_memfd_with(false, RING, &[], OWNER_SEALS).unwrap()),
                )
            }),
        ),
        (
            "old segment version",
            ErrorKind::VersionMismatch,
            Box::new(move || {
                let old = version_word(SEGMENT_VERSION - 1);
                (
                    accept_packet(ring),
                    Some(segment_memfd_with(true, RING, &[old], OWNER_SEALS).unwrap()),
                )
            }),
        ),
        (
            "old protocol version",
            ErrorKind::VersionMismatch,
            Box::new(move || {
                let mut old = accept_packet(ring);
                old[4..6].copy_from_slice(&1u16.to_le_bytes());
                (old, Some(segment_memfd(RING).unwrap()))
            }),
        ),
        (
            "memfd too small",
            ErrorKind::ProtocolViolation,
            Box::new(move || (accept_packet(ring), Some(memfd(4096, true).unwrap()))),
        ),
        (
            "rings larger than asked for",
            ErrorKind::ProtocolViolation,
            Box::new(move || {
                (
                    accept_packet(ring * 2),
                    Some(segment_memfd(RING * 2).unwrap()),
                )
            }),
        ),
        (
            "segment header disagrees with the accept",
            ErrorKind::ProtocolViolation,
            Box::new(move || (accept_packet(ring / 2), Some(segment_memfd(RING).unwrap()))),
        ),
        (
            "not a memfd",
            ErrorKind::ProtocolViolation,
            Box::new(move || {
                let f = std::fs::File::open("/dev/null").unwrap();
                (accept_packet(ring), Some(OwnedFd::from(f)))
            }),
        ),
        (
            "no answer",
            ErrorKind::TimedOut,
            Box::new(|| (Vec::new(), None)),
        ),
    ];
    for (what, kind, answer) in cases {
        let err = against_fake(move |_hello| answer());
        assert_eq!(err.kind(), kind, "{what}: {err}");
        if what.contains("FUTURE_WRITE") {
            assert!(err.to_string().contains("future-write"), "{what}: {err}");
        }
    }
}

/// Pseudo-random numbers (xorshift64), the same sequence for the same seed.
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// A descriptor of a doorbell test's answer.
#[derive(Clone, Copy)]
enum End {
    /// The read end of fresh pipe `i`.
    R(usize),
    /// The write end of fresh pipe `i`.
    W(usize),
    /// `/dev/null`: not a pipe at all.
    Null,
}

/// The descriptors `ends` names, in order, of as many fresh pipes as they number (an end
/// named twice comes twice, duplicated); the ends not named are closed.
fn pipe_ends(ends: &[End]) -> Vec<OwnedFd> {
    let count = ends
        .iter()
        .map(|e| match e {
            End::R(i) | End::W(i) => i + 1,
            End::Null => 0,
        })
        .max()
        .unwrap_or(0);
    let pipes: Vec<(OwnedFd, OwnedFd)> = (0..count).map(|_| pipe()).collect();
    ends.iter()
        .map(|e| match *e {
            End::R(i) => pipes[i].0.try_clone().unwrap(),
            End::W(i) => pipes[i].1.try_clone().unwrap(),
            End::Null => OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
        })
        .collect()
}

/// A pipe: (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a writable array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just made and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Doorbell pipes (`FEATURE_PIPE_BELL`): the answer's descriptors after the memfd must be
/// exactly the client's read end, its write end of another pipe, and a read end of that
/// second pipe; anything else is a protocol violation with a message that says so.
#[test]
fn broken_doorbell_pipes_are_rejected_by_the_client() {
    use End::{Null, R, W};
    let cases: [(&str, u64, &str, &[End]); 8] = [
        ("no pipes", FEATURE_PIPE_BELL, "expected 4", &[]),
        (
            "pipes without the feature bit",
            0,
            "expected 1",
            &[R(0), W(0), R(1)],
        ),
        (
            "one pipe too many",
            FEATURE_PIPE_BELL,
            "expected 4",
            &[R(0), W(1), R(1), W(0)],
        ),
        (
            "not pipes",
            FEATURE_PIPE_BELL,
            "not a pipe",
            &[Null, Null, Null],
        ),
        (
            "a write end to sleep on",
            FEATURE_PIPE_BELL,
            "read end to sleep on",
            &[W(0), W(1), R(1)],
        ),
        (
            "a read end to ring",
            FEATURE_PIPE_BELL,
            "write end to ring",
            &[R(0), R(1), R(2)],
        ),
        (
            "a guard of another pipe",
            FEATURE_PIPE_BELL,
            "guard is not",
            &[R(0), W(1), R(2)],
        ),
        (
            "one pipe for both directions",
            FEATURE_PIPE_BELL,
            "one pipe for both",
            &[R(0), W(0), R(0)],
        ),
    ];
    for (what, features, says, ends) in cases {
        let packet = Packet::Accept(params(features, RING as u64)).encode();
        let addr = fresh_addr("shm");
        let fake = fake_listener(&addr, move |_hello| {
            let mut all = vec![segment_memfd(RING).unwrap()];
            all.extend(pipe_ends(ends));
            (packet, all)
        })
        .unwrap();
        let opts = small_opts().connect_timeout(Duration::from_millis(500));
        let err = Connection::connect(&addr, &opts).unwrap_err();
        fake.join().unwrap();
        assert_eq!(err.kind(), ErrorKind::ProtocolViolation, "{what}: {err}");
        assert!(err.to_string().contains(says), "{what}: {err}");
    }
}

#[test]
fn corrupted_segment_header_is_rejected() {
    let err = against_fake(|_| {
        let fd = segment_memfd_with(true, RING, &[(0, u64::MAX)], OWNER_SEALS).unwrap();
        (accept_packet(RING as u64), Some(fd))
    });
    assert_eq!(err.kind(), ErrorKind::ProtocolViolation, "{err}");
}

/// Everything wrong a client can send after the listener's answer, where its segment
/// belongs: each is refused with a reason and never comes out of `accept`, and the
/// listener keeps serving.
#[test]
fn broken_client_segments_are_refused() {
    let (served, addr) = echo_listener(Duration::from_secs(1), 1);
    let segment = || Packet::Segment.encode();
    let client = |ring: usize, pokes: &[(usize, u64)], seals| {
        segment_memfd_with(false, ring, pokes, seals).unwrap()
    };
    type Second = Box<dyn FnOnce(&OwnedFd) -> Option<(Vec<u8>, Vec<OwnedFd>)>>;
    let cases: Vec<(&str, Second, RefuseCode)> = vec![
        (
            "no descriptor",
            Box::new(move |_| Some((segment(), vec![]))),
            RefuseCode::Protocol,
        ),
        (
            "two descriptors",
            Box::new(move |_| {
                let two = vec![
                    client(RING, &[], OWNER_SEALS),
                    client(RING, &[], OWNER_SEALS),
                ];
                Some((segment(), two))
            }),
            RefuseCode::Protocol,
        ),
        (
            "unsealed",
            Box::new(move |_| Some((segment(), vec![memfd(HEADER + RING, false).unwrap()]))),
            RefuseCode::Protocol,
        ),
        (
            "without F_SEAL_FUTURE_WRITE",
            Box::new(move |_| Some((segment(), vec![client(RING, &[], RESIZE_SEALS)]))),
            RefuseCode::Protocol,
        ),
        (
            "wrong size",
            Box::new(move |_| Some((segment(), vec![client(2 * RING, &[], OWNER_SEALS)]))),
            RefuseCode::Protocol,
        ),
        (
            "the listener's own segment sent back",
            Box::new(move |theirs: &OwnedFd| Some((segment(), vec![theirs.try_clone().unwrap()]))),
            RefuseCode::Protocol,
        ),
        (
            "old segment version",
            Box::new(move |_| {
                Some((
                    segment(),
                    vec![client(
                        RING,
                        &[version_word(SEGMENT_VERSION - 1)],
                        OWNER_SEALS,
                    )],
                ))
            }),
            RefuseCode::Version,
        ),
        (
            "a hello instead",
            Box::new(move |_| Some((hello(RING as u64), vec![client(RING, &[], OWNER_SEALS)]))),
            RefuseCode::Protocol,
        ),
    ];
    for (what, second, code) in cases {
        let after = raw_segment_handshake(&addr, RING, second, Duration::from_secs(10)).unwrap();
        let AfterAnswer::Packet(reply) = after else {
            panic!("{what}: expected a refusal, got {after:?}");
        };
        let reason = expect_refusal(what, &reply, code);
        if what.contains("FUTURE_WRITE") {
            assert!(reason.contains("future-write"), "{what}: {reason}");
        }
    }
    // A client that never sends its segment is dropped at the handshake timeout (1 s).
    let after = raw_segment_handshake(&addr, RING, |_| None, Duration::from_secs(30)).unwrap();
    assert_eq!(after, AfterAnswer::Closed);
    echoed(&addr, b"still serving");
    served.join().unwrap();
}

/// A hello may carry the client's segment (design §5.1): everything wrong with it is
/// refused with a reason before the listener answers, nothing comes out of `accept`, and
/// the listener keeps serving.
#[test]
fn broken_segments_with_the_hello_are_refused() {
    let (served, addr) = echo_listener(Duration::from_secs(5), 1);
    let client = |ring: usize, pokes: &[(usize, u64)], seals| {
        segment_memfd_with(false, ring, pokes, seals).unwrap()
    };
    let cases: Vec<(&str, Vec<u8>, Vec<OwnedFd>, RefuseCode)> = vec![
        (
            "two descriptors",
            hello(RING as u64),
            vec![
                client(RING, &[], OWNER_SEALS),
                client(RING, &[], OWNER_SEALS),
            ],
            RefuseCode::Protocol,
        ),
        (
            "unsealed",
            hello(RING as u64),
            vec![memfd(HEADER + RING, false).unwrap()],
            RefuseCode::Protocol,
        ),
        (
            "without F_SEAL_FUTURE_WRITE",
            hello(RING as u64),
            vec![client(RING, &[], RESIZE_SEALS)],
            RefuseCode::Protocol,
        ),
        (
            "not the size the hello says",
            hello(RING as u64),
            vec![client(2 * RING, &[], OWNER_SEALS)],
            RefuseCode::Protocol,
        ),
        (
            "a listener's segment",
            hello(RING as u64),
            vec![segment_memfd_with(true, RING, &[], OWNER_SEALS).unwrap()],
            RefuseCode::Protocol,
        ),
        (
            "old segment version",
            hello(RING as u64),
            vec![client(
                RING,
                &[version_word(SEGMENT_VERSION - 1)],
                OWNER_SEALS,
            )],
            RefuseCode::Version,
        ),
        (
            "a query with a descriptor",
            Packet::Query.encode(),
            vec![client(RING, &[], OWNER_SEALS)],
            RefuseCode::Protocol,
        ),
    ];
    for (what, packet, fds, code) in cases {
        let (reply, got) = raw_handshake_with_fds(&addr, &packet, &fds).unwrap();
        assert!(got.is_empty(), "{what}: a refusal carried descriptors");
        expect_refusal(what, &reply, code);
    }
    echoed(&addr, b"still serving");
    served.join().unwrap();
}

#[test]
fn fuzz_entry_points_survive_random_input() {
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for round in 0..300 {
        let len = (next() % 600) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 3 == 0 && data.len() > 40 {
            // Plausible shapes find deeper paths: a small aligned tail, a sane header.
            data[1..9].copy_from_slice(&((next() % 64) * 8).to_le_bytes());
        }
        shmlink::testing::fuzz_handshake(&data);
        shmlink::testing::fuzz_shm_reader(&data);
    }
}
