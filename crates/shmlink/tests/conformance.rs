//! One conformance suite, run on every transport (`shm`, `ux`, `tcp`, `tls`, and `auto`
//! both upgraded to shared memory and left on TCP): the guarantees a connection gives
//! whatever carries it. On `tls`, both ends use the test certificates ([`common::opts`]).

mod common;

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::*;
use shmlink::{Connection, ErrorKind, Listener, Options};

/// Instantiates every test of the suite for each transport: `shm::echo`, `ux::echo`, …
macro_rules! conformance {
    ($($transport:ident),*) => {$(
        mod $transport {
            conformance!(@tests $transport:
                echo, million_messages_in_order, sizes_keep_boundaries, zero_length_messages,
                nonblocking_sender_gets_would_block_and_loses_nothing,
                slow_receiver_makes_blocking_sender_wait, epoll_serves_64_connections,
                graceful_close_delivers_everything, too_small_buffer_keeps_the_message,
                oversized_message_is_refused, zero_copy_send_and_receive,
                counters_and_addresses, nonblocking_recv_and_fd_readiness,
                close_while_polled_wakes_with_end_of_stream,
                idle_wait_uses_no_cpu);
        }
    )*};
    (@tests $transport:ident: $($test:ident),*) => {$(
        #[test]
        fn $test() {
            super::$test(stringify!($transport));
        }
    )*};
}

conformance!(shm, ux, tcp, tls, auto, auto_tcp, auto_tls);

fn echo(t: &str) {
    let (mut c, mut s) = pair(t);
    c.send(b"ping").unwrap();
    let m = s.recv_vec().unwrap();
    s.send(&m).unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"ping");
}

fn million_messages_in_order(t: &str) {
    const N: u64 = 1_000_000;
    let (mut c, mut s) = pair(t);
    let sender = std::thread::spawn(move || {
        for seq in 0..N {
            c.send(&payload(seq, 12 + (seq % 53) as usize)).unwrap();
        }
        c.close().unwrap();
    });
    for seq in 0..N {
        let m = s.recv_ref().unwrap();
        verify(seq, 12 + (seq % 53) as usize, &m.bytes().to_vec());
    }
    expect_eos(&mut s);
    sender.join().unwrap();
}

fn sizes_keep_boundaries(t: &str) {
    const SIZES: &[usize] = &[1, 64, 4096, 1 << 20, 64 << 20];
    let (mut c, mut s) = pair(t);
    let echo = std::thread::spawn(move || {
        for _ in SIZES {
            let m = s.recv_vec().unwrap();
            s.send(&m).unwrap();
        }
    });
    // Send all first (the peer echoes concurrently), then check each comes back whole.
    for (i, &len) in SIZES.iter().enumerate() {
        c.send(&payload(i as u64, len)).unwrap();
        let back = c.recv_vec().unwrap();
        verify(i as u64, len, &back);
    }
    echo.join().unwrap();
}

fn zero_length_messages(t: &str) {
    let (mut c, mut s) = pair(t);
    c.send(b"").unwrap();
    c.send(b"x").unwrap();
    c.send(b"").unwrap();
    c.close().unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"");
    assert_eq!(s.recv_vec().unwrap(), b"x");
    let mut buf = [0u8; 4];
    assert_eq!(s.recv(&mut buf).unwrap(), 0);
    expect_eos(&mut s);
}

fn nonblocking_sender_gets_would_block_and_loses_nothing(t: &str) {
    let opts = opts(t).ring_size(64 << 10);
    let (mut c, mut s) = pair_with(t, &opts);
    c.set_nonblocking(true);
    let mut sent = 0u64;
    loop {
        match c.send(&payload(sent, 1000)) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent < 10_000_000, "sender never saw WouldBlock");
    }
    assert!(sent > 0);
    // `close` delivers what the full buffers could not take yet, so it needs a reader.
    let closer = std::thread::spawn(move || c.close().unwrap());
    for seq in 0..sent {
        verify(seq, 1000, &s.recv_vec().unwrap());
    }
    expect_eos(&mut s);
    closer.join().unwrap();
}

fn slow_receiver_makes_blocking_sender_wait(t: &str) {
    const N: u64 = 4096;
    const LEN: usize = 64 << 10; // 256 MiB in all: more than any socket or ring buffers
    let opts = opts(t).ring_size(256 << 10);
    let (mut c, mut s) = pair_with(t, &opts);
    let progress = Arc::new(AtomicU64::new(0));
    let p = progress.clone();
    let (tid_tx, tid_rx) = mpsc::channel();
    let sender = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        for seq in 0..N {
            c.send(&payload(seq, LEN)).unwrap();
            p.store(seq + 1, Ordering::Relaxed);
        }
    });
    // The sender must wait: asleep in the kernel with a count that no longer moves, short
    // of the end (a sender merely preempted is runnable, not asleep).
    let tid = tid_rx.recv().unwrap();
    let mut last = u64::MAX;
    let waits = wait_until(Duration::from_secs(60), || {
        let now = progress.load(Ordering::Relaxed);
        let asleep = sleeps_waiting_for_io(tid) && now == last;
        last = now;
        asleep
    });
    // What the ring and the socket buffers hold (here: 192 KiB on shm:, under 4 MiB on
    // TCP), far from all 256 MiB.
    let stalled_at = progress.load(Ordering::Relaxed);
    assert!(
        waits && stalled_at <= N / 4,
        "the sender never waited for the receiver ({stalled_at} of {N} sent)"
    );
    eprintln!("{t}: the sender waits after {stalled_at} messages of {LEN} bytes");
    for seq in 0..N {
        verify(seq, LEN, &s.recv_ref().unwrap().bytes().to_vec());
    }
    sender.join().unwrap();
}

fn epoll_serves_64_connections(t: &str) {
    const CLIENTS: usize = 64;
    const MSGS: u64 = 200;
    let (mut l, addr) = bind(t, &opts(t));
    l.set_nonblocking(true);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let addr = addr.clone();
            let o = opts(t);
            std::thread::spawn(move || {
                let mut c = Connection::connect(&addr, &o).unwrap();
                for seq in 0..MSGS {
                    c.send(&payload(seq, 16 + i)).unwrap();
                    verify(seq, 16 + i, &c.recv_vec().unwrap());
                }
                c.close().unwrap();
            })
        })
        .collect();

    // SAFETY: epoll_create1 with a valid flag.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0);
    let watch = |fd: i32, token: u64| {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: valid epoll fd, open fd, valid event.
        let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        assert_eq!(r, 0);
    };
    watch(l.as_raw_fd(), u64::MAX);
    let mut conns: HashMap<u64, (Connection, Vec<Vec<u8>>)> = HashMap::new();
    let (mut accepted, mut finished, mut next) = (0, 0, 0u64);
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
    while finished < CLIENTS {
        // SAFETY: `evs` has room for 64 events.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 64, 10_000) };
        assert!(n > 0, "epoll loop stalled");
        for ev in &evs[..n as usize] {
            let token = ev.u64;
            if token == u64::MAX {
                loop {
                    match l.accept() {
                        Ok(mut c) => {
                            c.set_nonblocking(true);
                            watch(c.as_raw_fd(), next);
                            conns.insert(next, (c, Vec::new()));
                            next += 1;
                            accepted += 1;
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                continue;
            }
            let Some((c, backlog)) = conns.get_mut(&token) else {
                continue;
            };
            // Echo everything readable; queue what cannot be sent yet.
            let mut done = false;
            loop {
                while let Some(m) = backlog.first() {
                    match c.send(m) {
                        Ok(()) => {
                            backlog.remove(0);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                match c.recv_vec() {
                    Ok(m) => backlog.push(m),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::EndOfStream => {
                        done = true;
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            if done {
                conns.remove(&token);
                finished += 1;
            }
        }
    }
    assert_eq!(accepted, CLIENTS);
    for c in clients {
        c.join().unwrap();
    }
    // SAFETY: closing the epoll fd we created.
    unsafe { libc::close(ep) };
}

fn graceful_close_delivers_everything(t: &str) {
    let (mut c, mut s) = pair(t);
    let closer = std::thread::spawn(move || {
        for seq in 0..1000 {
            c.send(&payload(seq, 100)).unwrap();
        }
        c.send(&payload(1000, 3 << 20)).unwrap();
        c.close().unwrap();
    });
    for seq in 0..1000 {
        verify(seq, 100, &s.recv_vec().unwrap());
    }
    verify(1000, 3 << 20, &s.recv_vec().unwrap());
    closer.join().unwrap();
    expect_eos(&mut s);
    expect_eos(&mut s);
    // Sending to a closed peer fails, it does not vanish silently forever.
    let err = (0..100_000)
        .find_map(|i| s.send(&payload(i, 1024)).err())
        .expect("sends to a closed peer must fail once buffers are full");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
}

fn too_small_buffer_keeps_the_message(t: &str) {
    let (mut c, mut s) = pair(t);
    c.send(&payload(7, 100)).unwrap();
    let mut small = [0u8; 10];
    let e = s.recv(&mut small).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
    let mut big = [0u8; 200];
    let n = s.recv(&mut big).unwrap();
    verify(7, 100, &big[..n]);
}

fn oversized_message_is_refused(t: &str) {
    let small = opts(t).max_msg_size(1000);
    let (mut c, mut s) = pair_with(t, &small);
    let e = c.send(&[0u8; 1001]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
    assert!(e.to_string().contains("1001"), "{e}");
    assert_eq!(c.max_msg_size(), 1000);
    c.send(&[1u8; 1000]).unwrap();
    assert_eq!(s.recv_vec().unwrap().len(), 1000);
    // A peer with a smaller limit caps what we may send.
    let (mut l, addr) = bind(t, &opts(t).max_msg_size(500));
    let o = opts(t);
    let client = std::thread::spawn(move || Connection::connect(&addr, &o));
    let _server = l.accept().unwrap();
    let mut c = client.join().unwrap().unwrap();
    assert_eq!(c.max_msg_size(), 500);
    assert_eq!(
        c.send(&[0u8; 501]).unwrap_err().kind(),
        ErrorKind::MessageTooLarge
    );
}

fn zero_copy_send_and_receive(t: &str) {
    const SIZES: [usize; 3] = [64, 100_000, 5 << 20];
    let (mut c, mut s) = pair(t);
    let sender = std::thread::spawn(move || {
        for (seq, len) in SIZES.into_iter().enumerate() {
            let mut buf = c.reserve(len).unwrap();
            assert_eq!(buf.len(), len);
            buf.copy_from_slice(&payload(seq as u64, len));
            assert_eq!(&buf[..], &payload(seq as u64, len)[..]);
            buf.commit().unwrap();
        }
        // A reservation dropped without commit sends nothing.
        drop(c.reserve(10).unwrap());
        c.send(b"after").unwrap();
    });
    for (seq, len) in SIZES.into_iter().enumerate() {
        verify(seq as u64, len, &s.recv_ref().unwrap().bytes().to_vec());
    }
    assert_eq!(s.recv_ref().unwrap().bytes().to_vec(), b"after");
    sender.join().unwrap();
}

fn counters_and_addresses(t: &str) {
    let (mut c, mut s) = pair(t);
    c.send(&[0u8; 10]).unwrap();
    c.send(&[0u8; 20]).unwrap();
    s.recv_vec().unwrap();
    s.recv_vec().unwrap();
    let cc = c.counters();
    assert_eq!((cc.msgs_out, cc.bytes_out), (2, 30));
    let sc = s.counters();
    assert_eq!((sc.msgs_in, sc.bytes_in), (2, 30));
    let t = path_of(t);
    assert_eq!(c.transport().as_str(), t);
    assert_eq!(s.transport().as_str(), t);
    assert!(
        c.peer_addr().starts_with(&format!("{t}:")),
        "{}",
        c.peer_addr()
    );
    assert!(
        s.local_addr().starts_with(&format!("{t}:")),
        "{}",
        s.local_addr()
    );
}

fn nonblocking_recv_and_fd_readiness(t: &str) {
    let (mut c, mut s) = pair(t);
    s.set_nonblocking(true);
    assert_eq!(s.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    let readable = |conn: &Connection, ms: i32| {
        let mut p = libc::pollfd {
            fd: conn.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    };
    assert!(!readable(&s, 0), "fd readable with nothing to do");
    c.send(b"wake").unwrap();
    assert!(readable(&s, 5000), "fd not readable after a send");
    assert_eq!(s.recv_vec().unwrap(), b"wake");
    assert_eq!(s.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    drop(c);
    assert!(readable(&s, 5000), "fd not readable after the peer closed");
    expect_eos(&mut s);
}

/// The fd becomes readable when the peer closes while we poll, and then `recv` reports
/// the end of the stream, not `WouldBlock` (a close announced in shared memory before the
/// socket closes must count).
fn close_while_polled_wakes_with_end_of_stream(t: &str) {
    for round in 0..40 {
        let (c, mut s) = pair(t);
        s.set_nonblocking(true);
        assert_eq!(s.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
        let (tid_tx, tid_rx) = mpsc::channel();
        let poller = std::thread::spawn(move || {
            let mut p = libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            tid_tx.send(gettid()).unwrap();
            // SAFETY: one valid pollfd.
            let ready = unsafe { libc::poll(&mut p, 1, 30_000) };
            assert_eq!(ready, 1, "never readable");
            s.recv_vec().map(drop).map_err(|e| e.kind())
        });
        // Close once the poller sleeps in poll.
        let tid = tid_rx.recv().unwrap();
        assert!(
            wait_until(Duration::from_secs(30), || sleeps_waiting_for_io(tid)),
            "round {round}: the poller never slept in poll"
        );
        if round % 2 == 0 {
            drop(c);
        } else {
            c.close().unwrap();
        }
        assert_eq!(
            poller.join().unwrap(),
            Err(ErrorKind::EndOfStream),
            "round {round}"
        );
    }
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a valid timespec pointer.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn idle_wait_uses_no_cpu(t: &str) {
    // A receiver blocked for 500 ms spins for its budget (50 µs by default), then sleeps:
    // its thread must use a tiny fraction of the wall time. (A busy wait would use all of
    // it; the bound leaves a wide margin for a noisy machine.)
    let (mut c, mut s) = pair(t);
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let before = thread_cpu();
        tx.send(()).unwrap();
        let m = s.recv_vec().unwrap();
        (m, thread_cpu() - before)
    });
    rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(500)); // the idle period being measured
    c.send(b"wake").unwrap();
    let (m, cpu) = waiter.join().unwrap();
    assert_eq!(m, b"wake");
    eprintln!("{t}: receiver used {cpu:?} of CPU while idle for 500 ms");
    assert!(
        cpu < Duration::from_millis(100),
        "{t}: idle wait burned {cpu:?}"
    );
}

#[test]
fn listener_fd_is_readable_when_a_client_waits() {
    for t in TRANSPORTS {
        let (mut l, addr) = bind(t, &opts(t));
        l.set_nonblocking(true);
        assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
        let o = opts(t);
        let client = std::thread::spawn(move || Connection::connect(&addr, &o));
        let mut p = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let accepted = wait_until(Duration::from_secs(5), || {
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 100) };
            l.accept().is_ok()
        });
        assert!(accepted, "{t}: listener never accepted");
        client.join().unwrap().unwrap();
    }
}

#[test]
fn bad_addresses_and_options_are_typed_errors() {
    let o = Options::default();
    for (addr, kind) in [
        ("bogus:x", ErrorKind::InvalidAddress),
        ("shm:", ErrorKind::InvalidAddress),
        ("ux:", ErrorKind::InvalidAddress),
        ("tcp:nope", ErrorKind::InvalidAddress),
        ("tls:nope", ErrorKind::InvalidAddress),
    ] {
        let e = Connection::connect(addr, &o).unwrap_err();
        assert_eq!(e.kind(), kind, "{addr}: {e}");
        assert!(e.to_string().contains(addr), "{e}");
        let e = Listener::bind(addr, &o).unwrap_err();
        assert_eq!(e.kind(), kind, "{addr}: {e}");
    }
    let e = Connection::connect("shm:x", &Options::default().ring_size(0)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("ring_size"), "{e}");
    for t in TRANSPORTS {
        let addr = match *t {
            "tcp" | "tls" => format!("{t}:127.0.0.1:1"),
            "auto" | "auto_tcp" | "auto_tls" => "auto:127.0.0.1:1".to_string(),
            _ => fresh_addr(t),
        };
        let e = Connection::connect(&addr, &opts(t)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{addr}: {e}");
        assert!(e.to_string().contains(&addr), "{e}");
    }
}

#[test]
fn binding_a_live_address_twice_is_addr_in_use() {
    for t in ["shm", "ux"] {
        let (_l, addr) = bind(t, &Options::default());
        let e = Listener::bind(&addr, &Options::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddrInUse, "{t}: {e}");
    }
}
