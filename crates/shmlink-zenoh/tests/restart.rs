//! A bridge killed with SIGKILL mid-stream and started again, publishers and
//! subscribers untouched: on its host the local subscribers get every message (the
//! bridge's subscription simply goes away); on the other host the subscribers see a gap
//! while it was down, then the stream again — never a duplicate or a reordering.

mod support;

use std::time::Duration;

use support::hosts::{bridge_exe, unavailable, Net};
use support::roles::field;

const COUNT: u64 = 3000;

/// A peer process of these tests (`SHZ_ROLE` set); in a plain run, checks the codec.
#[test]
fn peer() {
    if !support::roles::run_role() {
        support::msg::self_check();
    }
}

#[test]
fn a_killed_bridge_restarts_gap_no_duplicate() {
    if let Some((category, why)) = unavailable() {
        return shmlink_testkit::skip(category, why);
    }
    let net = Net::new(2);
    let (ip_a, _) = net.link(0, 1, 0);
    let topic = "zr";
    let listen = format!("tcp/{ip_a}:7447");
    let exe = bridge_exe();
    let a_args = ["--export", topic, "--listen", &listen];
    let mut ba = net.spawn(0, "bridge-a", &exe, &a_args, &[]);
    ba.expect("ready", Duration::from_secs(20));
    let mut bb = net.spawn(
        1,
        "bridge-b",
        &exe,
        &["--import", topic, "--connect", &listen],
        &[],
    );
    bb.expect("ready", Duration::from_secs(20));
    let (ra, rb, mut ba) = net.stream_through_an_outage(topic, COUNT, || {
        drop(ba); // SIGKILL
        std::thread::sleep(Duration::from_millis(500));
        let mut ba = net.spawn(0, "bridge-a-again", &exe, &a_args, &[]);
        ba.expect("ready", Duration::from_secs(20));
        ba
    });
    assert_eq!(field(&ra, "received"), COUNT, "A's local subscriber: {ra}");
    assert_eq!(field(&ra, "errors"), 0, "{ra}");
    assert_eq!(
        field(&rb, "errors"),
        0,
        "B's subscriber, a duplicate or reordering: {rb}"
    );
    let got = field(&rb, "received");
    assert!(got < COUNT, "B saw no gap while A's bridge was down: {rb}");
    assert_eq!(
        field(&rb, "next"),
        COUNT,
        "B did not get the stream again after the restart: {rb}"
    );
    let _ = ba.stop(Duration::from_secs(10));
    let _ = bb.stop(Duration::from_secs(10));
    eprintln!("restart: A's subscriber {COUNT}/{COUNT}, B's {got}/{COUNT} (the gap: the bridge's downtime)");
}
