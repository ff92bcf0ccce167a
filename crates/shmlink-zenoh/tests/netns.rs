//! Two "hosts" (network namespaces joined by a veth pair, each with its own rendezvous
//! directory, so no shared memory crosses) and a bridge on each, in peer mode with
//! explicit endpoints: a publisher on A, three local subscribers on A and two on B.
//!
//! - `block`: ordered, checksummed messages of mixed sizes (64 B–1 MiB, the topic's
//!   maximum) reach every subscriber, each exactly once and in order.
//! - `overwrite`: a slow subscriber on B lags; every lag count it is told equals exactly
//!   the messages B's local topic had that it did not read (the fast subscriber on B
//!   reads them all), and what it read plus what it was told it missed is what the
//!   bridge published on B.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use support::hosts::{bridge_exe, unavailable, Net, Proc};
use support::roles::field;

/// Messages of `block`'s stream unless `SHMLINK_ZENOH_COUNT` says otherwise. With the
/// default `mixed` sizes (~67 KB on average) that is ~336 MB through Zenoh, read by 5
/// subscribers: ~20 s in a debug build on 2 busy cores. The 1,000,000 is a
/// release run with the long-tail sizes (docs/zenoh.md, "Tests"):
/// `SHMLINK_ZENOH_COUNT=1000000 SHMLINK_ZENOH_SIZES=tail cargo test --release -p
/// shmlink-zenoh --test netns -- block --nocapture`.
const BLOCK_COUNT: u64 = 5000;
const OVERWRITE_COUNT: u64 = 5000;

/// `block`'s message count and size mix (`mixed` or `tail`, see `support::msg`).
fn block_stream() -> (u64, String) {
    let count = std::env::var("SHMLINK_ZENOH_COUNT")
        .ok()
        .map_or(BLOCK_COUNT, |v| {
            v.parse()
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| panic!("SHMLINK_ZENOH_COUNT={v:?}: not a positive number"))
        });
    let sizes = std::env::var("SHMLINK_ZENOH_SIZES").unwrap_or_else(|_| "mixed".into());
    assert!(
        sizes == "mixed" || sizes == "tail",
        "SHMLINK_ZENOH_SIZES={sizes:?}: mixed or tail"
    );
    (count, sizes)
}

/// A peer process of these tests (`SHZ_ROLE` set); in a plain run, checks the codec.
#[test]
fn peer() {
    if !support::roles::run_role() {
        support::msg::self_check();
    }
}

fn env(topic: &str, count: u64, policy: &str) -> Vec<(&'static str, String)> {
    vec![
        ("SHZ_TOPIC", topic.to_owned()),
        ("SHZ_COUNT", count.to_string()),
        ("SHZ_POLICY", policy.to_owned()),
    ]
}

fn with(
    mut v: Vec<(&'static str, String)>,
    k: &'static str,
    val: impl ToString,
) -> Vec<(&'static str, String)> {
    v.push((k, val.to_string()));
    v
}

/// Bridges on hosts 0 (exporting `topic`, listening) and 1 (importing, connecting).
fn bridges(net: &Net, topic: &str, ip_a: &str) -> (Proc, Proc) {
    let exe = bridge_exe();
    let listen = format!("tcp/{ip_a}:7447");
    let mut a = net.spawn(
        0,
        "bridge-a",
        &exe,
        &["--export", topic, "--listen", &listen],
        &[],
    );
    a.expect("ready", Duration::from_secs(20));
    let mut b = net.spawn(
        1,
        "bridge-b",
        &exe,
        &[
            "--import",
            topic,
            "--connect",
            &listen,
            "--stall-timeout",
            "10000",
        ],
        &[],
    );
    b.expect("ready", Duration::from_secs(20));
    (a, b)
}

/// The bridge's final `stats` line for `topic` in direction `dir`.
fn stats(lines: &[String], topic: &str, dir: &str) -> String {
    lines
        .iter()
        .rev()
        .find(|l| l.starts_with(&format!("stats {topic} {dir} ")))
        .unwrap_or_else(|| panic!("no stats for {topic} {dir} in {lines:?}"))
        .clone()
}

#[test]
fn block() {
    if let Some((category, why)) = unavailable() {
        return shmlink_testkit::skip(category, why);
    }
    let started = Instant::now();
    let (count, sizes) = block_stream();
    // Generous for any count (a guard against a hang, not a time limit): 2 ms a message.
    let limit = Duration::from_secs(120) + Duration::from_millis(count.saturating_mul(2));
    let net = Net::new(2);
    let (ip_a, _) = net.link(0, 1, 0);
    let topic = "zb";
    let (mut ba, mut bb) = bridges(&net, topic, &ip_a);
    let e = env(topic, count, "block");
    // 3 local subscribers + the bridge's.
    let mut publisher = net.role(
        0,
        "pub",
        "pub",
        &with(with(e.clone(), "SHZ_SUBS", 4), "SHZ_SIZES", &sizes),
    );
    let mut subs: Vec<Proc> = (0..3)
        .map(|i| net.role(0, &format!("sub-a{i}"), "sub", &e))
        .collect();
    subs.extend((0..2).map(|i| net.role(1, &format!("sub-b{i}"), "sub", &e)));
    publisher.expect("bound", Duration::from_secs(40));
    for s in &mut subs {
        s.expect("ready", Duration::from_secs(40));
    }
    let t0 = Instant::now();
    publisher.tell("go");
    let done = publisher.expect("done", limit);
    for s in &mut subs {
        let r = s.expect("result", limit);
        assert_eq!(field(&r, "received"), count, "{}: {r}", s.name);
        assert_eq!(field(&r, "errors"), 0, "{}: {r}", s.name);
        assert_eq!(field(&r, "missed"), 0, "{}: {r}", s.name);
    }
    let elapsed = t0.elapsed();
    publisher.tell("exit");
    // What `shmlink ls` lists of the bridges: each one's status file, live, with the
    // topic going out on A and coming in on B (rewritten every second, so some count).
    let listed = |h: usize| shmlink::inspect::bridges(&net.hosts[h].dir).unwrap();
    for (h, export) in [(0, true), (1, false)] {
        let seen = listed(h);
        assert!(
            seen.len() == 1
                && seen[0].live
                && seen[0]
                    .topics
                    .iter()
                    .any(|t| { t.export == export && t.topic == topic && t.messages > 0 }),
            "host {h}: {seen:?}"
        );
    }
    let la = ba.stop(Duration::from_secs(10));
    let lb = bb.stop(Duration::from_secs(10));
    assert!(
        listed(0).is_empty() && listed(1).is_empty(),
        "status files left behind"
    );
    let out = stats(&la, topic, "out");
    let inn = stats(&lb, topic, "in");
    // The bridges carried the warm-up messages too: at least the stream, nothing lost.
    assert!(field(&out, "messages") >= count, "{out}");
    assert_eq!(field(&out, "dropped"), 0, "{out}");
    assert_eq!(field(&inn, "dropped"), 0, "{inn}");
    assert_eq!(
        field(&inn, "messages"),
        field(&out, "messages"),
        "{out} / {inn}"
    );
    let bytes: u64 = (0..count)
        .map(|seq| support::msg::size_of(&sizes, seq) as u64)
        .sum();
    let secs = elapsed.as_secs_f64();
    eprintln!(
        "block: {count} {sizes}-size messages ({} MB, largest {} B) to 3 subscribers on A and 2 on B in {secs:.1} s: {:.0} msg/s, {:.1} MB/s across (publisher: {done}); test {:.1} s",
        bytes / 1_000_000,
        (0..count.min(1000))
            .map(|seq| support::msg::size_of(&sizes, seq))
            .max()
            .unwrap_or(0),
        count as f64 / secs,
        bytes as f64 / 1e6 / secs,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn overwrite() {
    if let Some((category, why)) = unavailable() {
        return shmlink_testkit::skip(category, why);
    }
    let net = Net::new(2);
    let (ip_a, _) = net.link(0, 1, 0);
    let topic = "zo";
    let (mut ba, mut bb) = bridges(&net, topic, &ip_a);
    let e = env(topic, OVERWRITE_COUNT, "overwrite");
    let e = with(with(e, "SHZ_SLOTS", 1024), "SHZ_IDLE_MS", 3000);
    let mut publisher = net.role(
        0,
        "pub",
        "pub",
        &with(
            with(with(e.clone(), "SHZ_SUBS", 2), "SHZ_SIZES", "small"),
            "SHZ_GAP_US",
            50,
        ),
    );
    let mut fast_a = net.role(0, "sub-a", "sub", &e);
    let fast_file = net.hosts[1].dir.join("fast.txt");
    let slow_file = net.hosts[1].dir.join("slow.txt");
    let mut fast = net.role(
        1,
        "sub-b-fast",
        "sub",
        &with(e.clone(), "SHZ_OUT", fast_file.display()),
    );
    let mut slow = net.role(
        1,
        "sub-b-slow",
        "sub",
        &with(
            with(e.clone(), "SHZ_OUT", slow_file.display()),
            "SHZ_SLOW_US",
            1000,
        ),
    );
    publisher.expect("bound", Duration::from_secs(40));
    for s in [&mut fast_a, &mut fast, &mut slow] {
        s.expect("ready", Duration::from_secs(40));
    }
    publisher.tell("go");
    publisher.expect("done", Duration::from_secs(120));
    let rf = fast.expect("result", Duration::from_secs(120));
    let rs = slow.expect("result", Duration::from_secs(120));
    let ra = fast_a.expect("result", Duration::from_secs(120));
    publisher.tell("exit");
    let _ = ba.stop(Duration::from_secs(10));
    let lb = bb.stop(Duration::from_secs(10));
    for r in [&rf, &rs, &ra] {
        assert_eq!(field(r, "errors"), 0, "{r}");
    }
    // The fast subscriber on B read everything B's local topic got.
    assert_eq!(field(&rf, "missed"), 0, "{rf}");
    let got: BTreeSet<u64> = std::fs::read_to_string(&fast_file)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    // Each lag the slow one was told equals the messages between the one before and the
    // one after that the fast one read.
    let text = std::fs::read_to_string(&slow_file).unwrap();
    let (mut prev, mut pending, mut lags, mut total_missed, mut read) =
        (None::<u64>, None::<u64>, 0, 0, 0);
    for l in text.lines() {
        if let Some(m) = l.strip_prefix("lag ") {
            let m: u64 = m.parse().unwrap();
            pending = Some(pending.unwrap_or(0) + m);
            total_missed += m;
            lags += 1;
            continue;
        }
        let seq: u64 = l.parse().unwrap();
        assert!(
            got.contains(&seq),
            "the slow subscriber read {seq}, which B's topic never had"
        );
        let lo = prev.map_or(0, |p| p + 1);
        let between = got.range(lo..seq).count() as u64;
        // Before the first real message the lag may include warm-up messages.
        if prev.is_some() {
            assert_eq!(
                pending.unwrap_or(0),
                between,
                "lag before {seq} (after {prev:?})"
            );
        }
        pending = None;
        prev = Some(seq);
        read += 1;
    }
    assert!(lags > 0, "the slow subscriber never lagged: {rs}");
    assert_eq!(
        prev,
        got.last().copied(),
        "the slow subscriber did not read up to the end"
    );
    let inn = stats(&lb, topic, "in");
    eprintln!(
        "overwrite: fast on B read {}, slow read {read} and was told of {total_missed} missed in {lags} lags; bridge B: {inn}",
        got.len()
    );
}
