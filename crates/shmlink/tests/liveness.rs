//! Liveness against peers that stay connected but do not cooperate: nothing they do may
//! hold an honest side forever or take what belongs to others (issue 13).

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use shmlink::testing::HostilePeer;
use shmlink::{Connection, ErrorKind, Options};

const RING: usize = 4096;

/// The close linger documented on `Connection::close`.
const CLOSE_LINGER: Duration = Duration::from_secs(30);

fn small_opts() -> Options {
    Options::default().ring_size(RING).max_msg_size(1 << 20)
}

/// Fills the server's 4096-byte ring with a 2000-byte message and a split 3000-byte one in
/// non-blocking mode, so that the end of the split message stays pending in user space.
fn leave_a_fragment_pending(server: &mut Connection) {
    server.set_nonblocking(true);
    server.send(&payload(0, 2000)).unwrap();
    server.send(&payload(1, 3000)).unwrap();
    let e = server.send(b"x").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "ring should be full: {e}");
}

#[test]
fn shm_close_times_out_when_the_peer_never_reads() {
    let (mut l, addr) = bind("shm", &small_opts());
    let a = addr.clone();
    let peer = thread::spawn(move || HostilePeer::connect(&a, RING).unwrap());
    let mut server = l.accept().unwrap();
    // Connected, and never advances its head.
    let peer = peer.join().unwrap();
    leave_a_fragment_pending(&mut server);

    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(server.close()).unwrap());
    let r = rx
        .recv_timeout(CLOSE_LINGER + Duration::from_secs(60))
        .expect("close() still blocked long after the linger");
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    drop(peer);
}

#[test]
fn shm_close_lingers_for_a_peer_that_reads() {
    let (mut client, mut server) = pair_with("shm", &small_opts());
    leave_a_fragment_pending(&mut server);

    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(server.close()).unwrap());
    verify(0, 2000, &client.recv_vec().unwrap());
    verify(1, 3000, &client.recv_vec().unwrap());
    expect_eos(&mut client);
    let r = rx
        .recv_timeout(CLOSE_LINGER + Duration::from_secs(60))
        .expect("close() did not return");
    r.unwrap();
}
