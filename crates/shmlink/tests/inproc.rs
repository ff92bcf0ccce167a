//! In-process `shm:` connections (`Options::in_process`): the short circuit is taken only
//! when both ends ask for it, needs no accepting thread to connect, and a listener that
//! goes away refuses new clients and resets those it never accepted. The conformance
//! suite (`tests/conformance.rs`, transport `inproc`) covers the connection's semantics.

mod common;

use std::time::Duration;

use common::*;
use shmlink::{Connection, ErrorKind, Listener, Options, Transport};

fn inproc() -> Options {
    Options::default().in_process(true)
}

/// The client completes its connect without the listener taking part (no handshake to
/// answer): the connection waits in the listener's inbox until `accept`.
#[test]
fn connect_needs_no_accepting_thread() {
    let mut l = Listener::bind(&fresh_addr("shm"), &inproc()).unwrap();
    let addr = l.local_addr();
    let mut c = Connection::connect(&addr, &inproc()).unwrap();
    c.send(b"early").unwrap();
    let mut s = l.accept().unwrap();
    assert_eq!(s.transport(), Transport::Shm);
    assert_eq!(s.recv_vec().unwrap(), b"early");
    s.send(b"back").unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"back");
}

/// In-process is the default: two ends of one process with default options connect
/// without the listener taking part, and the connection carries no kernel object
/// (no memfd in this process's descriptors).
#[test]
fn default_options_connect_in_process() {
    let memfds = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t.to_string_lossy().starts_with("/memfd:shmlink"))
            .count()
    };
    assert!(Options::default().configured_in_process());
    let before = memfds();
    let mut l = Listener::bind(&fresh_addr("shm"), &Options::default()).unwrap();
    let addr = l.local_addr();
    let mut c = Connection::connect(&addr, &Options::default()).unwrap();
    c.send(b"default").unwrap();
    let mut s = l.accept().unwrap();
    assert_eq!(s.transport(), Transport::Shm);
    assert_eq!(s.recv_vec().unwrap(), b"default");
    s.send(b"back").unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"back");
    assert_eq!(memfds(), before, "an in-process connection made a memfd");
}

/// Also at a name in the rendezvous directory (`shm:NAME`), from another thread.
#[test]
fn default_options_connect_in_process_by_name() {
    let addr = format!("shm:shmlink-inproc-name-{}", std::process::id());
    let mut l = Listener::bind(&addr, &Options::default()).unwrap();
    let a = addr.clone();
    let t = std::thread::spawn(move || {
        let mut c = Connection::connect(&a, &Options::default()).unwrap();
        c.send(b"n").unwrap();
        c
    });
    // Connected without the listener's help: in-process.
    let mut c = t.join().unwrap();
    let mut s = l.accept().unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"n");
    s.send(b"m").unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"m");
}

/// An `auto:` listener's upgrade socket is never in-process: a `shm:` client of this
/// process that finds it goes through its handshake, which asks for a token.
#[test]
fn auto_upgrade_socket_is_not_in_process() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let port = l.local_addr().rsplit(':').next().unwrap().to_string();
    let prefix = format!("auto-{port}-");
    let sock = std::fs::read_dir(shmlink::rendezvous_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .expect("the upgrade socket")
        .path();
    let mut l = l;
    l.set_nonblocking(true);
    let addr = format!("shm:{}", sock.display());
    let o = Options::default().connect_timeout(Duration::from_secs(5));
    let t = std::thread::spawn(move || Connection::connect(&addr, &o));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !t.is_finished() && std::time::Instant::now() < deadline {
        // The listener answers handshakes while it is polled.
        let _ = l.accept();
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = t.join().unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{e}");
    assert!(e.to_string().contains("upgrade"), "{e}");
}

/// At an abstract name too.
#[test]
fn abstract_names_connect_in_process() {
    let addr = format!("shm:@shmlink-inproc-test-{}", std::process::id());
    let mut l = Listener::bind(&addr, &inproc()).unwrap();
    let mut c = Connection::connect(&addr, &inproc()).unwrap();
    let mut s = l.accept().unwrap();
    c.send(b"x").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"x");
}

/// A client that does not ask for it goes through the kernel (a handshake the listener
/// must answer), and so does one whose listener did not ask for it.
#[test]
fn both_ends_must_ask() {
    for (server, client) in [(inproc(), kernel_opts()), (kernel_opts(), inproc())] {
        let (mut l, addr) = bind("shm", &server);
        let t = std::thread::spawn(move || Connection::connect(&addr, &client).unwrap());
        // The kernel path: the connect cannot complete until the listener steps.
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "connected without a handshake");
        let mut s = l.accept().unwrap();
        let mut c = t.join().unwrap();
        c.send(b"k").unwrap();
        assert_eq!(s.recv_vec().unwrap(), b"k");
    }
}

/// A listener dropped: new clients are refused, and a client whose connection was never
/// accepted sees a reset.
#[test]
fn dropped_listener_refuses_and_resets_the_unaccepted() {
    let l = Listener::bind(&fresh_addr("shm"), &inproc()).unwrap();
    let addr = l.local_addr();
    let mut waiting = Connection::connect(&addr, &inproc()).unwrap();
    drop(l);
    let e = waiting.recv_vec().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    let e = Connection::connect(&addr, &inproc()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
}

/// A blocking round trip between two threads, many times over: park/unpark loses no
/// wake-up (the blocking policy parks on every wait).
#[test]
fn blocking_policy_round_trips() {
    let o = inproc().wait_policy(shmlink::WaitPolicy::BLOCKING);
    let (mut l, addr) = bind("shm", &o);
    let mut c = Connection::connect(&addr, &o).unwrap();
    let mut s = l.accept().unwrap();
    let echo = std::thread::spawn(move || {
        while let Ok(m) = s.recv_vec() {
            s.send(&m).unwrap();
        }
    });
    for i in 0..20_000u64 {
        c.send(&i.to_le_bytes()).unwrap();
        assert_eq!(c.recv_vec().unwrap(), i.to_le_bytes());
    }
    c.close().unwrap();
    echo.join().unwrap();
}

/// Echo through `shmlink::tokio` over in-process connections (non-blocking calls, the fd
/// in tokio's edge-triggered reactor).
#[test]
fn tokio_echo() {
    use shmlink::tokio::{Connection as AConn, Listener as AListener};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            const N: u64 = 8;
            let o = inproc().ring_size(4096);
            let (l, addr) = bind("shm", &o);
            let mut l = AListener::from_std(l, Duration::from_micros(20)).unwrap();
            let mut tasks = Vec::new();
            for i in 0..N {
                let (addr, o) = (addr.clone(), o.clone());
                tasks.push(tokio::spawn(async move {
                    let mut c = AConn::connect(&addr, &o).await.unwrap();
                    for seq in 0..200u64 {
                        let len = ((seq * 37 + i) % 6000) as usize;
                        c.send(&payload(seq, len)).await.unwrap();
                        let back = c.recv_vec().await.unwrap();
                        verify(seq, len, &back);
                    }
                    c.close().await.unwrap();
                }));
            }
            for _ in 0..N {
                let s = l.accept().await.unwrap();
                tasks.push(tokio::spawn(echo_until_end(s)));
            }
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await
        .expect("hung: a lost wake-up");
    });
}
