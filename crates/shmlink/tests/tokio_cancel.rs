//! Cancellation safety of `shmlink::tokio`: `select!` loops that drop `recv`, `recv_ref`,
//! `send`, `reserve` and the split halves' futures mid-way (a racing `yield_now` or a
//! timer wins whenever the operation is not ready at once), after which the stream goes
//! on with nothing lost and nothing duplicated. Small rings, so both sides wait often;
//! each check runs on `shm:`, `ux:` and `tcp:`, on a multi-threaded runtime.

mod common;

use std::time::Duration;

use common::*;
use shmlink::tokio::{Connection, Listener};
use shmlink::{ErrorKind, Options};

const N: u64 = 20_000;
const DEADLINE: Duration = Duration::from_secs(120);

fn run<F: std::future::Future<Output = ()> + Send + 'static>(f: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            tokio::time::timeout(DEADLINE, f)
                .await
                .expect("hung after cancellations: a lost wake-up");
        });
}

async fn pair_async(t: &str) -> (Connection, Connection) {
    let o: Options = opts(t).ring_size(4096);
    let (l, addr) = bind(t, &o.clone().wait_policy(shmlink::WaitPolicy::BLOCKING));
    let mut l = Listener::from_std(l, Duration::from_micros(20)).unwrap();
    let client = tokio::spawn(async move { Connection::connect(&addr, &o).await });
    let server = l.accept().await.unwrap();
    (client.await.unwrap().unwrap(), server)
}

fn len(seq: u64) -> usize {
    12 + (seq as usize * 131) % 1500
}

/// Something that wins a race against an operation that is not ready at once: a yield
/// (ready on its second poll) most of the time, a short timer sometimes.
async fn interrupt(i: u64) {
    if i % 7 == 0 {
        tokio::time::sleep(Duration::from_micros(50)).await;
    } else {
        tokio::task::yield_now().await;
    }
}

/// A sender that never cancels and paces itself now and then, so the receiver waits.
fn steady_sender(mut c: Connection) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for seq in 0..N {
            c.send(&payload(seq, len(seq))).await.unwrap();
            if seq % 500 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        c.close().await.unwrap();
    })
}

/// A receiver that never cancels: it reads nothing until the sender has been cancelled
/// [`MIN_CANCELLED`] times (or is done), then reads with a pause now and then, so the
/// sender waits for room again (also on `tcp:`, once the kernel's buffers are full).
fn steady_receiver(
    mut s: Connection,
    gate: std::sync::Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        gate.notified().await;
        for seq in 0..N {
            verify(seq, send_len(seq), &s.recv_vec().await.unwrap());
            if seq % 200 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let e = s.recv_vec().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
    })
}

/// Says how many `what` of transport `t` were cancelled mid-way; fails unless that was
/// `enough` to test anything.
fn say_cancelled(t: &str, what: &str, cancelled: u64, enough: bool) {
    eprintln!("{t}: {cancelled} {what} cancelled mid-way");
    assert!(
        enough,
        "too few cancellations ({cancelled}) to test anything"
    );
}

/// Cancellations a test needs before it counts.
const MIN_CANCELLED: u64 = 100;

/// Sizes for the send test: 3 KiB on average, 60 MB in all, more than loopback TCP's
/// socket buffers hold.
fn send_len(seq: u64) -> usize {
    12 + (seq as usize * 131) % 6000
}

fn recv_cancelled(t: &'static str) {
    run(async move {
        let (c, mut s) = pair_async(t).await;
        let sender = steady_sender(c);
        let (mut seq, mut cancelled, mut i) = (0u64, 0u64, 0u64);
        let mut buf = vec![0u8; 2048];
        while seq < N {
            i += 1;
            // Alternate the three receive calls.
            tokio::select! {
                r = async {
                    match seq % 3 {
                        0 => s.recv_vec().await,
                        1 => s.recv(&mut buf).await.map(|n| buf[..n].to_vec()),
                        _ => s.recv_ref().await.map(|m| m.bytes().to_vec()),
                    }
                } => {
                    verify(seq, len(seq), &r.unwrap());
                    seq += 1;
                }
                () = interrupt(i) => cancelled += 1,
            }
        }
        expect_eos_async(&mut s).await;
        sender.await.unwrap();
        say_cancelled(t, "receives", cancelled, cancelled > 100);
    });
}

fn send_cancelled(t: &'static str) {
    run(async move {
        let (mut c, s) = pair_async(t).await;
        let gate = std::sync::Arc::new(tokio::sync::Notify::new());
        let receiver = steady_receiver(s, gate.clone());
        let (mut seq, mut cancelled, mut i) = (0u64, 0u64, 0u64);
        while seq < N {
            i += 1;
            let msg = payload(seq, send_len(seq));
            tokio::select! {
                r = async {
                    if seq % 2 == 0 {
                        c.send(&msg).await
                    } else {
                        let mut buf = c.reserve(msg.len()).await?;
                        buf.copy_from_slice(&msg);
                        buf.commit().await
                    }
                } => {
                    r.unwrap();
                    seq += 1;
                }
                () = interrupt(i) => {
                    cancelled += 1;
                    if cancelled == MIN_CANCELLED {
                        gate.notify_one();
                    }
                }
            }
        }
        gate.notify_one();
        c.close().await.unwrap();
        receiver.await.unwrap();
        say_cancelled(t, "sends", cancelled, cancelled >= MIN_CANCELLED);
    });
}

/// Split halves in two tasks, both cancelling: each side sends and receives N messages.
fn halves_cancelled(t: &'static str) {
    run(async move {
        let (c, s) = pair_async(t).await;
        let mut tasks = Vec::new();
        for conn in [c, s] {
            let (mut tx, mut rx) = conn.split();
            tasks.push(tokio::spawn(async move {
                let (mut seq, mut cancelled, mut i) = (0u64, 0u64, 0u64);
                while seq < N {
                    i += 1;
                    let msg = payload(seq, len(seq));
                    tokio::select! {
                        r = tx.send(&msg) => { r.unwrap(); seq += 1; }
                        () = interrupt(i) => cancelled += 1,
                    }
                }
                tx.flush().await.unwrap();
                cancelled
            }));
            tasks.push(tokio::spawn(async move {
                let (mut seq, mut cancelled, mut i) = (0u64, 0u64, 0u64);
                while seq < N {
                    i += 1;
                    tokio::select! {
                        r = rx.recv_vec() => { verify(seq, len(seq), &r.unwrap()); seq += 1; }
                        () = interrupt(i) => cancelled += 1,
                    }
                }
                cancelled
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        say_cancelled(t, "half operations", total, total > 100);
    });
}

/// `accept` dropped by a timeout while no client comes, many times; then clients come
/// and each is accepted exactly once.
fn accept_cancelled(t: &'static str) {
    run(async move {
        let o = opts(t);
        let (l, addr) = bind(t, &o);
        let mut l = Listener::from_std(l, Duration::ZERO).unwrap();
        for _ in 0..50 {
            let r = tokio::time::timeout(Duration::from_millis(1), l.accept()).await;
            assert!(r.is_err(), "accepted a client nobody started");
        }
        let mut clients = Vec::new();
        for i in 0..8u64 {
            let (addr, o) = (addr.clone(), o.clone());
            clients.push(tokio::spawn(async move {
                let mut c = Connection::connect(&addr, &o).await.unwrap();
                c.send(&i.to_le_bytes()).await.unwrap();
                c
            }));
        }
        let mut seen = Vec::new();
        let mut i = 0;
        while seen.len() < 8 {
            i += 1;
            tokio::select! {
                r = l.accept() => {
                    let mut s = r.unwrap();
                    let id = s.recv_vec().await.unwrap();
                    seen.push(u64::from_le_bytes(id.try_into().unwrap()));
                }
                () = interrupt(i) => {}
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        for c in clients {
            c.await.unwrap();
        }
    });
}

async fn expect_eos_async(s: &mut Connection) {
    let e = s.recv_vec().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
}

macro_rules! suite {
    ($($transport:ident),*) => {$(
        mod $transport {
            #[test] fn recv_cancelled() { super::recv_cancelled(stringify!($transport)) }
            #[test] fn send_cancelled() { super::send_cancelled(stringify!($transport)) }
            #[test] fn halves_cancelled() { super::halves_cancelled(stringify!($transport)) }
            #[test] fn accept_cancelled() { super::accept_cancelled(stringify!($transport)) }
        }
    )*};
}

suite!(shm, ux, tcp);
