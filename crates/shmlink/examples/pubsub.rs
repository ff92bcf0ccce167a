//! Publish/subscribe floor measurements between pinned processes: one-way latency of
//! 64-byte messages to one subscriber on another core, and the publisher's CPU time per
//! message with 1, 2, 4 and 8 subscriber processes.
//!
//! `cargo run --release --example pubsub -- [latency [COUNT] | cpu [COUNT] [SUBS...] |
//! net [COUNT] [SUBS...]]` (default: latency and cpu, 200,000 latency samples, 2,000,000
//! messages per CPU run, 1 2 4 8).
//!
//! Latency: the publisher (CPU 0) stamps each message with `CLOCK_MONOTONIC` and sends
//! one every 10 µs, so every message finds the subscriber (CPU 1) waiting; the subscriber
//! reports receive time minus stamp. CPU: the publisher (CPU 0) publishes as fast as it
//! can, under each policy, to N subscribers that all run on the other CPUs, and reports
//! its own user+system time per message (`getrusage`), which is what "one write per
//! message" is about; under `block` that includes the time it waits for the slowest
//! subscriber, under `overwrite` it never waits.
//!
//! Hostile (`hostile [COUNT]`, default 1,000,000): the publisher's wall time per 64-byte
//! `overwrite` publish (CPU 0) alone, next to a subscriber (a thread on CPU 1, using
//! `shmlink_testkit::HostileSubscriber`) that announces sleep in a loop without reading,
//! and next to one that also moves its cursor up to what was published, so that each
//! announcement is owed a doorbell (what an honest subscriber sleeping between messages
//! costs) — the cost the doorbell rule bounds (docs/threat-model.md).
//!
//! Net: the same stream under `block` to N subscriber processes over `tcp:` on loopback
//! (default 500,000 messages to 1 and 4): messages per second from the first publish
//! until every subscriber has read the last one, and the publishing process's CPU time
//! per message (the publishing thread and the fan-out thread together).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shmlink::{
    ErrorKind, Policy, PubSubOptions, Publisher, PublisherStats, Subscriber, WaitPolicy,
};

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPUs online (not those this process may run on: it pins itself).
fn cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    n.max(1) as usize
}

fn main() -> shmlink::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--sub") => subscriber(&args[1], &args[2], args[3].parse().unwrap()),
        Some("latency") => latency(args.get(1).and_then(|n| n.parse().ok()).unwrap_or(200_000)),
        Some("cpu") => {
            let (count, subs) = count_and_subs(&args, 2_000_000, &[1, 2, 4, 8]);
            cpu(count, subs)
        }
        Some("net") => {
            let (count, subs) = count_and_subs(&args, 500_000, &[1, 4]);
            net(count, subs)
        }
        Some("hostile") => hostile(
            args.get(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(1_000_000),
        ),
        _ => {
            latency(200_000)?;
            cpu(2_000_000, vec![1, 2, 4, 8])
        }
    }
}

/// `MODE [COUNT] [SUBS...]`, with defaults.
fn count_and_subs(args: &[String], count: u64, subs: &[usize]) -> (u64, Vec<usize>) {
    let count = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(count);
    let given: Vec<usize> = args[2.min(args.len())..]
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    (
        count,
        if given.is_empty() {
            subs.to_vec()
        } else {
            given
        },
    )
}

fn spawn_sub(addr: &str, mode: &str, cpu: usize) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .args(["--sub", addr, mode, &cpu.to_string()])
        .stdout(Stdio::inherit())
        .spawn()
        .expect("spawn a subscriber")
}

/// A subscriber process: `latency` reports percentiles of one-way delays, `drain` reads
/// until the end.
fn subscriber(addr: &str, mode: &str, cpu: usize) -> shmlink::Result<()> {
    shmlink_sys::pin_to_cpu(cpu).ok();
    let mut sub = Subscriber::connect(addr, &PubSubOptions::default())?;
    let mut buf = [0u8; 64];
    let mut delays = Vec::new();
    let mut lagged = 0;
    loop {
        match sub.recv(&mut buf) {
            Ok(_) if mode == "latency" => {
                let sent = u64::from_le_bytes(buf[..8].try_into().unwrap());
                delays.push(now_ns().saturating_sub(sent));
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Lagged => lagged += e.missed().unwrap_or(0),
            Err(e) if e.kind() == ErrorKind::EndOfStream => break,
            Err(e) => return Err(e),
        }
    }
    if mode == "latency" {
        const WARMUP: usize = 10_000;
        let mut d = delays.split_off(WARMUP.min(delays.len()));
        d.sort_unstable();
        let p = |q: f64| d[((d.len() - 1) as f64 * q) as usize];
        println!(
            "latency, 64 B, 1 subscriber, publisher CPU 0 -> subscriber CPU {cpu}: {} samples one-way: p50 {} ns, p90 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
            d.len(),
            p(0.5),
            p(0.9),
            p(0.99),
            p(0.999),
            p(1.0)
        );
    } else if lagged > 0 {
        eprintln!("  (a subscriber on CPU {cpu} lost {lagged} messages to overwriting)");
    }
    Ok(())
}

fn latency(count: usize) -> shmlink::Result<()> {
    shmlink_sys::pin_to_cpu(0).ok();
    let addr = format!("shm:pubsub-lat-{}", std::process::id());
    let opts = PubSubOptions::default().slots(1024).max_msg_size(64);
    let mut publisher = Publisher::bind(&addr, &opts)?;
    let mut child = spawn_sub(&addr, "latency", 1 % cpus());
    let result = (|| {
        publisher.wait_for_subscribers(1, Duration::from_secs(10))?;
        for _ in 0..10_000 + count {
            let next = Instant::now() + Duration::from_micros(10);
            let mut loan = publisher.loan(64)?;
            loan[..8].copy_from_slice(&now_ns().to_le_bytes());
            loan.publish()?;
            while Instant::now() < next {
                std::hint::spin_loop();
            }
        }
        publisher.close()
    })();
    child.wait().expect("wait for the subscriber");
    result
}

fn cpu(count: u64, subs: Vec<usize>) -> shmlink::Result<()> {
    shmlink_sys::pin_to_cpu(0).ok();
    let n_cpus = cpus();
    println!(
        "publisher CPU per 64-byte message ({count} messages, publisher on CPU 0, subscribers on CPUs 1..{}):",
        n_cpus - 1
    );
    // Under `block` the publisher's CPU time includes waiting for the slowest subscriber:
    // spinning with the default wait policy, parked in the kernel with the blocking one.
    let configs = [
        (Policy::Overwrite, WaitPolicy::default(), ""),
        (
            Policy::Block,
            WaitPolicy::default(),
            ", publisher spins while it waits",
        ),
        (
            Policy::Block,
            WaitPolicy::BLOCKING,
            ", publisher parks while it waits",
        ),
    ];
    for (policy, wait, how) in configs {
        for &n in &subs {
            let addr = format!("shm:pubsub-cpu-{}-{n}", std::process::id());
            let opts = PubSubOptions::default()
                .slots(4096)
                .max_msg_size(64)
                .policy(policy)
                .wait_policy(wait);
            let (elapsed, cpu, stats) = stream(&addr, &opts, n, count, false)?;
            println!(
                "  {policy:?}{how}, {n} subscriber(s): {:.1} ns CPU/message, {:.2} M messages/s{}",
                cpu.as_nanos() as f64 / count as f64,
                count as f64 / elapsed.as_secs_f64() / 1e6,
                if stats.detached > 0 {
                    format!(" ({} detached)", stats.detached)
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}

/// Publishes `count` 64-byte messages on a topic bound at `addr` to `n` draining
/// subscriber processes (on CPUs 1..); returns the publisher's wall and process CPU time
/// up to its last publish — or, with `delivered`, until every subscriber has read the
/// last message — and its counters.
fn stream(
    addr: &str,
    opts: &PubSubOptions,
    n: usize,
    count: u64,
    delivered: bool,
) -> shmlink::Result<(Duration, Duration, PublisherStats)> {
    let n_cpus = cpus();
    let mut publisher = Publisher::bind(addr, opts)?;
    let addr = publisher.local_addr();
    let mut children: Vec<Child> = (0..n)
        .map(|i| spawn_sub(&addr, "drain", 1 + i % (n_cpus - 1).max(1)))
        .collect();
    let result = (|| {
        publisher.wait_for_subscribers(n, Duration::from_secs(10))?;
        let msg = [7u8; 64];
        let (t, cpu) = (Instant::now(), shmlink_sys::cpu_time());
        for _ in 0..count {
            publisher.publish(&msg)?;
        }
        let published = (t.elapsed(), shmlink_sys::cpu_time() - cpu);
        let stats = publisher.stats();
        publisher.close()?;
        Ok::<_, shmlink::Error>((t, cpu, published, stats))
    })();
    for c in &mut children {
        c.wait().expect("wait for a subscriber");
    }
    let (t, cpu, published, stats) = result?;
    let (elapsed, cpu) = if delivered {
        (t.elapsed(), shmlink_sys::cpu_time() - cpu)
    } else {
        published
    };
    Ok((elapsed, cpu, stats))
}

fn net(count: u64, subs: Vec<usize>) -> shmlink::Result<()> {
    shmlink_sys::pin_to_cpu(0).ok();
    let n_cpus = cpus();
    println!(
        "tcp fan-out of 64-byte messages under block ({count} messages, publisher on CPU 0, subscribers on CPUs 1..{}):",
        n_cpus - 1
    );
    for n in subs {
        let opts = PubSubOptions::default().slots(4096).max_msg_size(64);
        let (elapsed, cpu, _) = stream("tcp:127.0.0.1:0", &opts, n, count, true)?;
        println!(
            "  {n} tcp subscriber(s): {:.0} k messages/s to each, publisher process {:.0} ns CPU/message",
            count as f64 / elapsed.as_secs_f64() / 1e3,
            cpu.as_nanos() as f64 / count as f64,
        );
    }
    Ok(())
}

/// See the module docs (`hostile`).
fn hostile(count: u64) -> shmlink::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    shmlink_sys::pin_to_cpu(0).ok();
    println!("publisher wall time per 64-byte publish ({count} messages, overwrite, CPU 0; the hostile subscriber a thread on CPU 1):");
    for (name, hostile, moves) in [
        ("no subscriber", false, false),
        ("a subscriber announcing sleep without reading", true, false),
        (
            "a subscriber announcing sleep and moving its cursor",
            true,
            true,
        ),
    ] {
        let addr = format!("shm:pubsub-hostile-{}", std::process::id());
        let opts = PubSubOptions::default()
            .slots(4096)
            .max_msg_size(64)
            .policy(Policy::Overwrite);
        let mut publisher = Publisher::bind(&addr, &opts)?;
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(AtomicU64::new(0));
        let attacker = hostile.then(|| {
            let h = shmlink_testkit::HostileSubscriber::connect(&addr).expect("subscribe");
            let (stop, published) = (stop.clone(), published.clone());
            std::thread::spawn(move || {
                shmlink_sys::pin_to_cpu(1).ok();
                // Announcing as often as it can; doorbells taken now and then, so that
                // its socket does not fill up (a full one costs the publisher the same
                // failing system call).
                let mut doorbells = 0;
                for round in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if moves {
                        h.store_cursor(published.load(Ordering::Relaxed));
                    }
                    h.announce_sleep();
                    if round % 1024 == 0 {
                        doorbells += h.take_doorbells();
                    }
                }
                doorbells + h.take_doorbells()
            })
        });
        if hostile {
            publisher.wait_for_subscribers(1, Duration::from_secs(10))?;
        }
        let t = Instant::now();
        for seq in 0..count {
            publisher.publish(&seq.to_le_bytes())?;
            published.store(seq + 1, Ordering::Relaxed);
        }
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        let doorbells = attacker.map_or(0, |t| t.join().expect("attacker"));
        println!(
            "  {name}: {:.1} ns/publish, {doorbells} doorbells",
            took.as_nanos() as f64 / count as f64
        );
        publisher.close()?;
    }
    Ok(())
}
