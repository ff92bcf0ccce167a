//! The descriptor budget of doorbell pipes (docs/design.md §4.4): a side offers or grants
//! its three pipe ends per connection only while its descriptors fit in half its soft
//! limit on open files; past that a connection keeps its socket alone and still carries
//! messages, wakes blocking calls and reports the peer's end. One test in a binary of its
//! own: it lowers the process's limit, which would starve tests running beside it.

mod common;

use std::time::Duration;

use common::*;
use shmlink::{Connection, ErrorKind, Listener, WaitPolicy};

/// This process's open descriptors, and how many of them are pipes (past stdin, stdout
/// and stderr, which may be pipes of whoever runs the test).
fn fds() -> (usize, usize) {
    let mut all = 0;
    let mut pipes = 0;
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        all += 1;
        let stdio = matches!(e.file_name().to_str(), Some("0" | "1" | "2"));
        if !stdio
            && std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("pipe:"))
        {
            pipes += 1;
        }
    }
    (all, pipes)
}

/// 30 `shm:` connections, both ends in this process, under a limit of 128 descriptors:
/// with pipes on every connection they would need 8 each (240); under the budget the
/// first few get pipes and the rest run on their sockets, 2 descriptors a connection.
#[test]
fn connections_past_half_the_fd_limit_keep_their_socket_alone_and_work() {
    const LIMIT: u64 = 128;
    const CONNS: usize = 30;
    shmlink_sys::process::set_fd_limit(LIMIT).unwrap();
    let opts = kernel_opts()
        .ring_size(4096)
        .wait_policy(WaitPolicy::BLOCKING);
    let addr = fresh_addr("shm");
    let mut l = Listener::bind(&addr, &opts).unwrap();
    let server = std::thread::spawn(move || {
        let conns: Vec<Connection> = (0..CONNS).map(|_| l.accept().unwrap()).collect();
        (l, conns)
    });
    let base = fds().1;
    let mut clients = Vec::new();
    let mut pipes_after = Vec::new();
    for i in 0..CONNS {
        let c = Connection::connect(&addr, &opts)
            .unwrap_or_else(|e| panic!("connection #{i} under a limit of {LIMIT} fds: {e}"));
        clients.push(c);
        pipes_after.push(fds().1 - base);
    }
    let (_listener, mut servers) = server.join().unwrap();
    let (open, pipes) = fds();
    let pipes = pipes - base;
    assert!(open < LIMIT as usize, "{open} descriptors open");
    // The first connection got pipes (6 ends in this process), later ones none: the
    // count of pipe ends stops growing before the last connection. The listener may
    // hold one pair made ahead for its next client (4 ends), made only while they fit.
    assert!(
        pipes_after[0] >= 6,
        "no pipes on the first connection: {pipes_after:?}"
    );
    assert!(matches!(pipes % 6, 0 | 4), "{pipes} pipe ends");
    assert!(
        pipes / 6 < CONNS / 2,
        "{} connections with pipes",
        pipes / 6
    );
    assert_eq!(
        pipes_after[CONNS / 2],
        pipes,
        "pipes made past the budget: {pipes_after:?}"
    );
    // Every connection carries a round trip, each end's receive blocking.
    for (i, (c, s)) in clients.iter_mut().zip(servers.iter_mut()).enumerate() {
        c.send(format!("ping {i}").as_bytes()).unwrap();
        let got = s.recv_vec().unwrap();
        s.send(&got).unwrap();
        assert_eq!(c.recv_vec().unwrap(), format!("ping {i}").into_bytes());
    }
    // A blocking receive parked on a connection without pipes (its socket) wakes for a
    // late message, and for the peer's end.
    let mut last = servers.pop().unwrap();
    let mut peer = clients.pop().unwrap();
    let waiter = std::thread::spawn(move || {
        let got = last.recv_vec().unwrap();
        let end = last.recv_vec().unwrap_err().kind();
        (got, end)
    });
    std::thread::sleep(Duration::from_millis(50));
    peer.send(b"late").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(peer);
    let (got, end) = waiter.join().unwrap();
    assert_eq!(got, b"late");
    assert_eq!(end, ErrorKind::EndOfStream);
}
