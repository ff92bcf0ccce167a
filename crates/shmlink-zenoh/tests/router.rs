//! Through a real Zenoh router: `zenohd` in a third namespace between A and B, both
//! bridges in client mode. The stream crosses; the router is killed (SIGKILL) mid-stream
//! and started again: the bridges reconnect by themselves, B's subscriber sees a gap and
//! then the rest of the stream, never a duplicate or a reordering; A's is unaffected.
//!
//! Needs `zenohd` (requirement `zenohd`): `$SHMLINK_ZENOHD`, or `target/zenohd/bin/zenohd`
//! as `scripts/zenoh.sh --zenohd` installs it (zenohd 1.10.2, `--locked`, a debug build
//! with only the TCP transport: 4.6 CPU-minutes; .ci/run builds it in the background
//! while it installs packages). Passes with that zenohd and with the default release one.

mod support;

use std::path::PathBuf;
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

fn zenohd() -> Option<PathBuf> {
    let p = std::env::var_os("SHMLINK_ZENOHD")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/zenohd/bin/zenohd")
        });
    p.is_file().then_some(p)
}

#[test]
fn through_zenohd_with_a_router_restart() {
    let Some(zenohd) = zenohd() else {
        return shmlink_testkit::skip(
            "zenohd",
            "no zenohd: set SHMLINK_ZENOHD or run scripts/zenoh.sh --zenohd",
        );
    };
    if let Some((category, why)) = unavailable() {
        return shmlink_testkit::skip(category, why);
    }
    let net = Net::new(3);
    let (_, r_a) = net.link(0, 2, 0);
    let (_, r_b) = net.link(1, 2, 1);
    let router_args = ["--listen", "tcp/0.0.0.0:7447", "--no-multicast-scouting"];
    let start_router = || {
        let r = net.spawn(2, "zenohd", &zenohd, &router_args, &[]);
        std::thread::sleep(Duration::from_millis(1500));
        r
    };
    let router = start_router();
    let topic = "zz";
    let exe = bridge_exe();
    let (ca, cb) = (format!("tcp/{r_a}:7447"), format!("tcp/{r_b}:7447"));
    let mut ba = net.spawn(
        0,
        "bridge-a",
        &exe,
        &["--mode", "client", "--connect", &ca, "--export", topic],
        &[],
    );
    ba.expect("ready", Duration::from_secs(20));
    let mut bb = net.spawn(
        1,
        "bridge-b",
        &exe,
        &["--mode", "client", "--connect", &cb, "--import", topic],
        &[],
    );
    bb.expect("ready", Duration::from_secs(20));
    let (ra, rb, _router) = net.stream_through_an_outage(topic, COUNT, || {
        drop(router); // SIGKILL
        std::thread::sleep(Duration::from_millis(300));
        start_router()
    });
    assert_eq!(field(&ra, "received"), COUNT, "{ra}");
    assert_eq!(
        field(&rb, "errors"),
        0,
        "B's subscriber, a duplicate or reordering: {rb}"
    );
    assert!(
        field(&rb, "received") < COUNT,
        "no gap while the router was down? {rb}"
    );
    assert_eq!(
        field(&rb, "next"),
        COUNT,
        "B did not get the stream again: {rb}"
    );
    let _ = ba.stop(Duration::from_secs(10));
    let _ = bb.stop(Duration::from_secs(10));
    eprintln!(
        "router restart: B's subscriber got {} of {COUNT}",
        field(&rb, "received")
    );
}
