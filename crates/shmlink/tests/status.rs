//! `shmlink::inspect` (what `shmlink ls` shows): a listener reports its connections with
//! their peers and counters, forgets dropped ones, answers only while it accepts (and
//! `inspect` does not hang on one that does not), stale sockets are told apart, a
//! malformed query is refused without harm (and counted), and an `auto:` listener reports itself and
//! its TCP connections through its upgrade socket.

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shmlink::inspect::{ListenerStatus, SocketReport, SocketState};
use shmlink::{inspect, Connection, ErrorKind, Listener, Options};
use shmlink_testkit::{raw_handshake, AutoMsg, HandshakePacket, RefuseCode};

const TIMEOUT: Duration = Duration::from_secs(5);

/// A directory of the test's own, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        setup();
        let dir =
            std::env::temp_dir().join(format!("shmlink-status-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn addr(&self, name: &str) -> String {
        format!("shm:{}/{name}.sock", self.0.display())
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The rendezvous directory of this test binary (for `auto:`'s upgrade socket), set
/// before any test reads it.
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let dir = std::env::temp_dir().join(format!("shmlink-status-rdv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::env::set_var("SHMLINK_DIR", &dir);
    });
}

/// Runs `inspect` on `dir` in a thread while this one keeps `listener` accepting, as an
/// application's accept loop would.
fn inspect_while_accepting(listener: &mut Listener, dir: &Path) -> Vec<SocketReport> {
    listener.set_nonblocking(true);
    let dir = dir.to_path_buf();
    let asker = std::thread::spawn(move || inspect(&dir, TIMEOUT).unwrap());
    while !asker.is_finished() {
        match listener.accept() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                shmlink_testkit::wait_readable(&*listener, Duration::from_millis(10));
            }
            other => panic!("no client expected, got {other:?}"),
        }
    }
    listener.set_nonblocking(false);
    asker.join().unwrap()
}

fn answered(report: &SocketReport) -> &ListenerStatus {
    match &report.state {
        SocketState::Answered(s) => s,
        other => panic!("{}: {other:?}", report.path.display()),
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Client `i` sends `i + 1` messages of `100 * (i + 1)` bytes (each starting with `i`),
/// takes the one answer, and holds the connection until told to go.
fn client(addr: String, i: u8, go: std::sync::mpsc::Receiver<()>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = Connection::connect(&addr, &Options::default()).unwrap();
        for _ in 0..=i {
            c.send(&vec![i; 100 * (i as usize + 1)]).unwrap();
        }
        assert_eq!(c.recv_vec().unwrap().len(), 7);
        let _ = go.recv();
    })
}

#[test]
fn a_listener_reports_its_connections_with_peers_and_counters() {
    let dir = Dir::new("conns");
    let addr = dir.addr("x");
    let mut listener = Listener::bind(&addr, &Options::default()).unwrap();
    let mut clients = Vec::new();
    for i in 0..3u8 {
        let (tx, rx) = std::sync::mpsc::channel();
        clients.push((client(addr.clone(), i, rx), tx));
    }
    let mut conns = Vec::new();
    for _ in 0..3 {
        let mut c = listener.accept().unwrap();
        let first = c.recv_vec().unwrap();
        let i = first[0];
        for _ in 0..i {
            c.recv_vec().unwrap();
        }
        c.send(b"answer!").unwrap();
        conns.push((i, c));
    }

    let reports = inspect_while_accepting(&mut listener, &dir.0);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(r.path, dir.0.join("x.sock"));
    let me = r.listener.unwrap();
    assert_eq!((me.pid, me.uid), (std::process::id(), euid()));
    let status = answered(r);
    assert_eq!(status.address, addr);
    assert_eq!(status.transport, "shm");
    assert_eq!(status.over, None);
    assert!(!status.truncated);
    let age = status.started.elapsed().unwrap();
    assert!(age < Duration::from_secs(60), "{age:?}");
    assert_eq!(status.connections.len(), 3);
    let mut seen: Vec<u64> = Vec::new();
    for c in &status.connections {
        assert_eq!(c.transport, "shm");
        let peer = c.peer.expect("shm: peers have credentials");
        assert_eq!((peer.pid, peer.uid), (std::process::id(), euid()));
        assert_eq!(c.peer_addr, None);
        let n = c.counters.msgs_in;
        assert!((1..=3).contains(&n), "{c:?}");
        assert_eq!(c.counters.bytes_in, 100 * n * n);
        assert_eq!((c.counters.msgs_out, c.counters.bytes_out), (1, 7));
        let (_, conn) = conns.iter().find(|(i, _)| *i as u64 + 1 == n).unwrap();
        assert_eq!(conn.counters(), c.counters);
        seen.push(n);
    }
    seen.sort();
    assert_eq!(seen, [1, 2, 3]);

    // A connection the application dropped is gone from the next answer.
    conns.retain(|(i, _)| *i != 1);
    let reports = inspect_while_accepting(&mut listener, &dir.0);
    let left: Vec<u64> = answered(&reports[0])
        .connections
        .iter()
        .map(|c| c.counters.msgs_in)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(!left.contains(&2));

    for (t, tx) in clients {
        tx.send(()).unwrap();
        t.join().unwrap();
    }
}

#[test]
fn a_listener_that_does_not_accept_is_not_answering_and_stale_sockets_are_stale() {
    let dir = Dir::new("idle");
    // Bound, but nobody calls accept.
    let _idle = Listener::bind(&dir.addr("idle"), &Options::default()).unwrap();
    // A socket file nobody listens on any more.
    drop(std::os::unix::net::UnixListener::bind(dir.0.join("stale.sock")).unwrap());
    // Not sockets, or not named *.sock: not listed.
    std::fs::write(dir.0.join("file.sock"), b"").unwrap();
    drop(std::os::unix::net::UnixListener::bind(dir.0.join("other")).unwrap());

    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let reports = inspect(&dir.0, timeout).unwrap();
    let took = start.elapsed();
    assert!(took >= timeout, "answered early? {took:?}");
    assert!(took < timeout + Duration::from_secs(3), "{took:?}");
    let states: Vec<_> = reports
        .iter()
        .map(|r| {
            (
                r.path.file_name().unwrap().to_str().unwrap(),
                r.listener.map(|c| c.pid),
                &r.state,
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            (
                "idle.sock",
                Some(std::process::id()),
                &SocketState::NotAnswering
            ),
            ("stale.sock", None, &SocketState::Stale),
        ]
    );
}

#[test]
fn several_silent_listeners_cost_the_timeout_once() {
    let dir = Dir::new("many");
    let _idle: Vec<_> = (0..5)
        .map(|i| Listener::bind(&dir.addr(&format!("l{i}")), &Options::default()).unwrap())
        .collect();
    let timeout = Duration::from_millis(400);
    let start = Instant::now();
    let reports = inspect(&dir.0, timeout).unwrap();
    assert!(start.elapsed() < 2 * timeout, "{:?}", start.elapsed());
    assert_eq!(reports.len(), 5);
    assert!(reports.iter().all(|r| r.state == SocketState::NotAnswering));
}

#[test]
fn an_unreadable_directory_is_an_error() {
    let dir = Dir::new("missing");
    let e = inspect(&dir.0.join("nope"), TIMEOUT).unwrap_err();
    assert!(e.message().contains("nope"), "{e}");
}

#[test]
fn a_malformed_query_is_refused_and_the_listener_serves_on() {
    let dir = Dir::new("malformed");
    let addr = dir.addr("m");
    let mut listener = Listener::bind(&addr, &Options::default()).unwrap();
    let server = std::thread::spawn(move || {
        let c = listener.accept().unwrap();
        (listener, c)
    });
    let mut query = HandshakePacket::Query.encode();
    query.push(0);
    let (answer, fds) = raw_handshake(&addr, &query).unwrap();
    assert!(fds.is_empty());
    match HandshakePacket::decode(&answer).unwrap() {
        HandshakePacket::Refuse(RefuseCode::Protocol, reason) => {
            assert!(reason.contains("9 bytes, expected 8"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A good query is answered by the same accept call, which then goes on waiting.
    let (answer, _) = raw_handshake(&addr, &HandshakePacket::Query.encode()).unwrap();
    let HandshakePacket::Status(status) = HandshakePacket::decode(&answer).unwrap() else {
        panic!("{answer:?}")
    };
    assert_eq!(status.address, addr);
    assert!(status.connections.is_empty());
    // The refusal is counted by its reason (what `shmlink metrics` exports).
    assert_eq!(status.refusals.protocol, 1, "{:?}", status.refusals);
    assert_eq!(status.refusals.total(), 1, "{:?}", status.refusals);
    let mut client = Connection::connect(&addr, &Options::default()).unwrap();
    let (_listener, mut conn) = server.join().unwrap();
    client.send(b"still serving").unwrap();
    assert_eq!(conn.recv_vec().unwrap(), b"still serving");
}

#[test]
fn an_auto_listener_reports_itself_and_its_tcp_connections() {
    let _dir = Dir::new("auto");
    let mut listener = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = listener.local_addr();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let tcp = addr.replacen("auto:", "tcp:", 1);

    // One client upgrades to shared memory, one stays on TCP (it does not tell its boot
    // id, as a client on another host could not).
    let a = addr.clone();
    let upgraded = std::thread::spawn(move || {
        let mut c = Connection::connect(&a, &Options::default()).unwrap();
        c.send(b"over shm").unwrap();
        c
    });
    let t = tcp.clone();
    let stayed = std::thread::spawn(move || {
        let mut c = Connection::connect(&t, &Options::default()).unwrap();
        c.send(&AutoMsg::Hello { boot_id: vec![] }.encode())
            .unwrap();
        let answer = AutoMsg::decode(&c.recv_vec().unwrap()).unwrap();
        assert!(matches!(answer, AutoMsg::NoOffer { .. }), "{answer:?}");
        c.send(b"over tcp!").unwrap();
        c
    });
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut c = listener.accept().unwrap();
        c.recv_vec().unwrap();
        conns.push(c);
    }
    let (_u, _s) = (upgraded.join().unwrap(), stayed.join().unwrap());

    let reports = inspect_while_accepting(&mut listener, &shmlink::rendezvous_dir());
    assert_eq!(reports.len(), 1, "{reports:?}");
    let name = reports[0].path.file_name().unwrap().to_string_lossy();
    assert!(name.starts_with(&format!("auto-{port}-")), "{name}");
    let status = answered(&reports[0]);
    assert_eq!(status.address, addr);
    assert_eq!(status.transport, "auto");
    assert_eq!(status.over.as_deref(), Some(tcp.as_str()));
    let mut by_transport: Vec<_> = status
        .connections
        .iter()
        .map(|c| (c.transport.as_str(), c.counters.bytes_in))
        .collect();
    by_transport.sort();
    assert_eq!(by_transport, [("shm", 8), ("tcp", 9)]);
    let on_tcp = status
        .connections
        .iter()
        .find(|c| c.transport == "tcp")
        .unwrap();
    assert_eq!(on_tcp.peer, None);
    assert!(on_tcp
        .peer_addr
        .as_deref()
        .unwrap()
        .starts_with("tcp:127.0.0.1:"));
    let on_shm = status
        .connections
        .iter()
        .find(|c| c.transport == "shm")
        .unwrap();
    assert_eq!(on_shm.peer.unwrap().pid, std::process::id());
}
