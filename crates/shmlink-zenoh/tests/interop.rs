//! Interop with the official Python client (`eclipse-zenoh` from PyPI, installed by
//! `scripts/zenoh.sh` into `target/zenoh-venv`): a Python Zenoh subscriber of
//! `shmlink/<topic>` receives the bytes a shmlink publisher sent, and a Python Zenoh
//! publisher's messages reach a local shmlink subscriber, through the bridge. One
//! network namespace (a private loopback and rendezvous directory).
//!
//! Skips with requirement `zenoh-py` when the venv is missing, `root`/`netns` without
//! namespaces.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::hosts::{bridge_exe, unavailable, Net};

const COUNT: u64 = 300;

/// A peer process of these tests (`SHZ_ROLE` set); in a plain run, checks the codec.
#[test]
fn peer() {
    if !support::roles::run_role() {
        support::msg::self_check();
    }
}

/// The venv's python, or why there is none.
fn python() -> Result<PathBuf, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let py = root.join("target/zenoh-venv/bin/python");
    if !py.is_file() {
        return Err(format!("{} missing: run scripts/zenoh.sh", py.display()));
    }
    let ok = std::process::Command::new(&py)
        .args(["-c", "import zenoh"])
        .output()
        .map_err(|e| e.to_string())?;
    if !ok.status.success() {
        return Err(format!("{} cannot import zenoh", py.display()));
    }
    Ok(py)
}

fn script(name: &str) -> String {
    format!("{}/tests/py/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn setup() -> Option<(Net, PathBuf)> {
    let py = match python() {
        Ok(p) => p,
        Err(why) => {
            shmlink_testkit::skip("zenoh-py", why);
            return None;
        }
    };
    if let Some((category, why)) = unavailable() {
        shmlink_testkit::skip(category, why);
        return None;
    }
    Some((Net::new(1), py))
}

fn msgs(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("msg ").map(str::to_owned))
        .collect()
}

#[test]
fn python_subscriber_receives_a_shmlink_topic() {
    let Some((net, py)) = setup() else { return };
    let endpoint = "tcp/127.0.0.1:7447";
    let mut bridge = net.spawn(
        0,
        "bridge",
        &bridge_exe(),
        &["--export", "zi", "--listen", endpoint],
        &[],
    );
    bridge.expect("ready", Duration::from_secs(20));
    let mut zsub = net.spawn(
        0,
        "zsub.py",
        &py,
        &[
            &script("zsub.py"),
            endpoint,
            "shmlink/zi",
            &COUNT.to_string(),
        ],
        &[],
    );
    zsub.expect("subscribed", Duration::from_secs(30));
    let env = vec![
        ("SHZ_TOPIC", "zi".to_owned()),
        ("SHZ_COUNT", COUNT.to_string()),
        ("SHZ_POLICY", "block".to_owned()),
        ("SHZ_SUBS", "1".to_owned()),
        ("SHZ_SIZES", "small".to_owned()),
    ];
    let mut publisher = net.role(0, "pub", "pub", &env);
    publisher.expect("bound", Duration::from_secs(30));
    zsub.expect("ready", Duration::from_secs(30));
    publisher.tell("go");
    publisher.expect("done", Duration::from_secs(60));
    zsub.expect("result", Duration::from_secs(60));
    publisher.tell("exit");
    let got = msgs(&zsub.seen);
    let want: Vec<String> = (0..COUNT)
        .map(|seq| {
            let mut b = Vec::new();
            support::msg::fill(&mut b, seq, 64 + (seq as usize * 97) % 4000);
            format!("{} {}", b.len(), support::msg::fnv(&b))
        })
        .collect();
    assert_eq!(got.len(), want.len(), "{:?}", zsub.seen.last());
    assert!(got == want, "the Python subscriber received other bytes");
    eprintln!("python subscriber: {} messages, bytes identical", got.len());
    let _ = bridge.stop(Duration::from_secs(10));
}

#[test]
fn python_publisher_reaches_a_shmlink_subscriber() {
    let Some((net, py)) = setup() else { return };
    let endpoint = "tcp/127.0.0.1:7448";
    let mut bridge = net.spawn(
        0,
        "bridge",
        &bridge_exe(),
        &[
            "--import",
            "zp",
            "--listen",
            endpoint,
            "--foreign-policy",
            "block",
        ],
        &[],
    );
    bridge.expect("ready", Duration::from_secs(20));
    let mut zpub = net.spawn(
        0,
        "zpub.py",
        &py,
        &[
            &script("zpub.py"),
            endpoint,
            "shmlink/zp",
            &COUNT.to_string(),
        ],
        &[],
    );
    zpub.expect("declared", Duration::from_secs(30));
    let env = vec![
        ("SHZ_TOPIC", "zp".to_owned()),
        ("SHZ_COUNT", COUNT.to_string()),
    ];
    let mut sub = net.role(0, "rawsub", "rawsub", &env);
    sub.expect("ready", Duration::from_secs(30));
    zpub.tell("go");
    zpub.expect("done", Duration::from_secs(60));
    let r = sub.expect("result", Duration::from_secs(60));
    let sent: Vec<String> = zpub
        .seen
        .iter()
        .filter_map(|l| l.strip_prefix("sent ").map(str::to_owned))
        .collect();
    let got = msgs(&sub.seen);
    assert_eq!(sent.len() as u64, COUNT);
    assert_eq!(got.len() as u64, COUNT, "{r}");
    assert!(got == sent, "the shmlink subscriber received other bytes");
    eprintln!(
        "shmlink subscriber: {} messages from the Python publisher, bytes identical",
        got.len()
    );
    let lines = bridge.stop(Duration::from_secs(10));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("stats zp in shmlink/zp ")),
        "{lines:?}"
    );
}
