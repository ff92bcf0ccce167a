//! `shmlink-zenoh-perf`: pure Zenoh pub/sub as `shmlink-bench --pattern remote` drives it
//! (docs/benchmarks.md), the baseline the bridge is measured against. A program of its
//! own so that the bench's build does not carry Zenoh's dependency tree.
//!
//! Driven the way Zenoh's `z_pub_thr` and `z_ping` examples drive it: a peer-mode session
//! with explicit endpoints (scouting and gossip off, as the bridge's), a publisher with
//! `CongestionControl::Block` putting one payload per message, and a callback subscriber
//! (`z_sub_thr`'s shape). With `--exporting TOPIC` the sender is a shmlink
//! `ExportingPublisher` instead (the bench's row of that name: a bridge imports it on
//! the other side), and with `--importing TOPIC` the receiver is an
//! `ImportingSubscriber` (no bridge on either side, with both).
//!
//! The protocol on stdin/stdout and the message layout are the bench's (its
//! `patterns/remote/ends.rs`): every message starts with its sequence number (u64 LE),
//! the sender's `CLOCK_MONOTONIC` in ns (u64 LE) and a kind byte (0 probe, 1 measured,
//! 2 end). The sender prints `ready`, sends a probe every 20 ms until a `go` line on
//! stdin, then `--count` measured messages (`--gap-us` apart, or back to back with
//! `--throughput`), then end messages, and prints `sent start_ns=.. end_ns=.. count=..`.
//! The subscriber prints `ready` at its first message and, at the first end message,
//! `result count=.. lost=.. p50_ns=.. p99_ns=.. max_ns=.. first_ns=.. last_ns=..`. Both
//! then wait for stdin to close, so the bench can read their CPU time first.

use std::io::BufRead;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use zenoh::qos::CongestionControl;
use zenoh::Wait;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Send,
    Recv,
}

/// One end of a pure Zenoh pub/sub measurement (see the module's documentation).
#[derive(Parser, Debug)]
#[command(name = "shmlink-zenoh-perf")]
struct Args {
    /// send or recv.
    role: Role,
    /// The key expression.
    #[arg(long, default_value = "shmlink-bench/remote")]
    key: String,
    /// Message size in bytes (at least 17).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Measured messages.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Pause between measured messages (latency mode), in microseconds.
    #[arg(long, default_value_t = 500)]
    gap_us: u64,
    /// Back to back (no pause).
    #[arg(long)]
    throughput: bool,
    /// Listen on a Zenoh endpoint (tcp/ADDR:PORT). Repeatable.
    #[arg(long, value_name = "ENDPOINT")]
    listen: Vec<String>,
    /// Connect to a Zenoh endpoint. Repeatable.
    #[arg(long, value_name = "ENDPOINT")]
    connect: Vec<String>,
    /// send: publish shmlink topic TOPIC with an `ExportingPublisher` (the local ring,
    /// then Zenoh under `shmlink/TOPIC`, what a bridge imports) instead of a plain Zenoh
    /// publisher; `--key` is not used.
    #[arg(long, value_name = "TOPIC")]
    exporting: Option<String>,
    /// send, plain Zenoh publisher: put every message with an attachment as long as the
    /// bridge's (37 bytes, its sequence number counting), to measure what Zenoh charges
    /// for the attachment alone.
    #[arg(long)]
    attachment: bool,
    /// recv: subscribe with an `ImportingSubscriber` of shmlink topic TOPIC (Zenoh's
    /// `shmlink/TOPIC`, handed over on Zenoh's thread and published into the local
    /// topic for any other subscriber of the host); `--key` is not used.
    #[arg(long, value_name = "TOPIC")]
    importing: Option<String>,
}

/// The header every message starts with: sequence number, stamp, kind.
const HEADER: usize = 17;
const PROBE: u8 = 0;
const MEASURED: u8 = 1;
const END: u8 = 2;

fn now_ns() -> u64 {
    shmlink_sys::process::clock_ns(shmlink_sys::process::Clock::Monotonic)
}

fn config(args: &Args) -> Result<zenoh::Config, String> {
    let mut c = zenoh::Config::default();
    let list = |v: &[String]| {
        format!(
            "[{}]",
            v.iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    for (k, v) in [
        ("mode", "\"peer\"".to_string()),
        ("listen/endpoints", list(&args.listen)),
        ("connect/endpoints", list(&args.connect)),
        ("scouting/multicast/enabled", "false".into()),
        ("scouting/gossip/enabled", "false".into()),
    ] {
        c.insert_json5(k, &v)
            .map_err(|e| format!("zenoh configuration {k} = {v}: {e}"))?;
    }
    Ok(c)
}

/// Lines of stdin, read by a thread: `go`, and the end of input.
fn stdin_lines() -> mpsc::Receiver<Option<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) => {
                    if tx.send(Some(l)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// Waits until stdin closes (the bench has read this process's CPU time).
fn wait_for_eof(rx: &mpsc::Receiver<Option<String>>) {
    while let Ok(Some(_)) = rx.recv() {}
}

/// The payload every message carries after its header, written once (the bench's
/// senders also fill their buffer once and stamp each message).
fn template(size: usize) -> Vec<u8> {
    (0..size).map(|i| i as u8).collect()
}

/// Message `seq` of `kind`: a copy of `template` with its header, stamped now.
fn message(template: &[u8], seq: u64, kind: u8) -> Vec<u8> {
    let mut m = template.to_vec();
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m[16] = kind;
    m[8..16].copy_from_slice(&now_ns().to_le_bytes());
    m
}

/// The sender's publish: a plain Zenoh put, or an `ExportingPublisher`'s publish.
type Put<'a> = Box<dyn FnMut(Vec<u8>) -> Result<(), String> + 'a>;

fn publisher<'a>(args: &'a Args, session: &zenoh::Session) -> Result<Put<'a>, String> {
    if let Some(topic) = &args.exporting {
        // The bench's shmlink senders' options (its `patterns/remote/ends.rs`).
        let opts = shmlink::PubSubOptions::default()
            .policy(shmlink::Policy::Block)
            .max_msg_size(args.size)
            .slots(((16usize << 20) / args.size).clamp(16, 1024));
        let mut p = shmlink_zenoh::ExportingPublisher::new(
            session,
            topic,
            &opts,
            shmlink_zenoh::DEFAULT_PREFIX,
        )
        .map_err(|e| e.to_string())?;
        return Ok(Box::new(move |m| {
            p.publish_vec(m).map_err(|e| e.to_string())
        }));
    }
    let publisher = session
        .declare_publisher(args.key.clone())
        .congestion_control(CongestionControl::Block)
        .wait()
        .map_err(|e| format!("declare publisher {}: {e}", args.key))?;
    let mut head = shmlink_zenoh::header::Header {
        origin: 1,
        seq: 0,
        policy: shmlink::Policy::Block,
        max_msg: u32::try_from(args.size).unwrap_or(u32::MAX),
        slots: 0,
    };
    let attach = args.attachment;
    Ok(Box::new(move |m| {
        let put = publisher.put(m);
        let put = if attach {
            head.seq += 1;
            put.attachment(head.encode())
        } else {
            put
        };
        put.wait().map_err(|e| format!("put {}: {e}", args.key))
    }))
}

fn send(args: &Args, session: &zenoh::Session) -> Result<(), String> {
    let mut put = publisher(args, session)?;
    let stdin = stdin_lines();
    println!("ready");
    let t = template(args.size);
    let mut seq = 0u64;
    loop {
        match stdin.recv_timeout(Duration::from_millis(20)) {
            Ok(Some(l)) if l.trim() == "go" => break,
            Ok(None) => return Err("stdin closed before go".into()),
            _ => {}
        }
        put(message(&t, seq, PROBE))?;
        seq += 1;
    }
    let start = now_ns();
    for _ in 0..args.count {
        put(message(&t, seq, MEASURED))?;
        seq += 1;
        if !args.throughput {
            std::thread::sleep(Duration::from_micros(args.gap_us));
        }
    }
    let end = now_ns();
    for _ in 0..3 {
        put(message(&t, seq, END))?;
        seq += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("sent start_ns={start} end_ns={end} count={}", args.count);
    wait_for_eof(&stdin);
    Ok(())
}

/// What the subscriber's callback gathers.
#[derive(Default)]
struct Seen {
    ready: bool,
    done: bool,
    latencies: Vec<u64>,
    first_seq: Option<u64>,
    last_seq: u64,
    first_ns: u64,
    last_ns: u64,
    bad: u64,
}

/// The receiver's subscription, alive until dropped: a plain Zenoh callback subscriber,
/// or an `ImportingSubscriber`.
type Subscription = Box<dyn std::any::Any>;

fn subscriber(
    args: &Args,
    session: &zenoh::Session,
    on_message: impl Fn(&[u8]) + Send + Sync + 'static,
) -> Result<Subscription, String> {
    if let Some(topic) = &args.importing {
        // The bench's shmlink subscribers' geometry (its `patterns/remote/ends.rs`).
        let opts = shmlink::PubSubOptions::default()
            .policy(shmlink::Policy::Block)
            .max_msg_size(args.size)
            .slots(((16usize << 20) / args.size).clamp(16, 1024));
        return shmlink_zenoh::ImportingSubscriber::new(
            session,
            topic,
            &opts,
            shmlink_zenoh::DEFAULT_PREFIX,
            on_message,
        )
        .map(|s| Box::new(s) as Subscription)
        .map_err(|e| e.to_string());
    }
    session
        .declare_subscriber(args.key.clone())
        .callback(move |sample| on_message(&sample.payload().to_bytes()))
        .wait()
        .map(|s| Box::new(s) as Subscription)
        .map_err(|e| format!("declare subscriber {}: {e}", args.key))
}

fn recv(args: &Args, session: &zenoh::Session) -> Result<(), String> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (tx, rx) = mpsc::channel::<&'static str>();
    let size = args.size;
    let s = seen.clone();
    let ended = Arc::new(AtomicBool::new(false));
    let e = ended.clone();
    let on_message = move |bytes: &[u8]| {
        let now = now_ns();
        let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
        if g.done {
            return;
        }
        if bytes.len() != size || bytes.len() < HEADER {
            g.bad += 1;
            return;
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let (seq, stamp, kind) = (word(0), word(8), bytes[16]);
        if !g.ready {
            g.ready = true;
            let _ = tx.send("ready");
        }
        match kind {
            MEASURED => {
                if g.first_seq.is_none() {
                    g.first_seq = Some(seq);
                    g.first_ns = now;
                }
                g.last_seq = seq;
                g.last_ns = now;
                g.latencies.push(now.saturating_sub(stamp));
            }
            END => {
                g.done = true;
                // SYNC POINT: Release pairs with the Acquire load below; the
                // counters are read under the mutex anyway.
                e.store(true, Ordering::Release);
                let _ = tx.send("end");
            }
            _ => {}
        }
    };
    let _subscriber = subscriber(args, session, on_message)?;
    let stdin = stdin_lines();
    let timeout = Duration::from_secs(120);
    match rx.recv_timeout(timeout) {
        Ok("ready") => println!("ready"),
        _ => return Err(format!("no message within {timeout:?}")),
    }
    let _ = rx.recv_timeout(timeout);
    // SYNC POINT: Acquire pairs with the callback's Release store.
    let complete = ended.load(Ordering::Acquire);
    let mut g = seen.lock().unwrap_or_else(|p| p.into_inner());
    g.done = true;
    let count = g.latencies.len() as u64;
    let span = g.first_seq.map_or(0, |f| g.last_seq - f + 1);
    let mut l = std::mem::take(&mut g.latencies);
    l.sort_unstable();
    let pct = |q: f64| {
        l.get(((l.len() as f64 * q) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "result count={count} lost={} bad={} complete={} p50_ns={} p99_ns={} max_ns={} first_ns={} last_ns={}",
        span.saturating_sub(count),
        g.bad,
        u8::from(complete),
        pct(0.5),
        pct(0.99),
        l.last().copied().unwrap_or(0),
        g.first_ns,
        g.last_ns
    );
    drop(g);
    wait_for_eof(&stdin);
    Ok(())
}

fn run(args: &Args) -> Result<(), String> {
    if args.size < HEADER {
        return Err(format!("--size {} is under {HEADER} bytes", args.size));
    }
    let session = zenoh::open(config(args)?)
        .wait()
        .map_err(|e| format!("open the Zenoh session: {e}"))?;
    let r = match args.role {
        Role::Send => send(args, &session),
        Role::Recv => recv(args, &session),
    };
    let _ = session.close().wait();
    r
}

fn main() -> ExitCode {
    zenoh::init_log_from_env_or("warn");
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmlink-zenoh-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
