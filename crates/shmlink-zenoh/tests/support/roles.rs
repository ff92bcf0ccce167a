//! The processes a test starts on its "hosts": this test binary again, run as
//! `EXE peer --exact --nocapture` with `SHZ_ROLE` set (see [`run_role`]). They talk to
//! the test through stdin/stdout lines.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shmlink::{ErrorKind, Policy, PubSubOptions, Publisher, Subscriber};

use super::hosts::Proc;
use super::msg;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map_or(default, |v| v.parse().unwrap())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs the role named by `SHZ_ROLE`; returns false when there is none (a plain test run).
pub fn run_role() -> bool {
    let Ok(role) = std::env::var("SHZ_ROLE") else {
        return false;
    };
    match role.as_str() {
        "pub" => publisher(),
        "sub" => subscriber(),
        "rawsub" => raw_subscriber(),
        r => panic!("unknown role {r}"),
    }
    true
}

fn policy() -> Policy {
    match env("SHZ_POLICY").as_str() {
        "block" => Policy::Block,
        _ => Policy::Overwrite,
    }
}

/// A local publisher, or with `SHZ_ZENOH_CONNECT` (a Zenoh endpoint) an
/// `ExportingPublisher` whose own session connects there.
enum Pub {
    Local(Publisher),
    Exporting(Box<shmlink_zenoh::ExportingPublisher>),
}

impl Pub {
    fn bind(topic: &str, opts: &PubSubOptions) -> Pub {
        match std::env::var("SHZ_ZENOH_CONNECT") {
            Ok(endpoint) => {
                let config = shmlink_zenoh::BridgeConfig {
                    connect: vec![endpoint],
                    ..Default::default()
                };
                Pub::Exporting(Box::new(
                    shmlink_zenoh::ExportingPublisher::open(&config, topic, opts)
                        .expect("exporting publisher"),
                ))
            }
            Err(_) => Pub::Local(Publisher::bind(&format!("shm:{topic}"), opts).expect("bind")),
        }
    }

    fn local(&self) -> &Publisher {
        match self {
            Pub::Local(p) => p,
            Pub::Exporting(p) => p.local(),
        }
    }

    fn publish(&mut self, m: &[u8]) {
        match self {
            Pub::Local(p) => p.publish(m).expect("publish"),
            Pub::Exporting(p) => p.publish(m).expect("publish"),
        }
    }

    fn close(self) {
        match self {
            Pub::Local(p) => p.close().expect("close"),
            Pub::Exporting(p) => p.close().expect("close"),
        }
    }
}

/// `SHZ_TOPIC`, `SHZ_COUNT` messages, `SHZ_SUBS` subscribers to wait for, `SHZ_SIZES`
/// (`mixed`, `tail` or `small`: see `msg::size_of`), `SHZ_GAP_US` between messages,
/// `SHZ_ZENOH_CONNECT` (see [`Pub`]). Sends warm-up messages until a `go` line, then the
/// stream; says `done`; closes the topic at `exit` or stdin's end.
fn publisher() {
    let topic = env("SHZ_TOPIC");
    let count = env_u64("SHZ_COUNT", 1000);
    let sizes = env("SHZ_SIZES");
    let large = sizes != "small";
    let gap = Duration::from_micros(env_u64("SHZ_GAP_US", 0));
    // Publishers of one topic on several hosts number their messages from different
    // bases (multiples of `ORIGIN_STEP`).
    let base = env_u64("SHZ_SEQ_BASE", 0);
    let opts = PubSubOptions::default()
        .policy(policy())
        .max_msg_size(if large { msg::MAX } else { 4096 })
        .slots(env_u64("SHZ_SLOTS", 64) as usize)
        .stall_timeout(Duration::from_secs(10));
    let mut p = Pub::bind(&topic, &opts);
    p.local()
        .wait_for_subscribers(env_u64("SHZ_SUBS", 1) as usize, Duration::from_secs(30))
        .expect("subscribers");
    say("bound");
    let go = Arc::new(AtomicBool::new(false));
    let exit = Arc::new(AtomicBool::new(false));
    {
        let (go, exit) = (Arc::clone(&go), Arc::clone(&exit));
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref() {
                    Ok("go") => go.store(true, Ordering::SeqCst),
                    Ok("exit") | Err(_) => break,
                    _ => {}
                }
            }
            exit.store(true, Ordering::SeqCst);
        });
    }
    let mut buf = Vec::new();
    while !go.load(Ordering::SeqCst) {
        assert!(!exit.load(Ordering::SeqCst), "told to exit before go");
        msg::fill(&mut buf, msg::WARMUP - base / msg::ORIGIN_STEP, 64);
        p.publish(&buf);
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = Instant::now();
    for seq in 0..count {
        msg::fill(&mut buf, base + seq, msg::size_of(&sizes, seq));
        p.publish(&buf);
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
    }
    say(&format!("done {} ms", start.elapsed().as_millis()));
    while !exit.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
    p.close();
}

/// `SHZ_TOPIC`, `SHZ_COUNT` (the stream's length), `SHZ_SLOW_US` (a pause after each
/// message), `SHZ_OUT` (a file for every sequence number and lag, optional). Connects
/// (retrying while the topic does not exist), says `ready` at the first message, and
/// ends at the last message of the stream or after `SHZ_IDLE_MS` without one, with a
/// `result` line.
fn subscriber() {
    let topic = env("SHZ_TOPIC");
    let count = env_u64("SHZ_COUNT", 1000);
    let slow = Duration::from_micros(env_u64("SHZ_SLOW_US", 0));
    let idle = Duration::from_millis(env_u64("SHZ_IDLE_MS", 10_000));
    // Messages expected in all (from every origin; default: one origin's `count`).
    let expect = env_u64("SHZ_EXPECT", count);
    // Warm-up messages from this many origins before `ready`.
    let origins = env_u64("SHZ_ORIGINS", 1) as usize;
    // After the last expected message, read on this long: any message then is an extra.
    let linger = Duration::from_millis(env_u64("SHZ_LINGER_MS", 0));
    let mut warm = std::collections::HashSet::new();
    let addr = format!("shm:{topic}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut sub = loop {
        match Subscriber::connect(&addr, &PubSubOptions::default()) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    sub.set_nonblocking(true);
    let mut out = std::env::var_os("SHZ_OUT")
        .map(|p| std::io::BufWriter::new(std::fs::File::create(p).expect("SHZ_OUT")));
    let mut buf = vec![0u8; sub.max_msg_size()];
    let (mut ready, mut received, mut missed, mut errors) = (false, 0u64, 0u64, 0u64);
    // The next sequence number expected from each origin (in order).
    let mut next_of = std::collections::HashMap::<u64, u64>::new();
    let mut next = 0u64;
    let mut first_error = String::new();
    let mut last_msg = Instant::now();
    loop {
        match sub.recv(&mut buf) {
            Ok(n) => {
                last_msg = Instant::now();
                match msg::check(&buf[..n]) {
                    Ok(seq) if seq >= msg::WARMUP - 64 => {
                        warm.insert(seq);
                        if !ready && warm.len() >= origins {
                            ready = true;
                            say("ready");
                        }
                    }
                    Ok(seq) => {
                        if !ready {
                            ready = true;
                            say("ready");
                        }
                        let origin = seq / msg::ORIGIN_STEP;
                        next = next_of
                            .get(&origin)
                            .copied()
                            .unwrap_or(origin * msg::ORIGIN_STEP);
                        if seq < next {
                            errors += 1;
                            if first_error.is_empty() {
                                first_error = format!(
                                    "message {seq} after {}: duplicate or reordered",
                                    next - 1
                                );
                            }
                        }
                        if let Some(o) = &mut out {
                            writeln!(o, "{seq}").unwrap();
                        }
                        received += 1;
                        next = seq + 1;
                        next_of.insert(origin, next);
                        if received == expect
                            || (expect == count && seq % msg::ORIGIN_STEP + 1 == count)
                        {
                            break;
                        }
                        if !slow.is_zero() {
                            std::thread::sleep(slow);
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        if first_error.is_empty() {
                            first_error = e;
                        }
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if last_msg.elapsed() > idle {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) if e.kind() == ErrorKind::Lagged => {
                let m = e.missed().unwrap_or(0);
                missed += m;
                if let Some(o) = &mut out {
                    writeln!(o, "lag {m}").unwrap();
                }
            }
            Err(e) => {
                errors += 1;
                first_error = format!("subscription ended: {e}");
                break;
            }
        }
    }
    let end = Instant::now() + linger;
    while Instant::now() < end {
        match sub.recv(&mut buf) {
            Ok(n) => {
                errors += 1;
                if first_error.is_empty() {
                    first_error = format!(
                        "an extra message after the last: {:?}",
                        msg::check(&buf[..n])
                    );
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => break,
        }
    }
    drop(out);
    say(&format!(
        "result received={received} missed={missed} next={next} errors={errors} first_error={first_error:?}"
    ));
}

/// For messages from other Zenoh applications: `SHZ_TOPIC`, `SHZ_COUNT`; prints `ready`
/// at the first message, `msg LEN FNV1A64` for each one but `warmup`, and a `result`
/// line after `SHZ_COUNT` of them or `SHZ_IDLE_MS` without one.
fn raw_subscriber() {
    let topic = env("SHZ_TOPIC");
    let count = env_u64("SHZ_COUNT", 1000);
    let idle = Duration::from_millis(env_u64("SHZ_IDLE_MS", 10_000));
    let addr = format!("shm:{topic}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut sub = loop {
        match Subscriber::connect(&addr, &PubSubOptions::default()) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("connect {addr}: {e}"),
        }
    };
    sub.set_nonblocking(true);
    let mut buf = vec![0u8; sub.max_msg_size()];
    let (mut ready, mut received, mut last) = (false, 0u64, Instant::now());
    while received < count && last.elapsed() < idle {
        match sub.recv(&mut buf) {
            Ok(n) => {
                last = Instant::now();
                if !ready {
                    ready = true;
                    say("ready");
                }
                if &buf[..n] != b"warmup" {
                    received += 1;
                    say(&format!("msg {n} {}", msg::fnv(&buf[..n])));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(200))
            }
            Err(e) if e.kind() == ErrorKind::Lagged => {
                say(&format!("lag {}", e.missed().unwrap_or(0)))
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    say(&format!("result received={received}"));
}

/// The number after `name=` in a role's result line.
pub fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        .parse()
        .unwrap()
}

/// Waits until every subscriber is ready, lets the publishers go, and checks that each
/// subscriber got `want(its name)` messages without an error; then lets the publishers
/// exit.
pub fn publish_round(pubs: &mut [Proc], subs: &mut [Proc], want: impl Fn(&str) -> u64) {
    for s in subs.iter_mut() {
        s.expect("ready", Duration::from_secs(40));
    }
    for p in pubs.iter_mut() {
        p.tell("go");
    }
    for p in pubs.iter_mut() {
        p.expect("done", Duration::from_secs(60));
    }
    for s in subs.iter_mut() {
        let r = s.expect("result", Duration::from_secs(60));
        assert_eq!(field(&r, "received"), want(&s.name), "{}: {r}", s.name);
        assert_eq!(field(&r, "errors"), 0, "{}: {r}", s.name);
    }
    for p in pubs.iter_mut() {
        p.tell("exit");
    }
}
