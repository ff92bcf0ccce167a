//! The `vm:` transport on the host: both ends map one region file (what QEMU's
//! `ivshmem` backing file is), each through its own mapping, so every byte crosses the
//! region exactly as between two guests. The peer is a thread (each end opens and maps
//! the region itself) or, for death, a child process (this test binary run again as
//! `--ignored --exact child_main`). Guests are tests/vm_guests.rs.

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener, Options};

/// The ticker's death bound (80 ms by default, reported within about 90 ms) with room for a loaded machine's
/// scheduling; what the test checks as "within the bound".
const RESET_WITHIN: Duration = Duration::from_millis(1500);
const WAIT: Duration = Duration::from_secs(30);

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh region file of `mib` MiB in /dev/shm, removed on drop.
struct RegionFile(PathBuf);

impl RegionFile {
    fn new(mib: usize) -> RegionFile {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let p = PathBuf::from(format!(
            "/dev/shm/shmlink-vm-test-{}-{n}",
            std::process::id()
        ));
        let f = common::create_region_file(&p);
        f.set_len((mib << 20) as u64).unwrap();
        RegionFile(p)
    }

    fn addr(&self, name: &str) -> String {
        format!("vm:{name}@{}", self.0.display())
    }

    /// Writes `v` at `off` of the region (a hostile guest scribbling).
    fn poke(&self, off: u64, v: u64) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.0)
            .unwrap();
        f.write_all_at(&v.to_le_bytes(), off).unwrap();
    }
}

impl Drop for RegionFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A connected pair: (client, server).
fn pair(r: &RegionFile, name: &str, opts: &Options) -> (Connection, Connection, Listener) {
    let mut l = Listener::bind(&r.addr(name), opts).unwrap();
    let addr = r.addr(name);
    let o = opts.clone();
    let t = std::thread::spawn(move || Connection::connect(&addr, &o).unwrap());
    let s = l.accept().unwrap();
    (t.join().unwrap(), s, l)
}

/// A self-checking payload: sequence number, length and a byte pattern.
fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (seq as usize).wrapping_mul(31).wrapping_add(i * 7) as u8)
        .collect();
    if len >= 8 {
        v[..8].copy_from_slice(&seq.to_le_bytes());
    }
    v
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn echo_and_addresses() {
    let r = RegionFile::new(16);
    let (mut c, mut s, l) = pair(&r, "echo", &Options::default());
    assert_eq!(c.transport(), shmlink::Transport::Vm);
    assert_eq!(l.local_addr(), r.addr("echo"));
    for i in 0..100u64 {
        let m = payload(i, (i as usize * 13) % 200);
        c.send(&m).unwrap();
        let got = s.recv_vec().unwrap();
        assert_eq!(got, m);
        s.send(&got).unwrap();
        assert_eq!(c.recv_vec().unwrap(), m);
    }
    c.send(b"").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"");
}

#[test]
fn ordered_checksummed_messages_both_ways() {
    let r = RegionFile::new(16);
    let (mut c, mut s, _l) = pair(&r, "ordered", &Options::default());
    const N: u64 = 100_000;
    let len = |i: u64| 1 + (i as usize * 7919) % 4000;
    let t = std::thread::spawn(move || {
        let mut sum = 0u64;
        for i in 0..N {
            let m = s.recv_vec().unwrap();
            assert_eq!(m.len(), len(i), "message {i}");
            assert_eq!(m, payload(i, len(i)), "message {i}");
            sum = sum.wrapping_add(checksum(&m));
        }
        s.send(&sum.to_le_bytes()).unwrap();
        s
    });
    let mut sum = 0u64;
    for i in 0..N {
        let m = payload(i, len(i));
        sum = sum.wrapping_add(checksum(&m));
        c.send(&m).unwrap();
    }
    let theirs = c.recv_vec().unwrap();
    assert_eq!(theirs, sum.to_le_bytes());
    t.join().unwrap();
}

#[test]
fn sizes_from_one_byte_to_16_mib() {
    // 16 MiB region: 64 KiB rings, so everything above 32 KiB is split into fragments.
    let r = RegionFile::new(16);
    let opts = Options::default().max_msg_size(16 << 20);
    let (mut c, mut s, _l) = pair(&r, "sizes", &opts);
    assert_eq!(c.max_msg_size(), 16 << 20);
    let sizes = [
        1usize,
        7,
        8,
        4095,
        32 << 10,
        (32 << 10) + 1,
        64 << 10,
        1 << 20,
        (3 << 20) + 5,
        16 << 20,
    ];
    let t = std::thread::spawn(move || {
        for (i, &n) in sizes.iter().enumerate() {
            let m = s.recv_vec().unwrap();
            assert_eq!(m.len(), n);
            assert_eq!(checksum(&m), checksum(&payload(i as u64, n)), "size {n}");
            s.send(&m).unwrap();
        }
    });
    for (i, &n) in sizes.iter().enumerate() {
        let m = payload(i as u64, n);
        c.send(&m).unwrap();
        let back = c.recv_vec().unwrap();
        assert!(back == m, "echo of {n} bytes differs");
    }
    t.join().unwrap();
    // Over the maximum: refused before anything is sent.
    let e = c.send(&vec![0u8; (16 << 20) + 1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
}

/// A large record sent when the ring has just emptied restarts at the ring's start
/// behind a skip record (the ring crate's warm-memory rule, records of 64 KiB and more);
/// the receiver passes over the skip. 64 MiB region: 256 KiB rings.
#[test]
fn a_large_record_after_the_ring_emptied_restarts_at_its_start() {
    let r = RegionFile::new(64);
    let opts = Options::default().max_msg_size(1 << 20);
    let (mut c, mut s, _l) = pair(&r, "restart", &opts);
    // 100 KiB moves the ring's position well past the start; once it is read the ring
    // is empty, and 90 KiB fits before that position: the restart case.
    for (i, n) in [100usize << 10, 90 << 10, 120 << 10, 64 << 10]
        .into_iter()
        .enumerate()
    {
        let m = payload(i as u64, n);
        c.send(&m).unwrap();
        assert!(
            s.recv_vec().unwrap() == m,
            "message {i} of {n} bytes differs"
        );
    }
}

fn poll_readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

#[test]
fn flow_control_nonblocking_and_poll() {
    let r = RegionFile::new(16);
    let (mut c, mut s, _l) = pair(&r, "flow", &Options::default());
    c.set_nonblocking(true);
    s.set_nonblocking(true);
    // Nothing to read: WouldBlock, and the fd stays quiet.
    assert_eq!(s.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    assert!(!poll_readable(s.as_raw_fd(), 50));
    // Fill the 64 KiB ring until a send would block.
    let msg = vec![7u8; 1000];
    let mut sent = 0u64;
    loop {
        match c.send(&msg) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent < 1000, "the ring never filled");
    }
    assert!(sent > 30, "only {sent} messages fit");
    // The receiver's fd turned readable (the ticker saw the records).
    assert!(poll_readable(s.as_raw_fd(), 2000));
    // Draining some makes the sender's fd readable (room), and sending works again.
    for _ in 0..10 {
        s.recv_vec().unwrap();
    }
    assert!(poll_readable(c.as_raw_fd(), 2000));
    c.send(&msg).unwrap();
    sent += 1;
    let mut got = 10;
    let deadline = Instant::now() + WAIT;
    while got < sent {
        match s.recv_vec() {
            Ok(m) => {
                assert_eq!(m, msg);
                got += 1
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline);
                poll_readable(s.as_raw_fd(), 100);
            }
            Err(e) => panic!("{e}"),
        }
    }
    // A blocking sender waits for room, and finishes once the receiver drains.
    c.set_nonblocking(false);
    s.set_nonblocking(false);
    let t = std::thread::spawn(move || {
        for i in 0..500u64 {
            c.send(&payload(i, 3000)).unwrap();
        }
        c
    });
    for i in 0..500u64 {
        assert_eq!(s.recv_vec().unwrap(), payload(i, 3000));
    }
    t.join().unwrap();
}

#[test]
fn graceful_close_delivers_everything_then_end_of_stream() {
    let r = RegionFile::new(16);
    let (mut c, mut s, _l) = pair(&r, "close", &Options::default());
    let t = std::thread::spawn(move || {
        for i in 0..200u64 {
            c.send(&payload(i, 100 + i as usize * 500)).unwrap();
        }
        c.close().unwrap();
    });
    for i in 0..200u64 {
        assert_eq!(s.recv_vec().unwrap(), payload(i, 100 + i as usize * 500));
    }
    assert_eq!(s.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
    t.join().unwrap();
    assert_eq!(s.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
}

#[test]
fn listener_names_and_refusals() {
    let r = RegionFile::new(16);
    let _l = Listener::bind(&r.addr("taken"), &Options::default()).unwrap();
    let e = Listener::bind(&r.addr("taken"), &Options::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
    let e = Connection::connect(&r.addr("nobody"), &Options::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    // The listener's ticker completes handshakes (a backlog): connect returns before
    // accept is called; a listener dropped with a connection in its backlog resets it.
    let mut c = Connection::connect(&r.addr("taken"), &Options::default()).unwrap();
    drop(_l);
    let start = Instant::now();
    let e = c.recv_vec().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(start.elapsed() < RESET_WITHIN + Duration::from_secs(1));
    // The name is free again once the listener goes.
    Listener::bind(&r.addr("taken"), &Options::default()).unwrap();
}

/// 64 connections fill a region's slots: the next client is refused, and a slot is free
/// again once both ends of a connection have gone.
#[test]
fn slots_run_out_then_free_again() {
    let r = RegionFile::new(16);
    let addr = r.addr("many");
    let mut l = Listener::bind(&addr, &Options::default()).unwrap();
    let mut pairs = Vec::new();
    for i in 0..64u64 {
        let c = Connection::connect(&addr, &Options::default()).unwrap();
        let s = l.accept().unwrap();
        pairs.push((c, s, i));
    }
    let e = Connection::connect(&addr, &Options::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("slots"), "{e}");
    drop(pairs.remove(10));
    let mut c = Connection::connect(&addr, &Options::default()).unwrap();
    let mut s = l.accept().unwrap();
    c.send(b"slot reused").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"slot reused");
    for (c, s, i) in pairs.iter_mut() {
        c.send(&i.to_le_bytes()).unwrap();
        assert_eq!(s.recv_vec().unwrap(), i.to_le_bytes());
    }
}

#[test]
fn bad_regions_are_refused() {
    let small = RegionFile::new(1);
    let e = Listener::bind(&small.addr("x"), &Options::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let other = RegionFile::new(16);
    other.poke(0, 0x1234);
    let e = Listener::bind(&other.addr("x"), &Options::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::VersionMismatch, "{e}");
    // No region file to bind in: NotFound (ENOENT in C), like a missing directory.
    let e = Listener::bind("vm:x@/nonexistent/region", &Options::default())
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

/// Offsets of the layout (transport/vm/region.rs and slot.rs), as a hostile guest knows
/// them.
const SLOTS_AT: u64 = 8192;
const SLOT_BYTES: u64 = 2048;
const C2S_PROD: u64 = 384;

#[test]
fn a_scribbled_slot_breaks_only_its_connection() {
    let r = RegionFile::new(16);
    let opts = Options::default();
    let mut l = Listener::bind(&r.addr("hostile"), &opts).unwrap();
    let addr = r.addr("hostile");
    let (a2, o2) = (addr.clone(), opts.clone());
    let mut c1 = Connection::connect(&addr, &opts).unwrap();
    let mut s1 = l.accept().unwrap();
    let mut c2 = std::thread::spawn(move || Connection::connect(&a2, &o2).unwrap())
        .join()
        .unwrap();
    let mut s2 = l.accept().unwrap();
    c1.send(b"before").unwrap();
    assert_eq!(s1.recv_vec().unwrap(), b"before");
    // Which slot is c1's: its local address ends in #SLOT.
    let local = c1.local_addr();
    let slot: u64 = local.rsplit('#').next().unwrap().parse().unwrap();
    // The "guest" moves c1's client→server tail somewhere impossible.
    r.poke(SLOTS_AT + slot * SLOT_BYTES + C2S_PROD, 12345);
    let e = s1.recv_vec().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{e}");
    // It stays broken.
    assert_eq!(
        s1.recv_vec().unwrap_err().kind(),
        ErrorKind::ProtocolViolation
    );
    // The other connection is untouched.
    c2.send(b"still fine").unwrap();
    assert_eq!(s2.recv_vec().unwrap(), b"still fine");
    s2.send(b"yes").unwrap();
    assert_eq!(c2.recv_vec().unwrap(), b"yes");
    // Random scribbles over c2's ring blocks: errors, never a crash or a hang.
    let slot2: u64 = c2.local_addr().rsplit('#').next().unwrap().parse().unwrap();
    let mut seed = 0x9e3779b97f4a7c15u64;
    for _ in 0..64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let off = (seed % 1280) & !7;
        r.poke(SLOTS_AT + slot2 * SLOT_BYTES + C2S_PROD + off, seed);
    }
    s2.set_nonblocking(true);
    for _ in 0..4 {
        match s2.recv_vec() {
            Ok(_) => {}
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ProtocolViolation
                        | ErrorKind::WouldBlock
                        | ErrorKind::ConnectionReset
                        | ErrorKind::EndOfStream
                ),
                "{e}"
            ),
        }
    }
    // A third connection still gets through.
    let a3 = addr.clone();
    let t = std::thread::spawn(move || {
        let mut c = Connection::connect(&a3, &Options::default()).unwrap();
        c.send(b"third").unwrap();
        c
    });
    let mut s3 = l.accept().unwrap();
    assert_eq!(s3.recv_vec().unwrap(), b"third");
    drop(t.join().unwrap());
}

const ROLE_VAR: &str = "SHMLINK_VM_TEST_CHILD";
const ADDR_VAR: &str = "SHMLINK_VM_TEST_ADDR";

/// Runs this binary as a child in `role`, connected to `addr`; returns it once it printed
/// "ready".
fn child(role: &str, addr: &str) -> std::process::Child {
    let mut ch = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_main", "--nocapture"])
        .env(ROLE_VAR, role)
        .env(ADDR_VAR, addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = ch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("SHMLINK-VM-CHILD ready") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(WAIT).expect("child never got ready");
    ch
}

/// The child side: connects, sends 10 messages, says ready, then blocks on stdin.
#[test]
#[ignore = "a child-process role of the peer-death tests, run by them"]
fn child_main() {
    let (Ok(role), Ok(addr)) = (std::env::var(ROLE_VAR), std::env::var(ADDR_VAR)) else {
        return;
    };
    if role == "listener" {
        let _l = Listener::bind(&addr, &Options::default()).unwrap();
        println!("SHMLINK-VM-CHILD ready");
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
        return;
    }
    let mut c = Connection::connect(&addr, &Options::default()).unwrap();
    for i in 0..10u64 {
        c.send(&payload(i, 100)).unwrap();
    }
    if role == "blocked-recv" {
        std::thread::spawn(move || {
            let _ = c.recv_vec();
        });
    }
    println!("SHMLINK-VM-CHILD ready");
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

fn peer_death(role: &str) {
    let r = RegionFile::new(16);
    let addr = r.addr("death");
    let mut l = Listener::bind(&addr, &Options::default()).unwrap();
    let mut ch = child(role, &addr);
    let mut s = l.accept().unwrap();
    for i in 0..10u64 {
        assert_eq!(s.recv_vec().unwrap(), payload(i, 100));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let e = s.recv_vec().unwrap_err();
        tx.send((e.kind(), Instant::now())).unwrap();
        s
    });
    std::thread::sleep(Duration::from_millis(200)); // the survivor is blocked, sleeping
    let killed = Instant::now();
    ch.kill().unwrap();
    ch.wait().unwrap();
    let (kind, at) = rx
        .recv_timeout(WAIT)
        .expect("no reset after the peer's death");
    let took = at - killed;
    eprintln!("vm: peer death ({role}) reported after {took:?}");
    assert_eq!(kind, ErrorKind::ConnectionReset);
    assert!(took < RESET_WITHIN, "reset after {took:?}");
    drop(t.join().unwrap());
    // The listener serves the next client; the dead connection's slot is reused.
    let a = addr.clone();
    let t = std::thread::spawn(move || {
        let mut c = Connection::connect(&a, &Options::default()).unwrap();
        c.send(b"after").unwrap();
        c
    });
    let mut s = l.accept().unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"after");
    drop(t.join().unwrap());
}

#[test]
fn killed_peer_process_resets_a_blocked_receiver() {
    peer_death("idle");
}

#[test]
fn killed_peer_with_a_blocked_reader_resets_too() {
    peer_death("blocked-recv");
}

/// A listener whose process was killed leaves its entry LIVE: clients are refused once
/// its heartbeat stands still (not after the connect timeout), and the name can be bound
/// again.
#[test]
fn a_dead_listener_refuses_quickly_and_its_name_is_taken_over() {
    let r = RegionFile::new(16);
    let addr = r.addr("gone");
    let mut ch = child("listener", &addr);
    ch.kill().unwrap();
    ch.wait().unwrap();
    let opts = Options::default().connect_timeout(Duration::from_secs(20));
    let start = Instant::now();
    let e = Connection::connect(&addr, &opts).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let mut l = Listener::bind(&addr, &Options::default()).unwrap();
    let a = addr.clone();
    let t = std::thread::spawn(move || Connection::connect(&a, &Options::default()).unwrap());
    let mut s = l.accept().unwrap();
    let mut c = t.join().unwrap();
    c.send(b"new owner").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"new owner");
}

#[test]
fn address_forms() {
    assert!(shmlink::Address::parse("vm:name@relative/path").is_err());
    assert!(shmlink::Address::parse("vm:").is_err());
    let a = shmlink::Address::parse("vm:svc@/dev/shm/r").unwrap();
    assert_eq!(a.to_string(), "vm:svc@/dev/shm/r");
    assert_eq!(a.transport(), shmlink::Transport::Vm);
    let _ = Path::new("/");
}
