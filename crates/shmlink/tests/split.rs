//! `Connection::split` on every transport: a sender thread and a receiver thread on each
//! end exchange many messages in both directions at once (the traffic that deadlocks a
//! single thread doing blocking sends and receives in turn once both directions fill);
//! the end of the stream and a killed peer reach the halves.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::thread;
use std::time::Duration;

use common::{opts, pair, payload, rerun_ignored, verify};
use shmlink::{Connection, ErrorKind, Listener, RecvHalf, SendHalf};

/// Messages each end sends.
const COUNT: u64 = 20_000;

/// Mostly small messages, some of several KiB, and now and then one larger than half a
/// default `shm:` ring (sent in fragments; in non-blocking mode partly kept back).
fn len_of(seq: u64) -> usize {
    match seq % 1000 {
        999 => 200 << 10,
        n if n % 50 == 0 => 12 + (seq as usize * 131) % 9000,
        _ => 12 + (seq as usize * 7) % 120,
    }
}

fn send_all(mut tx: SendHalf) -> SendHalf {
    for seq in 0..COUNT {
        tx.send(&payload(seq, len_of(seq))).unwrap();
    }
    tx
}

fn recv_all(mut rx: RecvHalf) -> RecvHalf {
    for seq in 0..COUNT {
        let msg = rx
            .recv_vec()
            .unwrap_or_else(|e| panic!("message {seq}: {e}"));
        verify(seq, len_of(seq), &msg);
    }
    rx
}

/// Both ends split; four threads; then the client reunites and closes, and the server's
/// receive half sees the end of the stream.
fn duplex(t: &str) {
    let (client, server) = pair(t);
    let (ctx, crx) = client.split().unwrap();
    let (stx, srx) = server.split().unwrap();
    let threads = [
        thread::spawn(move || (Some(send_all(ctx)), None)),
        thread::spawn(move || (None, Some(recv_all(crx)))),
        thread::spawn(move || (Some(send_all(stx)), None)),
        thread::spawn(move || (None, Some(recv_all(srx)))),
    ];
    let mut halves: Vec<(Option<SendHalf>, Option<RecvHalf>)> =
        threads.into_iter().map(|h| h.join().unwrap()).collect();
    let (stx, srx) = (halves[2].0.take().unwrap(), halves[3].1.take().unwrap());
    let (ctx, crx) = (halves[0].0.take().unwrap(), halves[1].1.take().unwrap());

    // Halves of two connections do not fit together, and come back whole.
    let err = ctx.reunite(srx).unwrap_err();
    let (ctx, mut srx) = (err.send, err.recv);

    let client = ctx.reunite(crx).unwrap();
    assert!(!client.is_nonblocking(), "{t}: the mode before the split");
    let c = client.counters();
    assert_eq!((c.msgs_out, c.msgs_in), (COUNT, COUNT), "{t}: counters");
    client.close().unwrap();

    let e = srx.recv_vec().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::EndOfStream, "{t}: {e}");
    drop(stx);
    drop(srx);
}

/// Both halves wait at once — the receive half for a message, the send half for room
/// (the peer reads nothing) — and both sleep in the kernel rather than waking each other
/// in turn; then the peer sends one message and reads everything, and both finish.
fn both_wait(t: &str) {
    const FILL: u64 = 4000;
    let (client, mut server) = pair(t);
    let (mut tx, mut rx) = client.split().unwrap();
    let (tids, tid) = std::sync::mpsc::channel();
    let tids2 = tids.clone();
    let sender = thread::spawn(move || {
        tids.send(common::gettid()).unwrap();
        for seq in 0..FILL {
            tx.send(&payload(seq, 4096)).unwrap();
        }
        tx
    });
    let receiver = thread::spawn(move || {
        tids2.send(common::gettid()).unwrap();
        let msg = rx.recv_vec().unwrap();
        (rx, msg)
    });
    let (a, b) = (tid.recv().unwrap(), tid.recv().unwrap());
    assert!(
        common::wait_until(Duration::from_secs(30), || {
            common::sleeps_waiting_for_io(a) && common::sleeps_waiting_for_io(b)
        }),
        "{t}: both halves should sleep while they wait"
    );
    server.send(b"wake").unwrap();
    for seq in 0..FILL {
        verify(seq, 4096, &server.recv_vec().unwrap());
    }
    let tx = sender.join().unwrap();
    let (rx, msg) = receiver.join().unwrap();
    assert_eq!(msg, b"wake");
    tx.reunite(rx).unwrap().close().unwrap();
    common::expect_eos(&mut server);
}

macro_rules! per_transport {
    ($($t:ident),*) => {$(
        mod $t {
            #[test]
            fn duplex_threads_exchange_many_messages() {
                super::duplex(stringify!($t));
            }

            #[test]
            fn waiting_halves_sleep() {
                super::both_wait(stringify!($t));
            }

            #[test]
            fn killed_peer_reaches_both_halves() {
                super::killed_peer(stringify!($t));
            }
        }
    )*};
}

per_transport!(shm, ux, tcp, tls, auto, auto_tcp, auto_tls, inproc);

const ROLE_ADDR: &str = "SHMLINK_SPLIT_CHILD_ADDR";
const ROLE_TRANSPORT: &str = "SHMLINK_SPLIT_CHILD_TRANSPORT";
const ROLE_PKI: &str = "SHMLINK_SPLIT_CHILD_PKI";
/// What the child prints once it has sent its messages (libtest may have printed the
/// test's name on the same line).
const SENT_MARK: &str = "SPLIT-CHILD-SENT";
/// Messages the child sends before it idles.
const CHILD_MSGS: u64 = 100;

/// The child: connects, sends [`CHILD_MSGS`] messages, says so, then idles without
/// reading until it is killed. A no-op in normal runs.
#[test]
#[ignore = "the child process of killed_peer_reaches_both_halves, which runs it with --ignored"]
fn child_main() {
    let Ok(addr) = std::env::var(ROLE_ADDR) else {
        return;
    };
    let t = std::env::var(ROLE_TRANSPORT).unwrap();
    let mut o = opts(&t);
    if let Ok(pki) = std::env::var(ROLE_PKI) {
        // The parent's certificates (ours were made for this process).
        let mut parts = pki.split('\u{1}');
        let (cert, key, ca) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        o = o.tls(
            shmlink::TlsOptions::new()
                .cert(shmlink::Pem::text(cert))
                .key(shmlink::Pem::text(key))
                .ca(shmlink::Pem::text(ca)),
        );
    }
    let mut conn = Connection::connect(&addr, &o).unwrap();
    for seq in 0..CHILD_MSGS {
        conn.send(&payload(seq, 64)).unwrap();
    }
    println!("{SENT_MARK}");
    loop {
        thread::sleep(Duration::from_secs(60));
    }
}

/// Kills the child if the test fails before it does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(t: &str, addr: &str) -> Child {
    let mut cmd = rerun_ignored("child_main");
    cmd.env(ROLE_ADDR, addr)
        .env(ROLE_TRANSPORT, t)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if t.ends_with("tls") {
        let pki = common::pki();
        cmd.env(
            ROLE_PKI,
            format!("{}\u{1}{}\u{1}{}", pki.server.cert, pki.server.key, pki.ca),
        );
    }
    cmd.spawn().unwrap()
}

/// A child peer sends some messages and then never reads; the server's send half fills
/// the connection and blocks; the child is killed: the receive half gets every message,
/// then `ConnectionReset`, and the blocked send half wakes with `ConnectionReset`.
fn killed_peer(t: &str) {
    let o = opts(t);
    let (mut listener, addr): (Listener, String) = common::bind(t, &o);
    let mut child = KillOnDrop(spawn_child(t, &addr));
    let child = &mut child.0;
    let conn = listener.accept().unwrap();
    let (mut tx, mut rx) = conn.split().unwrap();
    let sender = thread::spawn(move || loop {
        // Larger than any buffer in between needs many of these.
        if let Err(e) = tx.send(&[7u8; 4096]) {
            return e;
        }
    });
    for seq in 0..CHILD_MSGS {
        let msg = rx.recv_vec().unwrap();
        verify(seq, 64, &msg);
    }
    let sent = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .any(|l| l.unwrap().contains(SENT_MARK));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(sent, "{t}: the child ended without sending");

    let e = rx.recv_vec().unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::ConnectionReset,
        "{t}: receive half: {e}"
    );
    let e = sender.join().unwrap();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{t}: send half: {e}");
}
