//! Doorbells of `vm:` on the host: `shmlink vm-host`'s protocol (QEMU's ivshmem-server
//! protocol) spoken to fake QEMU clients over its Unix socket — ids, the region's
//! descriptor, eventfds, peers joining and leaving — hostile clients and servers, and
//! host ↔ host connections whose waiters are woken by doorbells rung through the
//! server's eventfds (spinning off: `SHMLINK_VM_SPINS=0`).

mod common;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::Duration;

use shmlink::{Connection, Listener, Options};
use shmlink_testkit::{bell_stats, ivshmem_read_msg};
use shmlink_vmhost::{HostEvent, VmHost};

use common::VmPaths as Paths;

const WAIT: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;

/// Spinning off for every test of this binary (read once per process by the library).
fn no_spin() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("SHMLINK_VM_SPINS", "0"));
}

/// A region path in /dev/shm and its socket, both removed on drop.
fn paths() -> Paths {
    Paths::new("vmbell-test")
}

/// A server running in a thread until dropped; its events are collected.
struct Server {
    stop: Arc<AtomicBool>,
    events: Arc<Mutex<Vec<HostEvent>>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(p: &Paths, vectors: u32, max_peers: usize) -> Server {
        let mut host = VmHost::bind(&p.bell, &p.region, 16 * MIB, vectors).unwrap();
        host.set_max_peers(max_peers);
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Vec::new()));
        let (s, e) = (stop.clone(), events.clone());
        let thread = std::thread::spawn(move || {
            host.serve(&s, |ev| e.lock().unwrap().push(ev.clone()))
                .unwrap();
        });
        Server {
            stop,
            events,
            thread: Some(thread),
        }
    }

    /// Waits until an event matching `f` was reported.
    fn wait_for(&self, what: &str, f: impl Fn(&HostEvent) -> bool) {
        let t = std::time::Instant::now();
        while t.elapsed() < WAIT {
            if self.events.lock().unwrap().iter().any(&f) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("no {what} event: {:?}", self.events.lock().unwrap());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fake QEMU: connects and reads its setup (version, id, memory, eventfds).
struct Fake {
    sock: UnixStream,
    id: i64,
    mem: OwnedFd,
    /// (peer id, eventfd) in the order received; our own are those with our id.
    fds: Vec<(i64, OwnedFd)>,
}

fn msg(sock: &UnixStream) -> (i64, Option<OwnedFd>) {
    ivshmem_read_msg(sock.as_fd(), WAIT).unwrap()
}

impl Fake {
    /// Connects and reads the setup: `others` eventfds of earlier peers, then `vectors`
    /// of its own.
    fn join(p: &Paths, others: usize, vectors: usize) -> Fake {
        let sock = UnixStream::connect(&p.bell).unwrap();
        let (v, f) = msg(&sock);
        assert_eq!((v, f.is_none()), (0, true), "protocol version 0 without fd");
        let (id, f) = msg(&sock);
        assert!(f.is_none() && (0..65535).contains(&id), "id {id}");
        let (m, mem) = msg(&sock);
        assert_eq!(m, -1, "the memory message");
        let mem = mem.expect("the region's descriptor");
        let mut fds = Vec::new();
        for _ in 0..others + vectors {
            let (pid, f) = msg(&sock);
            fds.push((pid, f.expect("an eventfd with each peer message")));
        }
        assert!(fds[others..].iter().all(|(p, _)| *p == id), "own fds last");
        assert!(fds[..others].iter().all(|(p, _)| *p != id));
        Fake { sock, id, mem, fds }
    }

    fn own(&self, v: usize) -> &OwnedFd {
        &self
            .fds
            .iter()
            .filter(|(p, _)| *p == self.id)
            .nth(v)
            .unwrap()
            .1
    }

    fn of(&self, peer: i64, v: usize) -> &OwnedFd {
        &self
            .fds
            .iter()
            .filter(|(p, _)| *p == peer)
            .nth(v)
            .unwrap()
            .1
    }
}

fn ring(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from `one` to an eventfd.
    let n = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    assert_eq!(n, 8);
}

/// Reads an eventfd's counter without blocking (0 if unset).
fn take(fd: &OwnedFd) -> u64 {
    let mut b = [0u8; 8];
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, 500) } != 1 {
        return 0;
    }
    // SAFETY: reads 8 bytes into `b`.
    let n = unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
    assert_eq!(n, 8);
    u64::from_ne_bytes(b)
}

/// Sends one protocol message with a descriptor, as a server (or a hostile client) does.
fn send_fd(sock: &UnixStream, v: i64, fd: &OwnedFd) -> bool {
    common::send_ivshmem_msg(sock, v, Some(fd))
}

fn fd_size(fd: &OwnedFd) -> u64 {
    // SAFETY: fstat into a zeroed stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat of an open descriptor into a live stat.
    let rc = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    assert_eq!(rc, 0);
    st.st_size as u64
}

#[test]
fn ids_memory_eventfds_joins_and_leaves() {
    let p = paths();
    let s = Server::start(&p, 2, 8);
    let a = Fake::join(&p, 0, 2);
    assert_eq!(a.id, 0);
    assert_eq!(fd_size(&a.mem), 16 * MIB, "the region's descriptor");
    let b = Fake::join(&p, 2, 2);
    assert_eq!(b.id, 1);
    // a hears of b: b's id once per vector, with b's eventfds.
    let (j1, f1) = msg(&a.sock);
    let (j2, f2) = msg(&a.sock);
    assert_eq!((j1, j2), (1, 1));
    let (bf0, bf1) = (f1.unwrap(), f2.unwrap());
    // b rings a on vector 1 through the eventfd the server gave b: a's own fd fires.
    ring(b.of(0, 1));
    assert_eq!(take(a.own(1)), 1);
    assert_eq!(take(a.own(0)), 0, "vector 0 was not rung");
    // a rings b on vector 0.
    ring(&bf0);
    assert_eq!(take(b.own(0)), 1);
    drop(bf1);
    // b leaves: a gets b's id without a descriptor; the next peer gets a new id (2): ids
    // are not reused at once (QEMU mishandles a departed peer's id coming back).
    drop(b);
    let (left, f) = msg(&a.sock);
    assert_eq!((left, f.is_none()), (1, true), "departure announced");
    s.wait_for("left", |e| *e == HostEvent::Left(1));
    let c = Fake::join(&p, 2, 2);
    assert_eq!(c.id, 2, "ids go round, not the lowest free one");
    let (j, f) = msg(&a.sock);
    assert_eq!((j, f.is_some()), (2, true));
    drop(c);
    drop(a);
}

#[test]
fn hostile_clients_are_dropped_and_the_rest_goes_on() {
    let p = paths();
    let s = Server::start(&p, 1, 3);
    let a = Fake::join(&p, 0, 1);
    // A client that writes (peers never do) is dropped, and a hears it leave.
    let mut b = Fake::join(&p, 1, 1);
    let _ = msg(&a.sock); // b joined
    use std::io::Write;
    b.sock.write_all(&[0xff; 5]).unwrap();
    s.wait_for("dropped", |e| matches!(e, HostEvent::Dropped(1, _)));
    let (left, f) = msg(&a.sock);
    assert_eq!((left, f.is_none()), (1, true));
    // A client that sends descriptors is dropped too (without leaking them).
    let c = Fake::join(&p, 1, 1);
    let _ = msg(&a.sock);
    let e = c.own(0).try_clone().unwrap();
    assert!(send_fd(&c.sock, 9, &e));
    // (c is peer 2: ids go round rather than reusing 1.)
    s.wait_for(
        "dropped 2",
        |ev| matches!(ev, HostEvent::Dropped(2, w) if w.contains("0x9")),
    );
    let (left, _) = msg(&a.sock);
    assert_eq!(left, 2);
    // A full table: the server closes new connections at once (max 3 peers here).
    let d = Fake::join(&p, 1, 1);
    let e2 = Fake::join(&p, 2, 1);
    let over = UnixStream::connect(&p.bell).unwrap();
    assert_eq!(
        ivshmem_read_msg(over.as_fd(), WAIT).unwrap_err().kind(),
        std::io::ErrorKind::UnexpectedEof,
        "a peer beyond the table is closed"
    );
    s.wait_for("refused", |e| matches!(e, HostEvent::Refused(_)));
    // Connections that close at once, before or while reading the setup.
    for _ in 0..20 {
        drop(UnixStream::connect(&p.bell).unwrap());
    }
    // The server still serves: d and e2 can ring a.
    ring(d.of(0, 0));
    assert_eq!(take(a.own(0)), 1);
    ring(e2.of(0, 0));
    assert_eq!(take(a.own(0)), 1);
    drop(b);
}

#[test]
fn a_second_server_on_the_socket_is_refused_and_bad_arguments_too() {
    let p = paths();
    let _s = Server::start(&p, 1, 4);
    let e = VmHost::bind(&p.bell, &p.region, 16 * MIB, 1).err().unwrap();
    assert_eq!(e.kind(), shmlink::ErrorKind::AddrInUse);
    let q = paths();
    for (size, vectors) in [(16 * MIB, 0), (16 * MIB, 65), (24 * MIB, 1), (MIB, 1)] {
        let e = VmHost::bind(&q.bell, &q.region, size, vectors)
            .err()
            .unwrap();
        assert_eq!(
            e.kind(),
            shmlink::ErrorKind::InvalidInput,
            "{size} {vectors}"
        );
    }
}

/// A connected pair over `p`'s region: (client, server, listener).
fn pair(p: &Paths, name: &str) -> (Connection, Connection, Listener) {
    p.pair(name)
}

#[test]
fn host_processes_are_woken_by_doorbells() {
    no_spin();
    let p = paths();
    let _s = Server::start(&p, 1, 8);
    let (mut c, mut s, _l) = pair(&p, "ping");
    let before = bell_stats(&p.region).expect("a doorbell through the server");
    assert!(before.can_be_rung);
    // Ping-pong with spinning off: every blocked receive sleeps on its descriptor and is
    // woken by a ring (the echo thread sleeps between messages too).
    let echo = std::thread::spawn(move || {
        for _ in 0..300 {
            let buf = s.recv_vec().unwrap();
            s.send(&buf).unwrap();
        }
        s
    });
    for i in 0u32..300 {
        c.send(&i.to_le_bytes()).unwrap();
        let buf = c.recv_vec().unwrap();
        assert_eq!(buf, i.to_le_bytes());
    }
    let _s = echo.join().unwrap();
    let after = bell_stats(&p.region).unwrap();
    assert!(
        after.rings > before.rings && after.wakes > before.wakes,
        "doorbells rang and woke: {before:?} -> {after:?}"
    );
}

#[test]
fn a_blocked_sender_is_woken_when_room_is_made() {
    no_spin();
    let p = paths();
    let _s = Server::start(&p, 1, 8);
    let (mut c, mut s, _l) = pair(&p, "flow");
    let before = bell_stats(&p.region).unwrap();
    // 64 KiB rings (16 MiB region): 4 MiB through it makes the sender block many times.
    let msg = vec![7u8; 16 << 10];
    let t = std::thread::spawn(move || {
        for _ in 0..256 {
            c.send(&msg).unwrap();
        }
        c
    });
    for _ in 0..256 {
        let buf = s.recv_vec().unwrap();
        assert_eq!(buf.len(), 16 << 10);
        assert!(buf.iter().all(|&b| b == 7));
    }
    let _c = t.join().unwrap();
    let after = bell_stats(&p.region).unwrap();
    assert!(after.rings > before.rings, "{before:?} -> {after:?}");
}

/// A fake server that sends `msgs` and then holds the socket open.
fn fake_server(socket: &Path, msgs: Vec<i64>) -> JoinHandle<()> {
    let l = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut w = &s;
        use std::io::Write;
        for m in msgs {
            let _ = w.write_all(&m.to_le_bytes());
        }
        std::thread::sleep(Duration::from_millis(300));
    })
}

#[test]
fn a_hostile_server_gives_no_doorbell_and_vm_still_works_by_polling() {
    // Each case: a region whose REGION.bell speaks nonsense; the connection works
    // (polling), no doorbell is taken.
    for msgs in [
        vec![1],              // another protocol version
        vec![0, 70_000],      // an id out of range
        vec![0, 3, -1],       // the memory message without its descriptor
        vec![0, 3, -7, 1, 2], // garbage
    ] {
        let p = paths();
        common::create_region_file(&p.region)
            .set_len(16 * MIB)
            .unwrap();
        let t = fake_server(&p.bell, msgs.clone());
        let (mut c, mut s, _l) = pair(&p, "hostile");
        assert_eq!(bell_stats(&p.region), None, "{msgs:?}");
        c.send(b"still works").unwrap();
        let buf = s.recv_vec().unwrap();
        assert_eq!(buf, b"still works");
        drop((c, s));
        t.join().unwrap();
    }
}

#[test]
fn a_server_flooding_descriptors_gives_no_doorbell() {
    // Version, id, memory, then 100 eventfds for one peer (no honest server sends more
    // than 64 vectors), then ours: refused at the 65th, no descriptor kept.
    let p = paths();
    common::create_region_file(&p.region)
        .set_len(16 * MIB)
        .unwrap();
    let l = UnixListener::bind(&p.bell).unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        use std::io::Write;
        (&s).write_all(&0i64.to_le_bytes()).unwrap();
        (&s).write_all(&3i64.to_le_bytes()).unwrap();
        let mem = std::fs::File::open("/dev/null").unwrap();
        assert!(send_fd(&s, -1, &OwnedFd::from(mem)));
        let e: OwnedFd = UnixStream::pair().unwrap().0.into();
        // The client hangs up once it refuses the flood: sends may fail from then on.
        for _ in 0..100 {
            if !send_fd(&s, 5, &e) {
                return;
            }
        }
        // Then our own: a client without the cap would take the bell now.
        send_fd(&s, 3, &e);
        std::thread::sleep(Duration::from_millis(300));
    });
    let (mut c, mut s, _l) = pair(&p, "flood");
    assert_eq!(bell_stats(&p.region), None);
    c.send(b"polling").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"polling");
    drop((c, s));
    t.join().unwrap();
}

#[test]
fn a_server_that_goes_away_leaves_working_connections() {
    no_spin();
    let p = paths();
    let srv = Server::start(&p, 1, 8);
    let (mut c, mut s, _l) = pair(&p, "gone");
    assert!(bell_stats(&p.region).is_some());
    drop(srv); // the server's sockets close: the doorbell dies, waiters poll
    std::thread::sleep(Duration::from_millis(50));
    let echo = std::thread::spawn(move || {
        for _ in 0..50 {
            let buf = s.recv_vec().unwrap();
            s.send(&buf).unwrap();
        }
    });
    for i in 0u32..50 {
        c.send(&i.to_le_bytes()).unwrap();
        let buf = c.recv_vec().unwrap();
        assert_eq!(buf, i.to_le_bytes());
    }
    echo.join().unwrap();
}

const CHILD_VAR: &str = "SHMLINK_VMBELL_TEST_REGION";

/// The child side of [`two_processes_ring_each_other`]: serves an echo of 200 messages
/// on the region, then prints its doorbell's counters.
#[test]
#[ignore = "the child process of two_processes_ring_each_other, run by it"]
fn child_echo() {
    let Ok(region) = std::env::var(CHILD_VAR) else {
        return;
    };
    no_spin();
    let mut l = Listener::bind(&format!("vm:xecho@{region}"), &Options::default()).unwrap();
    println!("VMBELL-CHILD ready");
    let mut s = l.accept().unwrap();
    for _ in 0..200 {
        let m = s.recv_vec().unwrap();
        s.send(&m).unwrap();
    }
    let st = bell_stats(Path::new(&region)).unwrap();
    println!(
        "VMBELL-CHILD rings={} wakes={} id={}",
        st.rings, st.wakes, st.id
    );
    let _ = s.recv_vec(); // until the parent closes
}

#[test]
fn two_processes_ring_each_other() {
    use std::io::{BufRead, BufReader};
    no_spin();
    let p = paths();
    let _s = Server::start(&p, 1, 8);
    let mut ch = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_echo", "--nocapture"])
        .env(CHILD_VAR, &p.region)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = ch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = |what: &str| loop {
        let l = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("child: no {what}"));
        if l.starts_with("VMBELL-CHILD") {
            return l;
        }
    };
    assert!(next("ready").contains("ready"));
    let mut c = Connection::connect(
        &format!("vm:xecho@{}", p.region.display()),
        &Options::default(),
    )
    .unwrap();
    let before = bell_stats(&p.region).unwrap();
    for i in 0u32..200 {
        c.send(&i.to_le_bytes()).unwrap();
        assert_eq!(c.recv_vec().unwrap(), i.to_le_bytes());
    }
    let counters = next("counters");
    drop(c);
    let after = bell_stats(&p.region).unwrap();
    let _ = ch.wait();
    // Each process is its own peer of the server (its own id), rang the other and was
    // woken by the other's rings.
    assert!(
        after.rings > before.rings && after.wakes > before.wakes,
        "parent {before:?} -> {after:?}"
    );
    let num = |k: &str| -> u64 {
        let v = counters.split(&format!("{k}=")).nth(1).unwrap();
        v.split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(num("rings") > 0 && num("wakes") > 0, "child: {counters}");
    assert_ne!(num("id"), u64::from(after.id), "two peers, two ids");
}
