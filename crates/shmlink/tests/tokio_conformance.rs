//! The conformance scenarios through `shmlink::tokio`, on a multi-threaded runtime with
//! 64 concurrent connections on one runtime, on `shm:`, `ux:`, `tcp:` and `auto:`
//! (upgraded): echo, 1,000,000 ordered checksummed
//! messages, 1 B – 64 MiB, flow control with a slow reader, a peer killed with SIGKILL
//! (reset within 100 ms), graceful close; plus split halves in full duplex, the byte
//! stream, async publish/subscribe, and idle connections that cost no CPU.
//!
//! Rings are small (4 KiB) wherever the point is the wake-ups: sends then hit
//! `WouldBlock` all the time as well as receives, so every wait goes through tokio's
//! edge-triggered readiness, and a lost wake-up hangs a connection (caught by the
//! deadline on every test).
//!
//! The dead peer is this test binary run again as `--ignored --exact child_main` with its
//! role in [`ROLE_VAR`] (see [`child_main`]).

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use shmlink::tokio::{Connection, Listener, Publisher, Subscriber};
use shmlink::{ErrorKind, Options, Policy, PubSubOptions, WaitPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Concurrent connections on the one runtime.
const CONNS: usize = 64;
/// Whole-scenario deadline: a lost wake-up fails the test instead of hanging CI.
const DEADLINE: Duration = Duration::from_secs(180);
/// Smallest ring: sends hit `WouldBlock` constantly.
const SMALL_RING: usize = 4096;

const ROLE_VAR: &str = "SHMLINK_TOKIO_CHILD";
const ADDR_VAR: &str = "SHMLINK_TOKIO_ADDR";
const READY_MARK: &str = "SHMLINK-TOKIO-CHILD: ready";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f` on a fresh multi-threaded runtime within [`DEADLINE`].
fn run<F: std::future::Future<Output = ()> + Send + 'static>(f: F) {
    runtime().block_on(async move {
        tokio::time::timeout(DEADLINE, f)
            .await
            .expect("scenario hung: a lost wake-up or a missed peer death");
    });
}

fn small_opts(t: &str) -> Options {
    opts(t).ring_size(SMALL_RING)
}

/// Binds a fresh address of test transport `t`; returns the listener and the address.
fn bind_async(t: &str, o: &Options) -> (Listener, String) {
    // As `Listener::bind` does: the library's own wait policy blocking (the symmetric
    // fence on `shm:`), the spin is this module's.
    let (l, addr) = bind(t, &o.clone().wait_policy(WaitPolicy::BLOCKING));
    (
        Listener::from_std(l, Duration::from_micros(20)).unwrap(),
        addr,
    )
}

/// `n` connected pairs (client, server) made concurrently.
async fn pairs(t: &str, o: &Options, n: usize) -> Vec<(Connection, Connection)> {
    let (mut l, addr) = bind_async(t, o);
    let mut clients = Vec::new();
    for _ in 0..n {
        let (addr, o) = (addr.clone(), o.clone());
        clients.push(tokio::spawn(
            async move { Connection::connect(&addr, &o).await },
        ));
    }
    let mut servers = Vec::new();
    for _ in 0..n {
        servers.push(l.accept().await.unwrap());
    }
    // Pair each client with its own server: the client says its index first.
    let mut out = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let mut c = c.await.unwrap().unwrap();
        assert_eq!(c.transport().as_str(), path_of(t));
        c.send(&(i as u64).to_le_bytes()).await.unwrap();
        out.push(Some(c));
    }
    let mut res: Vec<Option<(Connection, Connection)>> = (0..n).map(|_| None).collect();
    for mut s in servers {
        let id = s.recv_vec().await.unwrap();
        let i = u64::from_le_bytes(id.try_into().unwrap()) as usize;
        res[i] = Some((out[i].take().unwrap(), s));
    }
    res.into_iter().map(Option::unwrap).collect()
}

/// `n` pairs made by the blocking API (the library's own wait policy from `o`), then
/// wrapped with `from_std`.
async fn pairs_std(t: &str, o: &Options, n: usize) -> Vec<(Connection, Connection)> {
    let (mut l, addr) = bind(t, o);
    let o2 = o.clone();
    let clients = std::thread::spawn(move || {
        (0..n)
            .map(|_| shmlink::Connection::connect(&addr, &o2).unwrap())
            .collect::<Vec<_>>()
    });
    let servers: Vec<_> = (0..n).map(|_| l.accept().unwrap()).collect();
    let clients = clients.join().unwrap();
    // Connected in order, accepted in order: pair by the client's own address.
    let mut res = Vec::new();
    let mut servers: Vec<Option<shmlink::Connection>> = servers.into_iter().map(Some).collect();
    for c in clients {
        let i = servers
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.peer_addr() == c.local_addr()))
            .unwrap_or_else(|| servers.iter().position(Option::is_some).unwrap());
        let s = servers[i].take().unwrap();
        res.push((
            Connection::from_std(c).unwrap(),
            Connection::from_std(s).unwrap(),
        ));
    }
    res
}

fn len_of(seq: u64, max: usize) -> usize {
    (seq as usize * 7919) % max
}

/// Echo on 64 connections: each client sends mixed sizes (some larger than half the
/// ring, so split on `shm:`), the server echoes, the client checks each reply.
fn echo_64(t: &str) {
    echo_64_with(t, false)
}

/// `asymmetric`: both ends made by the blocking API with the default wait policy, then
/// wrapped (`from_std`), so that `shm:` runs the asymmetric fence (see
/// [`asymmetric_fence_echo_repro`]).
fn echo_64_with(t: &str, asymmetric: bool) {
    let t = t.to_string();
    run(async move {
        let o = small_opts(&t);
        const ROUNDS: u64 = 300;
        let mut tasks = Vec::new();
        let conns = if asymmetric {
            pairs_std(&t, &o, CONNS).await
        } else {
            pairs(&t, &o, CONNS).await
        };
        for (mut c, s) in conns {
            tasks.push(tokio::spawn(echo_until_end(s)));
            tasks.push(tokio::spawn(async move {
                for seq in 0..ROUNDS {
                    let len = len_of(seq, 6000);
                    c.send(&payload(seq, len)).await.unwrap();
                    let back = c.recv_vec().await.unwrap();
                    verify(seq, len, &back);
                }
                c.close().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// 1,000,000 ordered, checksummed messages over 64 connections at once (15,625 each), in
/// both directions' worth of wake-ups: small rings, so senders wait for room and
/// receivers for data.
fn million_ordered(t: &str, total: u64) {
    let t = t.to_string();
    run(async move {
        let o = small_opts(&t);
        let per = total / CONNS as u64;
        let mut tasks = Vec::new();
        for (mut c, mut s) in pairs(&t, &o, CONNS).await {
            tasks.push(tokio::spawn(async move {
                for seq in 0..per {
                    c.send(&payload(seq, 12 + (seq % 52) as usize))
                        .await
                        .unwrap();
                }
                c.close().await.unwrap();
                per
            }));
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 64];
                for seq in 0..per {
                    let n = s.recv(&mut buf).await.unwrap();
                    verify(seq, 12 + (seq % 52) as usize, &buf[..n]);
                }
                let e = s.recv(&mut buf).await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
                per
            }));
        }
        let mut n = 0;
        for t in tasks {
            n += t.await.unwrap();
        }
        assert_eq!(n, 2 * per * CONNS as u64);
    });
}

/// 1 B .. 1 MiB on 64 connections at once (mixed with zero-copy receive), then 1 B ..
/// 64 MiB on one connection, with default rings (messages beyond half a ring are split).
fn sizes(t: &str) {
    let t = t.to_string();
    run(async move {
        let o = opts(&t).max_msg_size(64 << 20);
        let ladder: Vec<usize> = vec![
            1,
            2,
            11,
            12,
            100,
            4095,
            4096,
            65_535,
            65_536,
            300_000,
            1 << 20,
        ];
        let mut tasks = Vec::new();
        for (i, (mut c, mut s)) in pairs(&t, &o, CONNS).await.into_iter().enumerate() {
            let (ladder, ladder2) = (ladder.clone(), ladder.clone());
            let big = i == 0;
            tasks.push(tokio::spawn(async move {
                let mut sizes = ladder2;
                if big {
                    sizes.extend([8 << 20, 64 << 20]);
                }
                for (seq, &len) in sizes.iter().enumerate() {
                    c.send(&payload(seq as u64, len)).await.unwrap();
                }
                c.close().await.unwrap();
            }));
            tasks.push(tokio::spawn(async move {
                let mut sizes = ladder;
                if big {
                    sizes.extend([8 << 20, 64 << 20]);
                }
                for (seq, &len) in sizes.iter().enumerate() {
                    if seq % 2 == 0 {
                        let m = s.recv_vec().await.unwrap();
                        verify(seq as u64, len, &m);
                    } else {
                        let m = s.recv_ref().await.unwrap();
                        verify(seq as u64, len, &m.bytes().to_vec());
                    }
                }
                let e = s.recv_vec().await.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// A slow reader holds its sender back (a send stays pending while the reader reads
/// nothing), on 64 connections at once; then everything arrives once, in order. The
/// sender goes on until it was held (kernel socket buffers take megabytes on `tcp:`),
/// then sends [`AFTER_HELD`] more.
fn slow_reader(t: &str) {
    let t = t.to_string();
    run(async move {
        let o = small_opts(&t);
        const LEN: usize = 1000;
        const AFTER_HELD: u64 = 300;
        let mut tasks = Vec::new();
        for (mut c, mut s) in pairs(&t, &o, CONNS).await {
            let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
            tasks.push(tokio::spawn(async move {
                let mut held_tx = Some(held_tx);
                let mut seq = 0u64;
                let mut end = u64::MAX;
                while seq < end {
                    assert!(seq < 1_000_000, "never held back after {seq} messages");
                    let msg = payload(seq, LEN);
                    // A send that stays pending 20 ms is flow control at work; the
                    // timeout drops it (cancel safe) and the loop sends it again.
                    match tokio::time::timeout(Duration::from_millis(20), c.send(&msg)).await {
                        Ok(r) => {
                            r.unwrap();
                            seq += 1;
                        }
                        Err(_) => {
                            if let Some(tx) = held_tx.take() {
                                let _ = tx.send(());
                                end = seq + AFTER_HELD;
                            }
                        }
                    }
                }
                c.close().await.unwrap();
                seq
            }));
            tasks.push(tokio::spawn(async move {
                // Read nothing until the sender is held back, then read slowly.
                held_rx.await.unwrap();
                let mut seq = 0u64;
                loop {
                    if seq % 50 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    match s.recv_vec().await {
                        Ok(m) => verify(seq, LEN, &m),
                        Err(e) if e.kind() == ErrorKind::EndOfStream => break,
                        Err(e) => panic!("{e}"),
                    }
                    seq += 1;
                }
                seq
            }));
        }
        let mut it = tasks.into_iter();
        while let (Some(sent), Some(got)) = (it.next(), it.next()) {
            assert_eq!(sent.await.unwrap(), got.await.unwrap());
        }
    });
}

/// Graceful close on 64 connections: what was sent before `close` arrives, then the end
/// of the stream, and later calls keep saying so.
fn graceful_close(t: &str) {
    let t = t.to_string();
    run(async move {
        let o = small_opts(&t);
        let mut tasks = Vec::new();
        for (mut c, mut s) in pairs(&t, &o, CONNS).await {
            tasks.push(tokio::spawn(async move {
                for seq in 0..100u64 {
                    c.send(&payload(seq, 3000)).await.unwrap();
                }
                // The last one large: accepted whole, the rest moves on during close.
                c.send(&payload(100, 200_000)).await.unwrap();
                c.close().await.unwrap();
            }));
            tasks.push(tokio::spawn(async move {
                for seq in 0..100u64 {
                    verify(seq, 3000, &s.recv_vec().await.unwrap());
                }
                verify(100, 200_000, &s.recv_vec().await.unwrap());
                for _ in 0..3 {
                    let e = s.recv_vec().await.unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// Split halves in full duplex on 64 connections: on each side one task sends while
/// another receives, small rings, both directions checked.
fn split_duplex(t: &str) {
    let t = t.to_string();
    run(async move {
        let o = small_opts(&t);
        const N: u64 = 3000;
        let mut tasks = Vec::new();
        for (c, s) in pairs(&t, &o, CONNS).await {
            for conn in [c, s] {
                let (mut tx, mut rx) = conn.split();
                tasks.push(tokio::spawn(async move {
                    for seq in 0..N {
                        tx.send(&payload(seq, len_of(seq, 2500))).await.unwrap();
                    }
                    tx.flush().await.unwrap();
                }));
                tasks.push(tokio::spawn(async move {
                    for seq in 0..N {
                        verify(seq, len_of(seq, 2500), &rx.recv_vec().await.unwrap());
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// The byte stream: 64 clients write 256 KiB in odd-sized pieces and shut down; servers
/// echo everything (reading to the end, then writing it back); clients read it back.
fn byte_stream(t: &str) {
    let t = t.to_string();
    run(async move {
        let o = small_opts(&t);
        let mut tasks = Vec::new();
        for (i, (c, s)) in pairs(&t, &o, CONNS).await.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let mut s = s.into_byte_stream();
                let mut all = Vec::new();
                s.read_to_end(&mut all).await.unwrap();
                s.write_all(&all).await.unwrap();
                s.shutdown().await.unwrap();
            }));
            tasks.push(tokio::spawn(async move {
                let data = payload(i as u64, 256 << 10);
                let mut c = c.into_byte_stream();
                let mut at = 0;
                let mut piece = 1;
                while at < data.len() {
                    let end = (at + piece).min(data.len());
                    c.write_all(&data[at..end]).await.unwrap();
                    at = end;
                    piece = piece * 3 % 70_001 + 1;
                }
                c.shutdown().await.unwrap();
                let mut back = Vec::new();
                c.read_to_end(&mut back).await.unwrap();
                assert!(back == data, "byte stream {i}: echoed bytes differ");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

macro_rules! suite {
    ($($transport:ident),*) => {$(
        mod $transport {
            #[test] fn echo_64() { super::echo_64(stringify!($transport)) }
            #[test] fn sizes() { super::sizes(stringify!($transport)) }
            #[test] fn slow_reader() { super::slow_reader(stringify!($transport)) }
            #[test] fn graceful_close() { super::graceful_close(stringify!($transport)) }
            #[test] fn split_duplex() { super::split_duplex(stringify!($transport)) }
            #[test] fn byte_stream() { super::byte_stream(stringify!($transport)) }
        }
    )*};
}

suite!(shm, ux, tcp, auto, inproc);

/// Echo on 64 `shm:` connections made by the blocking API with the default wait policy,
/// then wrapped. Their handshake chose the asymmetric fence when the library offered it,
/// and this test then lost wake-ups (every task awaiting, nothing to wake it) in 2 of 3
/// runs on the 2-vCPU development VM. The library no longer offers that fence
/// (`OFFER_ASYM_FENCE` in src/transport/shm/mod.rs); flip it there and run this with
/// `--ignored` to reproduce.
#[test]
#[ignore = "reproducer for the asymmetric fence, which the library no longer offers"]
fn asymmetric_fence_echo_repro() {
    echo_64_with("shm", true);
}

#[test]
fn shm_million_ordered_checksummed() {
    million_ordered("shm", 1_000_000);
}

#[test]
fn ux_200k_ordered_checksummed() {
    million_ordered("ux", 200_000);
}

#[test]
fn tcp_200k_ordered_checksummed() {
    million_ordered("tcp", 200_000);
}

/// Async publish/subscribe: one blocking-policy topic with a small ring, 8 subscribers
/// reading through the `Stream`, 20,000 messages, each subscriber sees all in order.
#[test]
fn pubsub_stream_in_order() {
    pubsub_in_order(false);
}

/// The zero-copy pair of async publish/subscribe: the publisher fills loaned slots in
/// place (awaiting room on the small ring), subscribers read the samples in place; each
/// sees all 20,000 messages intact and in order.
#[test]
fn pubsub_zero_copy_in_order() {
    pubsub_in_order(true);
}

fn pubsub_in_order(zero_copy: bool) {
    run(async move {
        let addr = fresh_addr("shm");
        let po = PubSubOptions::default()
            .slots(16)
            .max_msg_size(256)
            .policy(Policy::Block);
        let mut publisher = Publisher::bind(&addr, &po).unwrap();
        const SUBS: usize = 8;
        const N: u64 = 20_000;
        let len = |seq: u64| 12 + (seq % 200) as usize;
        let mut readers = Vec::new();
        for _ in 0..SUBS {
            let mut sub = Subscriber::connect(&addr, &PubSubOptions::default())
                .await
                .unwrap();
            readers.push(tokio::spawn(async move {
                let mut seq = 0u64;
                loop {
                    let m = if zero_copy {
                        match sub.recv_ref().await {
                            Ok(sample) => sample
                                .to_vec()
                                .expect("a blocking topic's sample is intact"),
                            Err(e) if e.kind() == ErrorKind::EndOfStream => return seq,
                            Err(e) => panic!("recv_ref: {e}"),
                        }
                    } else {
                        match sub.next().await {
                            Some(m) => m.unwrap(),
                            None => return seq,
                        }
                    };
                    verify(seq, len(seq), &m);
                    seq += 1;
                }
            }));
        }
        for seq in 0..N {
            let msg = payload(seq, len(seq));
            if zero_copy {
                let mut loan = publisher.loan(msg.len()).await.unwrap();
                loan.copy_from_slice(&msg);
                loan.publish().unwrap();
            } else {
                publisher.publish(&msg).await.unwrap();
            }
        }
        publisher.close().await.unwrap();
        for r in readers {
            assert_eq!(r.await.unwrap(), N);
        }
    });
}

/// Idle connections cost no CPU: 64 connections whose receivers await (after their spin
/// budget; half of them through the byte stream) use next to no CPU time of the runtime's threads over half a second.
#[test]
fn idle_connections_cost_no_cpu() {
    let tids = Arc::new(Mutex::new(Vec::<libc::pid_t>::new()));
    let t2 = tids.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || t2.lock().unwrap().push(gettid()))
        .build()
        .unwrap();
    rt.block_on(async {
        let o = opts("shm").wait_policy(WaitPolicy::default());
        let mut waiting = Vec::new();
        let mut keep = Vec::new();
        for (i, (c, mut s)) in pairs("shm", &o, CONNS).await.into_iter().enumerate() {
            keep.push(c);
            // Half of them read through the byte stream, whose spin wakes its own task.
            waiting.push(tokio::spawn(async move {
                if i % 2 == 0 {
                    return s.recv_vec().await.unwrap();
                }
                let mut s = s.into_byte_stream();
                let mut buf = vec![0u8; 64];
                let n = s.read(&mut buf).await.unwrap();
                buf.truncate(n);
                buf
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = cpu_of(&tids.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let used = cpu_of(&tids.lock().unwrap()) - before;
        assert!(
            used < Duration::from_millis(25),
            "64 idle connections used {used:?} of CPU in 500 ms"
        );
        // Still alive: one message each wakes them all.
        for c in &mut keep {
            c.send(b"wake").await.unwrap();
        }
        for w in waiting {
            assert_eq!(w.await.unwrap(), b"wake");
        }
    });
}

/// CPU time (user + system) of the threads `tids` of this process.
fn cpu_of(tids: &[libc::pid_t]) -> Duration {
    let tick = unsafe_free_clk_tck();
    let mut total = 0u64;
    for tid in tids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
            continue;
        };
        // Fields after the command name (which ends with ')'): utime is the 12th, stime
        // the 13th of those.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        total += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    }
    Duration::from_secs_f64(total as f64 / tick as f64)
}

fn unsafe_free_clk_tck() -> i64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t
    } else {
        100
    }
}

/// A peer process killed with SIGKILL: each of the 64 connections it held reports
/// `ConnectionReset` to the task awaiting `recv` within 100 ms of the kill, after the
/// messages it had sent. Retried (at most 3 attempts) when over budget, as the blocking
/// suite does: on 2 shared vCPUs a runnable thread can wait longer than that for a CPU.
#[test]
fn peer_killed_resets_within_100ms() {
    for t in ["shm", "ux", "tcp"] {
        let mut worst = Vec::new();
        let mut ok = false;
        for attempt in 0..3 {
            let w = peer_death_once(t);
            eprintln!("{t}: attempt {attempt}: slowest reset {w:?}");
            worst.push(w);
            if w <= Duration::from_millis(100) {
                ok = true;
                break;
            }
        }
        assert!(
            ok,
            "{t}: reset later than 100 ms in every attempt: {worst:?}"
        );
    }
}

fn peer_death_once(t: &str) -> Duration {
    let t = t.to_string();
    runtime().block_on(async move {
        tokio::time::timeout(DEADLINE, async move {
            let o = opts(&t);
            let (mut l, addr) = bind_async(&t, &o);
            let mut child = rerun_ignored("child_main")
                .env(ROLE_VAR, "hold")
                .env(ADDR_VAR, &addr)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut conns = Vec::new();
            for _ in 0..CONNS {
                conns.push(l.accept().await.unwrap());
            }
            // The child says when it has sent its messages.
            let stdout = child.stdout.take().unwrap();
            tokio::task::spawn_blocking(move || {
                for line in BufReader::new(stdout).lines() {
                    if line.unwrap().contains(READY_MARK) {
                        return;
                    }
                }
                panic!("child ended before it was ready");
            })
            .await
            .unwrap();
            let (gate_tx, gate_rx) = tokio::sync::watch::channel(None::<Instant>);
            let mut tasks = Vec::new();
            for mut c in conns {
                let mut gate = gate_rx.clone();
                tasks.push(tokio::spawn(async move {
                    for seq in 0..3u64 {
                        verify(seq, 100, &c.recv_vec().await.unwrap());
                    }
                    let e = c.recv_vec().await.unwrap_err();
                    let at = Instant::now();
                    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
                    gate.wait_for(|k| k.is_some()).await.unwrap();
                    let killed = gate.borrow().unwrap();
                    at.saturating_duration_since(killed)
                }));
            }
            // Let every task take its three messages and await the fourth.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let killed = Instant::now();
            child.kill().unwrap();
            gate_tx.send(Some(killed)).unwrap();
            let mut worst = Duration::ZERO;
            for task in tasks {
                worst = worst.max(task.await.unwrap());
            }
            child.wait().unwrap();
            worst
        })
        .await
        .expect("a task never heard of its peer's death")
    })
}

/// The child role: connect 64 times (blocking API), send three messages on each, say
/// so, then wait to be killed (or for stdin to close, should the test die first).
#[test]
#[ignore = "a child process's role: run by the peer-death test"]
fn child_main() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    assert_eq!(role, "hold");
    let addr = std::env::var(ADDR_VAR).unwrap();
    let t = addr.split(':').next().unwrap().to_string();
    let o = opts(&t);
    let mut conns = Vec::new();
    for _ in 0..CONNS {
        let mut c = shmlink::Connection::connect(&addr, &o).unwrap();
        for seq in 0..3u64 {
            c.send(&payload(seq, 100)).unwrap();
        }
        conns.push(c);
    }
    println!("{READY_MARK}");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(conns);
}
