//! The two ends of one `--pattern remote` transfer, as child processes of the bench
//! (`shmlink-bench __remote-end SPEC`): a sender or a receiver of shmlink (a local topic,
//! or a `tcp:` topic and its remote subscriber), Redis pub/sub or RabbitMQ. The pure
//! Zenoh ends are `shmlink-zenoh-perf`'s, which speaks the same protocol (its module
//! documentation), so that the bench does not link Zenoh.
//!
//! Every message starts with its sequence number (u64 LE), the sender's
//! `CLOCK_MONOTONIC` in ns (u64 LE; one clock for every network namespace of the
//! machine) and a kind byte ([`PROBE`], [`MEASURED`], [`END`]); the rest of the buffer is
//! filled once. The sender prints `ready`, sends a probe every 20 ms until `go` arrives
//! on stdin, then the measured messages (paced by `gap_us`, or back to back), then end
//! messages, and prints `sent start_ns=.. end_ns=.. count=..`. A receiver prints `ready`
//! at its first message and at the first end message `result count=.. lost=.. bad=..
//! complete=1 p50_ns=.. p99_ns=.. max_ns=.. first_ns=.. last_ns=..`. Both then wait for
//! stdin to close, so that the bench reads their CPU time while they are alive.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shmlink::{Policy, PubSubOptions, Publisher, Subscriber};

use crate::brokers::{amqp, redis};
use crate::pubsub::message::now_ns;

/// The hidden subcommand of an end.
pub const END_CMD: &str = "__remote-end";

/// The header's length: sequence number, stamp, kind.
pub const HEADER: usize = 17;
/// A message sent before `go`, until every receiver has one.
pub const PROBE: u8 = 0;
/// A measured message.
pub const MEASURED: u8 = 1;
/// The end of the measured messages.
pub const END: u8 = 2;

/// How long a receiver waits for the topic, the broker, or the next message.
const WAIT: Duration = Duration::from_secs(60);

/// Which way an end is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Send,
    Recv,
}

/// What carries the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Carrier {
    /// A shmlink topic: `shm:NAME` (local) or `tcp:ADDR:PORT` (the publisher's fan-out
    /// to remote subscribers).
    Shmlink,
    /// Redis pub/sub on the channel `channel` of the server at `addr`.
    Redis,
    /// RabbitMQ, the fanout exchange `channel` of the broker at `addr`.
    Rabbitmq,
}

/// One end, as JSON on its command line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EndSpec {
    pub role: Role,
    pub carrier: Carrier,
    pub addr: String,
    pub channel: String,
    pub size: usize,
    pub count: u64,
    pub gap_us: u64,
    pub throughput: bool,
}

/// The slots of a shmlink topic for messages of `size`: 16 MiB of ring, 16 to 1024
/// slots.
pub fn slots(size: usize) -> usize {
    ((16usize << 20) / size.max(1)).clamp(16, 1024)
}

/// `shmlink-bench __remote-end SPEC`.
pub fn main(spec: &str) -> ExitCode {
    let r = serde_json::from_str::<EndSpec>(spec)
        .map_err(|e| format!("bad spec {spec:?}: {e}"))
        .and_then(|s| {
            if s.size < HEADER {
                return Err(format!("size {} is under {HEADER} bytes", s.size));
            }
            match s.role {
                Role::Send => send(&s),
                Role::Recv => recv(&s),
            }
        });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmlink-bench: remote end: {e}");
            ExitCode::from(1)
        }
    }
}

/// Lines of stdin, read by a thread; `None` at its end.
fn stdin_lines() -> mpsc::Receiver<Option<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(l) = line else { break };
            if tx.send(Some(l)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    rx
}

fn wait_for_eof(rx: &mpsc::Receiver<Option<String>>) {
    while let Ok(Some(_)) = rx.recv() {}
}

fn socket_addr(s: &EndSpec) -> Result<SocketAddr, String> {
    s.addr
        .parse()
        .map_err(|e| format!("broker address {:?}: {e}", s.addr))
}

/// Retries `f` every 50 ms until it succeeds or [`WAIT`] passed.
fn retry<T, E: std::fmt::Display>(
    what: &str,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        match f() {
            Ok(t) => return Ok(t),
            Err(e) if Instant::now() > deadline => return Err(format!("{what}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

type SendFn = Box<dyn FnMut(&[u8]) -> Result<(), String>>;
type CloseFn = Box<dyn FnOnce()>;

fn sender(s: &EndSpec) -> Result<(SendFn, CloseFn), String> {
    Ok(match s.carrier {
        Carrier::Shmlink => {
            let opts = PubSubOptions::default()
                .policy(Policy::Block)
                .max_msg_size(s.size)
                .slots(slots(s.size));
            let p = Publisher::bind(&s.addr, &opts).map_err(|e| format!("bind {}: {e}", s.addr))?;
            let p = std::rc::Rc::new(std::cell::RefCell::new(Some(p)));
            let q = p.clone();
            (
                Box::new(move |m| {
                    let mut g = q.borrow_mut();
                    let p = g.as_mut().expect("open until closed");
                    p.publish(m).map_err(|e| format!("publish: {e}"))
                }),
                Box::new(move || {
                    if let Some(p) = p.borrow_mut().take() {
                        let _ = p.close();
                    }
                }),
            )
        }
        Carrier::Redis => {
            let mut p = redis::Publisher::connect(socket_addr(s)?, &s.channel)
                .map_err(|e| e.to_string())?;
            (
                Box::new(move |m| p.publish(m).map_err(|e| e.to_string())),
                Box::new(|| {}),
            )
        }
        Carrier::Rabbitmq => {
            let p =
                amqp::Publisher::connect(socket_addr(s)?, &s.channel).map_err(|e| e.to_string())?;
            let p = std::rc::Rc::new(std::cell::RefCell::new(Some(p)));
            let q = p.clone();
            (
                Box::new(move |m| {
                    let mut g = q.borrow_mut();
                    let p = g.as_mut().expect("open until closed");
                    p.publish(m).map_err(|e| e.to_string())
                }),
                Box::new(move || {
                    if let Some(p) = p.borrow_mut().take() {
                        let _ = p.close();
                    }
                }),
            )
        }
    })
}

/// Writes the header of message `seq` of `kind` into `buf`, stamped now.
fn stamp(buf: &mut [u8], seq: u64, kind: u8) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[16] = kind;
    buf[8..16].copy_from_slice(&now_ns().to_le_bytes());
}

fn send(s: &EndSpec) -> Result<(), String> {
    let (mut put, close) = sender(s)?;
    let stdin = stdin_lines();
    println!("ready");
    let mut buf: Vec<u8> = (0..s.size).map(|i| i as u8).collect();
    let mut seq = 0u64;
    loop {
        match stdin.recv_timeout(Duration::from_millis(20)) {
            Ok(Some(l)) if l.trim() == "go" => break,
            Ok(None) => return Err("stdin closed before go".into()),
            _ => {}
        }
        stamp(&mut buf, seq, PROBE);
        put(&buf)?;
        seq += 1;
    }
    let start = now_ns();
    for _ in 0..s.count {
        stamp(&mut buf, seq, MEASURED);
        put(&buf)?;
        seq += 1;
        if !s.throughput {
            std::thread::sleep(Duration::from_micros(s.gap_us));
        }
    }
    let end = now_ns();
    for _ in 0..3 {
        stamp(&mut buf, seq, END);
        put(&buf)?;
        seq += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    close();
    println!("sent start_ns={start} end_ns={end} count={}", s.count);
    wait_for_eof(&stdin);
    Ok(())
}

type RecvFn = Box<dyn FnMut(&mut Vec<u8>) -> Result<(), String>>;

fn receiver(s: &EndSpec) -> Result<RecvFn, String> {
    Ok(match s.carrier {
        Carrier::Shmlink => {
            let mut sub = retry(&format!("subscribe to {}", s.addr), || {
                Subscriber::connect(&s.addr, &PubSubOptions::default())
            })?;
            let max = s.size;
            Box::new(move |buf| {
                buf.resize(max, 0);
                let n = sub.recv(buf).map_err(|e| format!("recv: {e}"))?;
                buf.truncate(n);
                Ok(())
            })
        }
        Carrier::Redis => {
            let mut sub = redis::Subscriber::connect(socket_addr(s)?, &s.channel)
                .map_err(|e| e.to_string())?;
            sub.set_read_timeout(Some(WAIT))
                .map_err(|e| e.to_string())?;
            Box::new(move |buf| sub.recv(buf).map_err(|e| e.to_string()))
        }
        Carrier::Rabbitmq => {
            let mut sub = amqp::Subscriber::connect(socket_addr(s)?, &s.channel)
                .map_err(|e| e.to_string())?;
            sub.set_read_timeout(Some(WAIT))
                .map_err(|e| e.to_string())?;
            Box::new(move |buf| sub.recv(buf).map_err(|e| e.to_string()))
        }
    })
}

/// The `q` quantile of sorted `v` (0 if empty).
pub fn quantile(v: &[u64], q: f64) -> u64 {
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0)
}

fn recv(s: &EndSpec) -> Result<(), String> {
    let mut get = receiver(s)?;
    let stdin = stdin_lines();
    let mut buf = Vec::with_capacity(s.size);
    let mut ready = false;
    let mut lat = Vec::with_capacity(s.count as usize);
    let (mut first_seq, mut last_seq, mut first_ns, mut last_ns, mut bad) = (None, 0, 0, 0, 0u64);
    loop {
        get(&mut buf)?;
        let now = now_ns();
        if buf.len() != s.size {
            bad += 1;
            continue;
        }
        if !ready {
            ready = true;
            println!("ready");
        }
        let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        let (seq, sent) = (word(0), word(8));
        match buf[16] {
            MEASURED => {
                if first_seq.is_none() {
                    first_seq = Some(seq);
                    first_ns = now;
                }
                last_seq = seq;
                last_ns = now;
                lat.push(now.saturating_sub(sent));
            }
            END => break,
            _ => {}
        }
    }
    let count = lat.len() as u64;
    let span = first_seq.map_or(0, |f| last_seq.wrapping_sub(f).wrapping_add(1));
    lat.sort_unstable();
    println!(
        "result count={count} lost={} bad={bad} complete=1 p50_ns={} p99_ns={} max_ns={} first_ns={first_ns} last_ns={last_ns}",
        span.saturating_sub(count),
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
        lat.last().copied().unwrap_or(0),
    );
    wait_for_eof(&stdin);
    Ok(())
}
