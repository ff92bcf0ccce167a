//! No lost wake-ups for event loops: a non-blocking `shm:` connection whose calls return
//! `WouldBlock` must make its fd readable once any of them may progress, whichever call
//! came last. One fd carries doorbells for both directions (data for our receive ring,
//! room in our send ring); a call that drains doorbells for its own direction must not
//! swallow one the other direction still waits for (docs/design.md §4.4).

mod common;

use std::os::fd::AsRawFd;
use std::time::Duration;

use common::*;
use shmlink::{Connection, ErrorKind};

/// A receive that found nothing, then a send into a full ring: the data that arrived in
/// between must still make the fd readable, although the send drained doorbells.
#[test]
fn a_full_send_does_not_swallow_the_data_doorbell() {
    let opts = kernel_opts().ring_size(4096);
    let (mut client, mut server) = pair_with("shm", &opts);
    server.set_nonblocking(true);
    assert_eq!(server.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    // Data arrives; its doorbell sits on the server's fd.
    client.send(b"hello").unwrap();
    assert!(readable_within(server.as_raw_fd(), 10_000));
    // The server's event loop sends first, until its ring is full (the client reads
    // nothing, so no room will come).
    let mut sent = 0;
    loop {
        match server.send(&[7u8; 1000]) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
        assert!(sent < 100, "a 4 KiB ring took 100 KB");
    }
    assert!(
        readable_within(server.as_raw_fd(), 1000),
        "the fd went quiet with a message waiting: the send swallowed its doorbell"
    );
    assert_eq!(server.recv_vec().unwrap(), b"hello");
    for _ in 0..sent {
        assert_eq!(client.recv_vec().unwrap(), [7u8; 1000]);
    }
}

/// An event loop that woke for another connection withdraws the wait it announced here:
/// the peer's next message then rings no doorbell (the fd stays quiet, the message is in
/// the ring); a receive that finds nothing announces again and the fd works as before.
#[test]
fn a_withdrawn_wait_rings_no_doorbell_and_the_next_one_does() {
    let (mut client, mut server) = pair_with("shm", &kernel_opts());
    server.set_nonblocking(true);
    assert_eq!(server.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    server.shm().unwrap().withdraw_wait();
    client.send(b"one").unwrap();
    assert!(
        !readable_within(server.as_raw_fd(), 200),
        "a doorbell came for a withdrawn wait"
    );
    assert_eq!(server.recv_vec().unwrap(), b"one");
    assert_eq!(server.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    client.send(b"two").unwrap();
    assert!(
        readable_within(server.as_raw_fd(), 10_000),
        "the wait announced after the withdrawal got no doorbell"
    );
    assert_eq!(server.recv_vec().unwrap(), b"two");
}

/// A non-blocking server in a poll() loop echoes messages larger than half the ring (so
/// the rest of a send waits in the process and a receive pushes it on) to three clients
/// at once: every round must finish. Found by the C API's poll example: the receive
/// armed the send ring, then drained the room doorbell that answered it before arming
/// the receive ring, and the fd stayed quiet while a client waited for its echo.
#[test]
fn a_poll_loop_echoes_fragmented_messages() {
    const CLIENTS: usize = 3;
    for round in 0..10 {
        let (mut listener, addr) = bind("shm", &kernel_opts());
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let addr = addr.clone();
                std::thread::spawn(move || {
                    let mut c = Connection::connect(&addr, &kernel_opts()).unwrap();
                    for i in 0..50u64 {
                        let n = if i % 10 == 9 {
                            1 << 20
                        } else {
                            (i as usize * 7919) % 70_000
                        };
                        let msg = payload(i, n);
                        c.send(&msg).unwrap();
                        verify(i, n, &c.recv_vec().unwrap());
                    }
                    c.close().unwrap();
                })
            })
            .collect();
        let mut conns: Vec<Connection> = (0..CLIENTS)
            .map(|_| {
                let mut c = listener.accept().unwrap();
                c.set_nonblocking(true);
                c
            })
            .collect();
        serve(&mut conns, round);
        for c in clients {
            c.join().unwrap();
        }
    }
}

/// Echoes on every connection until each reaches its end, waiting in poll().
fn serve(conns: &mut [Connection], round: usize) {
    let mut done = vec![false; conns.len()];
    while done.iter().any(|d| !d) {
        let mut fds: Vec<libc::pollfd> = conns
            .iter()
            .zip(&done)
            .map(|(c, &d)| libc::pollfd {
                fd: if d { -1 } else { c.as_raw_fd() },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structures.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10_000) };
        assert!(
            ready != 0,
            "round {round}: poll heard nothing for 10 s while clients wait for echoes"
        );
        for (i, c) in conns.iter_mut().enumerate() {
            if fds[i].revents == 0 || done[i] {
                continue;
            }
            loop {
                match c.recv_vec() {
                    // A client waits for each echo before it sends again, so a send
                    // always finds room for at least the start of the echo (the rest
                    // waits in the connection).
                    Ok(m) => c.send(&m).unwrap(),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::EndOfStream => {
                        done[i] = true;
                        break;
                    }
                    Err(e) => panic!("round {round}: recv: {e}"),
                }
            }
        }
    }
}

/// The pipes (`pipe:[…]` links) among this process's descriptors.
fn pipe_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("pipe:"))
        .count()
}

/// Doorbell pipes (design §4.4): negotiated by default, three descriptors per side; a
/// blocking receive sleeps on its pipe and wakes for the message, and for the peer's end
/// (reset while parked on the pipe, end-of-stream after a close); a non-blocking
/// receive's doorbell still makes the socket readable for an event loop. With
/// `prepare_ahead(false)` (programs that close descriptors they did not open) a side
/// keeps no descriptor beside its socket.
#[test]
fn blocking_waits_sleep_on_doorbell_pipes_and_event_loops_on_the_socket() {
    // Other tests of this binary run in parallel and may hold pipes: compare with a
    // connection that has none, made in the same breath, several times over.
    let opts = kernel_opts()
        .ring_size(4096)
        .wait_policy(shmlink::WaitPolicy::BLOCKING);
    let counted = (0..5).any(|_| {
        let before = pipe_fds();
        let pair = pair_with("shm", &opts);
        let with = pipe_fds();
        drop(pair);
        let plain = opts.clone().prepare_ahead(false);
        let before_plain = pipe_fds();
        let pair = pair_with("shm", &plain);
        let without = pipe_fds();
        drop(pair);
        with == before + 6 && without == before_plain
    });
    assert!(counted, "6 pipe ends with doorbell pipes, none without");

    let (mut client, mut server) = pair_with("shm", &opts);
    // A parked blocking receive wakes for a message sent later.
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        let got = server.recv_vec().unwrap();
        (server, got)
    });
    let tid = tid_rx.recv().unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || sleeps_waiting_for_io(tid)),
        "the blocking receive never parked"
    );
    client.send(b"late").unwrap();
    let (mut server, got) = waiter.join().unwrap();
    assert_eq!(got, b"late");
    // An event loop's receive: its doorbell goes to the socket.
    server.set_nonblocking(true);
    assert_eq!(server.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    client.send(b"polled").unwrap();
    assert!(readable_within(server.as_raw_fd(), 10_000));
    assert_eq!(server.recv_vec().unwrap(), b"polled");
    // Parked on the pipe again, blocking: the peer's close ends it with end-of-stream.
    server.set_nonblocking(false);
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        server.recv_vec().unwrap_err().kind()
    });
    let tid = tid_rx.recv().unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || sleeps_waiting_for_io(tid)),
        "the blocking receive never parked"
    );
    drop(client);
    assert_eq!(waiter.join().unwrap(), ErrorKind::EndOfStream);
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it; CPU_ISSET
    // reads inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Runs the calling thread on `cpu` only.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it; the call reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        assert_eq!(rc, 0, "pin to CPU {cpu}");
    }
}

/// `shares_cpu_with_peer` records where this end waits and says whether the peer last
/// waited on the same CPU (a caller that spins before sleeping then sleeps at once).
#[test]
fn shares_cpu_with_peer_compares_where_the_two_ends_wait() {
    let (mut client, mut server) = pair_with("shm", &kernel_opts());
    let cpus = allowed_cpus();
    let here = cpus[0];
    pin(here);
    client.shm().unwrap().shares_cpu_with_peer();
    assert!(
        server.shm().unwrap().shares_cpu_with_peer(),
        "both ends waited on CPU {here}"
    );
    assert!(client.shm().unwrap().shares_cpu_with_peer());
    match cpus.get(1) {
        Some(&other) => {
            pin(other);
            assert!(
                !server.shm().unwrap().shares_cpu_with_peer(),
                "CPU {other} against {here}"
            );
            pin(here);
            assert!(
                !client.shm().unwrap().shares_cpu_with_peer(),
                "the server last waited on {other}"
            );
        }
        None => shmlink_testkit::skip(
            "cpus",
            "one CPU allowed: the two-CPU half of this test did not run",
        ),
    }
    let (mut a, _b) = pair("ux");
    assert!(a.shm().is_none(), "not shm: no shm controls");
}
