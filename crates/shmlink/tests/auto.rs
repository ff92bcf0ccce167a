//! `auto:` beyond the conformance suite: the upgrade goes only to the listener the client
//! reached over TCP (another server's socket at the same path, a wrong or replayed token
//! are refused and the connection stays on TCP), and clients racing a listener that
//! restarts never hang and never end up on different paths at the two ends.

mod common;

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener, Options};
use shmlink_testkit::{fake_listener, raw_handshake, AutoMsg, HandshakePacket, HandshakeParams};

/// The upgrade socket of the `auto:` listener bound at `addr`.
fn upgrade_socket(addr: &str) -> PathBuf {
    let port = addr.rsplit(':').next().unwrap();
    let prefix = format!("auto-{port}-");
    std::fs::read_dir(shmlink::rendezvous_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .unwrap_or_else(|| panic!("no upgrade socket for {addr}"))
}

/// Serves `l` on a thread: every connection answers each message with its transport's
/// name, until the peer leaves. Stops accepting when the flag is set.
fn serve(mut l: Listener) -> (Arc<AtomicBool>, JoinHandle<Vec<&'static str>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    l.set_nonblocking(true);
    let t = std::thread::spawn(move || {
        let mut paths = Vec::new();
        while !flag.load(Ordering::Relaxed) {
            match l.accept() {
                Ok(c) => {
                    paths.push(c.transport().as_str());
                    std::thread::spawn(move || answer_with_transport(c));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        paths
    });
    (stop, t)
}

/// Stops a [`serve`] thread: the transports of the connections it accepted.
fn stop_serving(stop: &AtomicBool, server: JoinHandle<Vec<&'static str>>) -> Vec<&'static str> {
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap()
}

/// Decides to stay on TCP on the negotiation `c` (a raw `tcp:` connection to an `auto:`
/// listener), then asserts that the listener handed out the TCP connection.
fn stay_on_tcp(mut c: Connection) {
    c.send(&AutoMsg::Decision { upgraded: false }.encode())
        .unwrap();
    assert_served_over_tcp(c);
}

/// Asserts that the server answers `c` over TCP, and closes it.
fn assert_served_over_tcp(mut c: Connection) {
    c.send(b"which?").unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"tcp");
}

fn answer_with_transport(mut c: Connection) {
    while c.recv_vec().is_ok() {
        if c.send(c.transport().as_str().as_bytes()).is_err() {
            break;
        }
    }
}

const PARAMS: HandshakeParams = HandshakeParams {
    features: 0,
    ring_c2s: 64 << 10,
    ring_s2c: 64 << 10,
    max_msg: 1 << 20,
};

type Ticket = ([u8; 16], [u8; 16]);

/// Speaks the client's side of the negotiation by hand over a `tcp:` connection to the
/// `auto:` listener at `addr`; returns the connection and the offer.
fn offer_from(addr: &str) -> (Connection, [u8; 16], [u8; 16], String) {
    let (c, token, proof, path, _) = offer_with_ticket(addr);
    (c, token, proof, path)
}

/// [`offer_from`], with the offer's resumption ticket.
fn offer_with_ticket(addr: &str) -> (Connection, [u8; 16], [u8; 16], String, Option<Ticket>) {
    let tcp = addr.replacen("auto:", "tcp:", 1);
    let mut c = Connection::connect(&tcp, &Options::default()).unwrap();
    let hello = AutoMsg::Hello {
        boot_id: shmlink_testkit::boot_id(),
    };
    c.send(&hello.encode()).unwrap();
    match AutoMsg::decode(&c.recv_vec().unwrap()).unwrap() {
        AutoMsg::Offer {
            token,
            proof,
            path,
            ticket,
            ..
        } => (c, token, proof, path, ticket),
        other => panic!("expected an offer, got {other:?}"),
    }
}

/// Presents `token` at the upgrade socket `path`; returns the answer.
fn present(path: &str, token: [u8; 16]) -> HandshakePacket {
    let hello = HandshakePacket::Upgrade(PARAMS, token).encode();
    let (answer, _fds) = raw_handshake(&format!("shm:{path}"), &hello).unwrap();
    HandshakePacket::decode(&answer).unwrap()
}

/// Presents resumption `ticket` at the upgrade socket `path`; returns the answer.
fn resume_with(path: &str, ticket: [u8; 16]) -> HandshakePacket {
    let hello = HandshakePacket::Resume(PARAMS, ticket).encode();
    let (answer, _fds) = raw_handshake(&format!("shm:{path}"), &hello).unwrap();
    HandshakePacket::decode(&answer).unwrap()
}

fn refused_because(p: &HandshakePacket, why: &str) -> bool {
    matches!(p, HandshakePacket::Refuse(_, reason) if reason.contains(why))
}

#[test]
fn tokens_are_checked_and_single_use() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    let (stop, server) = serve(l);
    let (c, token, proof, path) = offer_from(&addr);

    let mut wrong = token;
    wrong[0] ^= 1;
    assert!(refused_because(
        &present(&path, wrong),
        "unknown or already used"
    ));
    // A plain hello is not an upgrade.
    let hello = HandshakePacket::Hello(PARAMS).encode();
    let (answer, _) = raw_handshake(&format!("shm:{path}"), &hello).unwrap();
    let answer = HandshakePacket::decode(&answer).unwrap();
    assert!(
        refused_because(&answer, "expected an upgrade"),
        "{answer:?}"
    );
    // The right token is answered with the proof, once.
    match present(&path, token) {
        HandshakePacket::Upgraded(_, p) => assert_eq!(p, proof),
        other => panic!("expected the upgrade, got {other:?}"),
    }
    assert!(refused_because(
        &present(&path, token),
        "unknown or already used"
    ));

    // The client decides to stay on TCP: the listener hands out the TCP connection.
    stay_on_tcp(c);
    assert_eq!(stop_serving(&stop, server), ["tcp"]);
}

#[test]
fn a_claimed_upgrade_that_never_happened_is_dropped() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    let (stop, server) = serve(l);
    let (mut c, ..) = offer_from(&addr);
    c.send(&AutoMsg::Decision { upgraded: true }.encode())
        .unwrap();
    let e = c.recv_vec().unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::EndOfStream | ErrorKind::ConnectionReset
        ),
        "{e}"
    );
    stop.store(true, Ordering::Relaxed);
    assert!(server.join().unwrap().is_empty());
}

#[test]
fn another_servers_socket_at_the_same_path_is_not_taken() {
    let a = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let b = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let (a_addr, b_addr) = (a.local_addr(), b.local_addr());
    // What a client finds at A's path is B (as if another container's directory were
    // mounted there).
    let a_socket = upgrade_socket(&a_addr);
    std::fs::rename(upgrade_socket(&b_addr), &a_socket).unwrap();
    let (stop_a, server_a) = serve(a);
    let (stop_b, server_b) = serve(b);

    let c = Connection::connect(&a_addr, &Options::default()).unwrap();
    assert_eq!(c.transport(), shmlink::Transport::Tcp);
    assert_served_over_tcp(c);
    stop_a.store(true, Ordering::Relaxed);
    stop_b.store(true, Ordering::Relaxed);
    assert_eq!(server_a.join().unwrap(), ["tcp"]);
    assert!(
        server_b.join().unwrap().is_empty(),
        "B handed out a connection"
    );
    // Neither listener owns the moved socket file any more.
    std::fs::remove_file(a_socket).unwrap();
}

#[test]
fn a_listener_removes_upgrade_sockets_that_dead_listeners_left_on_its_port() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    drop(l);
    // A listener of this port that died: its socket file stays, nobody listens.
    let port = addr.rsplit(':').next().unwrap();
    let stale = shmlink::rendezvous_dir().join(format!("auto-{port}-deadbeef.sock"));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let l = Listener::bind(&addr, &Options::default()).unwrap();
    assert!(!stale.exists(), "stale upgrade socket left in place");
    let live = upgrade_socket(&addr);
    drop(l);
    assert!(!live.exists());
}

#[test]
fn a_listener_whose_upgrade_socket_is_gone_serves_over_tcp() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    std::fs::remove_file(upgrade_socket(&addr)).unwrap();
    let (stop, server) = serve(l);
    let c = Connection::connect(&addr, &Options::default()).unwrap();
    assert_served_over_tcp(c);
    assert_eq!(stop_serving(&stop, server), ["tcp"]);
}

#[test]
fn garbage_and_silent_clients_do_not_stop_the_listener() {
    let opts = Options::default().handshake_timeout(Duration::from_millis(200));
    let l = Listener::bind("auto:127.0.0.1:0", &opts).unwrap();
    let addr = l.local_addr();
    let (stop, server) = serve(l);
    let tcp = addr.replacen("auto:", "tcp:", 1);
    let mut garbage = Connection::connect(&tcp, &Options::default()).unwrap();
    garbage.send(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let _silent = Connection::connect(&tcp, &Options::default()).unwrap();
    let e = garbage.recv_vec().unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::EndOfStream | ErrorKind::ConnectionReset
        ),
        "{e}"
    );
    let mut c = Connection::connect(&addr, &Options::default()).unwrap();
    c.send(b"which?").unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"shm");
    drop(c);
    stop.store(true, Ordering::Relaxed);
    assert_eq!(server.join().unwrap(), ["shm"]);
}

/// Receives one message within `limit`, or says why not.
fn recv_within(c: &mut Connection, limit: Duration) -> Result<Vec<u8>, String> {
    c.set_nonblocking(true);
    let deadline = Instant::now() + limit;
    loop {
        match c.recv_vec() {
            Ok(m) => return Ok(m),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(!left.is_zero(), "no answer within {limit:?}: a hang");
                let mut p = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(&c.as_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, left.as_millis().min(100) as i32) };
            }
            Err(e) => return Err(format!("{:?}", e.kind())),
        }
    }
}

#[test]
fn clients_racing_a_restarting_listener_never_hang_or_split() {
    const CLIENTS: usize = 2;
    const CONNECTS: usize = 600; // per client
    let first = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = first.local_addr();
    let done = Arc::new(AtomicUsize::new(0));

    // The listener: up for a few ms, down for a few ms, again and again.
    let d = done.clone();
    let a = addr.clone();
    let restarts = std::thread::spawn(move || {
        let mut l = Some(first);
        let mut restarts = 0;
        while d.load(Ordering::Relaxed) < CLIENTS {
            let (stop, server) = serve(l.take().unwrap());
            std::thread::sleep(Duration::from_millis(20));
            stop.store(true, Ordering::Relaxed);
            server.join().unwrap(); // the listener is dropped here
            std::thread::sleep(Duration::from_millis(2));
            let deadline = Instant::now() + Duration::from_secs(5);
            l = loop {
                match Listener::bind(&a, &Options::default()) {
                    Ok(l) => break Some(l),
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("rebind: {e}");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("rebind {a}: {e}"),
                }
            };
            restarts += 1;
        }
        restarts
    });

    let opts = Options::default().connect_timeout(Duration::from_secs(2));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (addr, opts, done) = (addr.clone(), opts.clone(), done.clone());
            std::thread::spawn(move || {
                let mut tally = std::collections::BTreeMap::<String, usize>::new();
                for _ in 0..CONNECTS {
                    let t0 = Instant::now();
                    let outcome = match Connection::connect(&addr, &opts) {
                        Ok(mut c) => {
                            let mine = c.transport();
                            match c.send(b"which?") {
                                Ok(()) => match recv_within(&mut c, Duration::from_secs(5)) {
                                    // Both ends on the same path, whichever it is.
                                    Ok(theirs) => {
                                        assert_eq!(
                                            theirs,
                                            mine.as_str().as_bytes(),
                                            "split connection"
                                        );
                                        format!("ok {mine}")
                                    }
                                    Err(kind) => format!("lost {kind}"),
                                },
                                Err(e) => format!("send {:?}", e.kind()),
                            }
                        }
                        Err(e) => {
                            // Nobody listens right now: try again a moment later.
                            std::thread::sleep(Duration::from_millis(1));
                            format!("connect {:?}", e.kind())
                        }
                    };
                    assert!(
                        t0.elapsed() < Duration::from_secs(8),
                        "{outcome} took too long"
                    );
                    *tally.entry(outcome).or_default() += 1;
                }
                done.fetch_add(1, Ordering::Relaxed);
                tally
            })
        })
        .collect();
    let mut total = std::collections::BTreeMap::<String, usize>::new();
    for c in clients {
        for (k, v) in c.join().unwrap() {
            *total.entry(k).or_default() += v;
        }
    }
    let restarts = restarts.join().unwrap();
    eprintln!(
        "{} connects over {restarts} restarts: {total:?}",
        CLIENTS * CONNECTS
    );
    assert!(restarts >= 10, "{restarts} restarts");
    assert!(total.get("ok shm").copied().unwrap_or(0) > 0, "{total:?}");
    for outcome in total.keys() {
        assert!(
            outcome.starts_with("ok ")
                || outcome.contains("ConnectionRefused")
                || outcome.contains("ConnectionReset")
                || outcome.contains("EndOfStream")
                || outcome.contains("TimedOut"),
            "unexpected outcome {outcome}: {total:?}"
        );
    }
}

#[test]
fn with_tls_options_the_negotiation_runs_over_tls_and_still_upgrades() {
    let opts = common::opts("tls");
    let l = Listener::bind("auto:127.0.0.1:0", &opts).unwrap();
    let addr = l.local_addr();
    let (stop, server) = serve(l);
    // A plain TCP client cannot even start the negotiation.
    let tcp = addr.replacen("auto:", "tcp:", 1);
    assert!(Connection::connect(&tcp, &Options::default()).is_err());
    // Every connect runs the TLS handshake: no resumption ticket is issued or used, so
    // each one is a TCP connection of its own.
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let before = tcp_clients_of(port);
    connect_over_shm(&addr, &opts, 3);
    assert!(tcp_clients_of(port).difference(&before).count() >= 1);
    stop.store(true, Ordering::Relaxed);
    assert_eq!(server.join().unwrap(), ["shm"; 3]);
}

/// Waits until `fd` is readable or `timeout` passes; true if readable.
fn readable_within(fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1
}

/// Regression: a non-blocking `auto:` listener moves its negotiations on only inside
/// `accept`, so its fd must become readable when a negotiation's deadline passes, or an
/// event loop would keep a silent client until something else happened.
#[test]
fn an_event_loop_hears_a_negotiation_deadline() {
    let opts = Options::default().handshake_timeout(Duration::from_millis(200));
    let mut l = Listener::bind("auto:127.0.0.1:0", &opts).unwrap();
    l.set_nonblocking(true);
    let tcp = l.local_addr().replacen("auto:", "tcp:", 1);
    // A client that completes the framed hello, then never negotiates: it reads until
    // its connection ends.
    let silent = std::thread::spawn(move || {
        let mut c = Connection::connect(&tcp, &Options::default()).unwrap();
        loop {
            if let Err(e) = c.recv_vec() {
                return e.kind();
            }
        }
    });
    let started = Instant::now();
    // An event loop: wait for the fd, accept. The client's connection and its hello are
    // events at once; after them only the deadline (200 ms) can be one.
    loop {
        assert!(
            readable_within(l.as_fd(), Duration::from_secs(5)),
            "the listener's fd stayed quiet past the negotiation deadline"
        );
        assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
        if started.elapsed() >= Duration::from_millis(150) {
            break;
        }
    }
    // That accept dropped the client (a closed or a reset connection on its side).
    let kind = silent.join().unwrap();
    assert!(
        matches!(kind, ErrorKind::EndOfStream | ErrorKind::ConnectionReset),
        "{kind:?}"
    );
    // With no negotiation left the timer is disarmed: the fd is quiet again.
    assert!(!readable_within(l.as_fd(), Duration::from_millis(300)));
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a valid timespec pointer.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A blocking `accept` with a negotiation open polls for the wait policy's budget, then
/// sleeps until the negotiation's deadline: a client that goes silent costs the listener
/// (nearly) no CPU, with the default policy and with `WaitPolicy::BLOCKING` (which polls
/// not at all) — silent after the framed hello, or after claiming an upgrade it never
/// made and dropping its TCP connection (whose end of stream must not keep the listener
/// awake).
#[test]
fn a_silent_negotiation_costs_a_blocking_accept_no_cpu() {
    for (name, wait) in [
        ("default", shmlink::WaitPolicy::default()),
        ("blocking", shmlink::WaitPolicy::BLOCKING),
    ] {
        for claimed in [false, true] {
            let opts = Options::default()
                .handshake_timeout(Duration::from_millis(500))
                .wait_policy(wait);
            let mut l = Listener::bind("auto:127.0.0.1:0", &opts).unwrap();
            let addr = l.local_addr();
            let accepting = std::thread::spawn(move || {
                let before = thread_cpu();
                let c = l.accept().unwrap();
                (c.transport().as_str(), thread_cpu() - before)
            });
            let silent = if claimed {
                let (mut c, ..) = offer_from(&addr);
                c.send(&AutoMsg::Decision { upgraded: true }.encode())
                    .unwrap();
                None // dropped: end of stream
            } else {
                let tcp = addr.replacen("auto:", "tcp:", 1);
                Some(Connection::connect(&tcp, &Options::default()).unwrap())
            };
            std::thread::sleep(Duration::from_millis(700));
            drop(silent);
            let mut c = Connection::connect(&addr, &Options::default()).unwrap();
            let (transport, cpu) = accepting.join().unwrap();
            assert_eq!(transport, "shm");
            eprintln!("{name}, claimed {claimed}: the accepting thread used {cpu:?} of CPU");
            assert!(
                cpu < Duration::from_millis(150),
                "{name}, claimed {claimed}: accept burned {cpu:?}"
            );
            c.send(b"done").unwrap();
        }
    }
}

/// The client ports of the TCP connections to local port `port` that the kernel still
/// knows (a closed connection stays in TIME_WAIT on one side for a minute, so a
/// connection made since an earlier call shows up as a port that call did not see,
/// unless it reused a port in TIME_WAIT, which Linux may do on loopback: a count of new
/// ports is a lower bound).
fn tcp_clients_of(port: u16) -> BTreeSet<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port_of = |field: &str| u16::from_str_radix(field.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote) = (port_of(f[1]), port_of(f[2]));
            match f[3] {
                "0A" => None, // listening
                _ if local == port => Some(remote),
                _ if remote == port => Some(local),
                _ => None,
            }
        })
        .collect()
}

/// Connects to `addr` `n` times, each time one round trip and a close; asserts every
/// connection ran on shared memory at both ends.
fn connect_over_shm(addr: &str, opts: &Options, n: usize) {
    for _ in 0..n {
        let mut c = Connection::connect(addr, opts).unwrap();
        assert_eq!(c.transport(), shmlink::Transport::Shm);
        c.send(b"which?").unwrap();
        assert_eq!(c.recv_vec().unwrap(), b"shm");
    }
}

#[test]
fn a_client_that_reached_a_listener_before_resumes_without_tcp() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let (stop, server) = serve(l);

    // Without tickets, every connect negotiates over a TCP connection of its own.
    let before = tcp_clients_of(port);
    connect_over_shm(&addr, &Options::default().auto_resume(false), 3);
    assert!(tcp_clients_of(port).difference(&before).count() >= 1);

    // The first connect negotiates and brings a ticket; the next ones use the ticket
    // each answer renews, and open no TCP connection.
    connect_over_shm(&addr, &Options::default(), 1);
    let after_first = tcp_clients_of(port);
    connect_over_shm(&addr, &Options::default(), 20);
    let new: Vec<u16> = tcp_clients_of(port)
        .difference(&after_first)
        .copied()
        .collect();
    assert!(new.is_empty(), "new TCP connections from ports {new:?}");
    assert_eq!(stop_serving(&stop, server), ["shm"; 24]);
}

#[test]
fn resumption_tickets_are_checked_and_single_use() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    let (stop, server) = serve(l);
    let (c, _, _, path, ticket) = offer_with_ticket(&addr);
    let (ticket, proof) = ticket.expect("the offer carries a ticket");
    stay_on_tcp(c);

    let mut wrong = ticket;
    wrong[0] ^= 1;
    assert!(refused_because(
        &resume_with(&path, wrong),
        "resumption ticket"
    ));
    // An upgrade token is not a ticket, nor a ticket a token.
    assert!(refused_because(
        &present(&path, ticket),
        "unknown or already used"
    ));
    // The right ticket is answered with its proof and the next ticket, once.
    let next = match resume_with(&path, ticket) {
        HandshakePacket::Resumed(_, p, next, next_proof) => {
            assert_eq!(p, proof);
            assert_ne!(next, ticket);
            (next, next_proof)
        }
        other => panic!("expected the resumption, got {other:?}"),
    };
    assert!(refused_because(&resume_with(&path, ticket), "already used"));
    match resume_with(&path, next.0) {
        HandshakePacket::Resumed(_, p, ..) => assert_eq!(p, next.1),
        other => panic!("expected the resumption, got {other:?}"),
    }
    // A ticket the listener does not know is routine (the client negotiates over TCP):
    // `shmlink ls` counts the token presented as a ticket's refusal, not the two tickets.
    let (answer, _) =
        raw_handshake(&format!("shm:{path}"), &HandshakePacket::Query.encode()).unwrap();
    let HandshakePacket::Status(status) = HandshakePacket::decode(&answer).unwrap() else {
        panic!("{answer:?}")
    };
    assert_eq!(status.refusals.total(), 1, "{:?}", status.refusals);
    // The raw resumptions never sent a segment: nothing but the TCP connection was
    // completed and handed out.
    assert_eq!(stop_serving(&stop, server), ["tcp"]);
}

#[test]
fn a_listener_without_tickets_issues_none() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default().auto_resume(false)).unwrap();
    let addr = l.local_addr();
    let (stop, server) = serve(l);
    let (c, _, _, path, ticket) = offer_with_ticket(&addr);
    assert_eq!(ticket, None);
    assert!(refused_because(
        &resume_with(&path, [1; 16]),
        "issues no resumption tickets"
    ));
    stay_on_tcp(c);
    assert_eq!(stop_serving(&stop, server), ["tcp"]);
}

#[test]
fn a_ticket_for_a_listener_that_restarted_costs_one_try_then_tcp() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    let (stop, server) = serve(l);
    connect_over_shm(&addr, &Options::default(), 2);
    // Stopping drops the listener; then the same port again: a new upgrade socket, which
    // never issued this process's ticket.
    assert_eq!(stop_serving(&stop, server), ["shm"; 2]);
    let l = Listener::bind(&addr, &Options::default()).unwrap();
    let (stop, server) = serve(l);
    connect_over_shm(&addr, &Options::default(), 3);
    assert_eq!(stop_serving(&stop, server), ["shm"; 3]);
}

#[test]
fn a_socket_that_answers_a_ticket_without_its_proof_is_not_taken() {
    let l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
    let addr = l.local_addr();
    let socket = upgrade_socket(&addr);
    let (stop, server) = serve(l);
    connect_over_shm(&addr, &Options::default(), 1); // brings a ticket
                                                     // Another server at the listener's socket path answers the ticket with a proof of
                                                     // its own; before it answers, the listener's socket is back at the path (the
                                                     // client's negotiation over TCP that follows upgrades there, unless the other server,
                                                     // leaving, removed the path first: then it stays on TCP).
    let real = socket.with_extension("real");
    std::fs::rename(&socket, &real).unwrap();
    let (heard, hello) = std::sync::mpsc::channel();
    let path = socket.clone();
    let fake = fake_listener(&format!("shm:{}", socket.display()), move |packet| {
        heard.send(packet.to_vec()).unwrap();
        std::fs::rename(&real, &path).unwrap();
        let answer = HandshakePacket::Resumed(PARAMS, [7; 16], [8; 16], [9; 16]);
        (answer.encode(), Vec::new())
    })
    .unwrap();
    let mut c = Connection::connect(&addr, &Options::default()).unwrap();
    assert!(matches!(
        HandshakePacket::decode(&hello.recv().unwrap()).unwrap(),
        HandshakePacket::Resume(..)
    ));
    let path = c.transport().as_str();
    c.send(b"which?").unwrap();
    assert_eq!(c.recv_vec().unwrap(), path.as_bytes());
    drop(c);
    fake.join().unwrap();
    assert_eq!(stop_serving(&stop, server), ["shm", path]);
}
