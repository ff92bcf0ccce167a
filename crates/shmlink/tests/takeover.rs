//! Taking over a stale socket file is race-free (issue 13, L4): many binders started at
//! once on one stale path (a listener that died without removing its socket) end with
//! exactly one listener, the others get `AddrInUse`, and the winner is the one clients
//! reach — no binder deletes another's live socket.

mod common;

use std::os::unix::net::UnixListener;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use shmlink::{Connection, ErrorKind, Listener, Options, PubSubOptions, Publisher, Subscriber};

const BINDERS: usize = 16;
const ROUNDS: usize = 20;

/// Leaves a stale socket file at `path`: bound, then its listener gone.
fn stale_socket(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    drop(UnixListener::bind(path).unwrap());
    assert!(path.exists());
}

/// Runs `bind` in [`BINDERS`] threads at once; exactly one may win, the others must get
/// `AddrInUse`. Returns the winner.
fn only_winner<T: Send + 'static>(
    bind: impl Fn() -> shmlink::Result<T> + Send + Sync + 'static,
) -> T {
    let (start, bind) = (Arc::new(Barrier::new(BINDERS)), Arc::new(bind));
    let binders: Vec<_> = (0..BINDERS)
        .map(|_| {
            let (start, bind) = (start.clone(), bind.clone());
            std::thread::spawn(move || {
                start.wait();
                bind()
            })
        })
        .collect();
    let mut winners = Vec::new();
    for b in binders {
        match b.join().unwrap() {
            Ok(w) => winners.push(w),
            Err(e) => assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}"),
        }
    }
    assert_eq!(winners.len(), 1, "{} winners", winners.len());
    winners.pop().unwrap()
}

#[test]
fn concurrent_binders_on_a_stale_socket_leave_one_reachable_winner() {
    let dir = common::test_dir();
    for round in 0..ROUNDS {
        let path = dir.join(format!("takeover-{round}.sock"));
        stale_socket(&path);
        let addr = format!("shm:{}", path.display());
        let a = addr.clone();
        let mut winner = only_winner(move || Listener::bind(&a, &Options::default()));
        let a = addr.clone();
        let client = std::thread::spawn(move || {
            let opts = Options::default().connect_timeout(Duration::from_secs(10));
            let mut c = Connection::connect(&a, &opts)?;
            c.send(b"ping")?;
            c.recv_vec()
        });
        let mut server = winner.accept().unwrap();
        assert_eq!(server.recv_vec().unwrap(), b"ping");
        server.send(b"pong").unwrap();
        assert_eq!(client.join().unwrap().unwrap(), b"pong", "round {round}");
        drop(winner);
        assert!(
            !path.exists(),
            "round {round}: the winner removes its socket"
        );
    }
}

/// The same for publishers, which bind their rendezvous socket the same way.
#[test]
fn concurrent_publishers_on_a_stale_socket_leave_one_reachable_winner() {
    let path = common::test_dir().join("takeover-topic.sock");
    stale_socket(&path);
    let addr = format!("shm:{}", path.display());
    let a = addr.clone();
    let mut publisher =
        only_winner(move || Publisher::bind(&a, &PubSubOptions::default().slots(8)));
    let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
    publisher.publish(b"reached").unwrap();
    assert_eq!(sub.recv_vec().unwrap(), b"reached");
}
