//! `shmlink pub`, `shmlink sub` and the topics of `shmlink ls`, as a user types them:
//! stdin lines published to subscriber processes (shm: and tcp:), the end of the stream,
//! a subscriber that falls behind under the overwrite policy told how many messages it
//! lost, and a publisher with two subscribers, one lagging, listed by `shmlink ls` and
//! `shmlink ls --json` with the right lag and drops, and a topic marked exported by its
//! publisher.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{dir, lines, shmlink, spawn, Dir, DEADLINE};

fn numbered(range: std::ops::Range<u32>) -> String {
    range.map(|i| format!("line {i}\n")).collect()
}

/// `shmlink ls --json` in the test's directory.
fn ls_json(d: &Dir) -> Value {
    let out = shmlink(d, &["ls", "--json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Polls `shmlink ls --json` until its topic at `addr` satisfies `done`; returns it.
fn wait_topic(d: &Dir, addr: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let v = ls_json(d);
        let topic = v["topics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["address"] == addr)
            .cloned();
        if let Some(t) = topic {
            if done(&t) {
                return t;
            }
        }
        assert!(Instant::now() < deadline, "{addr}: {v:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stdin_lines_reach_every_subscriber_then_the_end_of_the_stream() {
    let d = dir("topic", "lines");
    let name = format!("t-lines-{}", std::process::id());
    // A bare name is shm:NAME.
    let mut publisher = spawn(&d, &["pub", "--subscribers", "2", &name]);
    publisher.wait_stderr("shmlink pub: publishing on ");
    let mut subs = [
        spawn(&d, &["sub", &name]),
        spawn(&d, &["sub", &format!("shm:{name}")]),
    ];
    publisher.write(numbered(0..100).as_bytes());
    publisher.success();
    for sub in &mut subs {
        assert_eq!(String::from_utf8(sub.success()).unwrap(), numbered(0..100));
    }
}

#[test]
fn a_network_topic_and_a_count() {
    let d = dir("topic", "tcp");
    let mut publisher = spawn(&d, &["pub", "--subscribers", "1", "-0", "tcp:127.0.0.1:0"]);
    let addr = publisher.wait_stderr("shmlink pub: publishing on ");
    assert!(addr.starts_with("tcp:127.0.0.1:"), "{addr}");
    let mut sub = spawn(&d, &["sub", "-n", "2", &addr]);
    publisher.write(b"a\nb\0c\0d\0");
    // Two messages, then exit 0 without waiting for the end of the stream.
    assert_eq!(lines(&sub.success()), ["a", "b", "c"]);
    publisher.close_stdin();
    publisher.finish();
}

#[test]
fn a_subscriber_that_falls_behind_is_told_what_it_lost() {
    let d = dir("topic", "lag");
    let addr = format!("shm:t-lag-{}", std::process::id());
    let mut publisher = spawn(
        &d,
        &[
            "pub",
            "--policy",
            "overwrite",
            "--slots",
            "4",
            "--subscribers",
            "1",
            &addr,
        ],
    );
    let mut sub = spawn(&d, &["sub", &addr]);
    publisher.write(b"first\n");
    sub.wait_stdout(|out| out == b"first\n");
    // Stopped, the subscriber reads nothing while 20 more messages go round a 4-slot ring.
    // SAFETY: kill(2) on a child of this test, which it has not reaped.
    assert_eq!(unsafe { libc::kill(sub.pid() as i32, libc::SIGSTOP) }, 0);
    publisher.write(numbered(0..20).as_bytes());
    wait_topic(&d, &addr, |t| t["published"] == 21);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(sub.pid() as i32, libc::SIGCONT) }, 0);
    sub.wait_stdout(|out| out.ends_with(b"line 19\n"));
    // The subscriber reported its losses to the publisher: `ls` shows them.
    let t = wait_topic(&d, &addr, |t| {
        t["subscribers"][0]["dropped"].as_u64() > Some(0)
    });
    let dropped = t["subscribers"][0]["dropped"].as_u64().unwrap();
    assert_eq!(t["policy"], "overwrite");
    publisher.close_stdin();
    publisher.success();
    let out = String::from_utf8(sub.success()).unwrap();
    let got = out.lines().count() as u64;
    assert_eq!(got + dropped, 21, "{out}");
    let lost = sub
        .err
        .trim()
        .strip_prefix(&format!("shmlink sub: {addr}: lagged: "))
        .unwrap_or_else(|| panic!("{:?}", sub.err));
    assert_eq!(lost, format!("{dropped} messages lost"));
}

#[test]
fn ls_shows_a_publisher_and_the_lag_of_each_subscriber() {
    let d = dir("topic", "ls");
    // A path, so that this process subscribes without SHMLINK_DIR.
    let addr = format!("shm:{}/t-ls.sock", d.0.display());
    let mut publisher = spawn(&d, &["pub", "--slots", "16", "--subscribers", "2", &addr]);
    // One subscriber reads everything (a `shmlink sub`), one only three messages (this
    // process, with the library).
    let mut reader = spawn(&d, &["sub", &addr]);
    let opts = shmlink::PubSubOptions::default();
    let deadline = Instant::now() + DEADLINE;
    let mut lagging = loop {
        match shmlink::Subscriber::connect(&addr, &opts) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    publisher.write(numbered(0..10).as_bytes());
    reader.wait_stdout(|out| out.ends_with(b"line 9\n"));
    for i in 0..3 {
        assert_eq!(lagging.recv_vec().unwrap(), format!("line {i}").as_bytes());
    }
    let me = std::process::id();
    let t = wait_topic(&d, &addr, |t| {
        let subs = t["subscribers"].as_array().unwrap();
        let lag_of = |pid: u32| {
            subs.iter()
                .find(|s| s["pid"] == pid)
                .map(|s| s["lag"].clone())
        };
        subs.len() == 2 && lag_of(reader.pid()) == Some(0.into()) && lag_of(me) == Some(7.into())
    });
    assert_eq!(t["published"], 10);
    assert_eq!(
        (&t["policy"], &t["slots"], &t["joined"]),
        (&"block".into(), &16.into(), &2.into())
    );
    assert_eq!(t["pid"], publisher.pid());
    assert_eq!(t["exported"], false);
    assert!(t["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["dropped"] == 0 && s["remote"].is_null()));
    // The table: the topic's line, then a line per subscriber.
    let out = shmlink(&d, &["ls"]).output().unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let at = rows
        .iter()
        .position(|r| r.first() == Some(&addr.as_str()))
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(
        rows[at][1..],
        [
            "block",
            "16",
            &publisher.pid().to_string(),
            rows[at][4],
            "10",
            "2"
        ],
        "{table}"
    );
    assert_eq!(
        rows[at + 1],
        ["SLOT", "PID", "UID", "LAG", "DROPPED", "REMOTE"],
        "{table}"
    );
    let sub_row = |pid: u32| {
        rows[at + 2..at + 4]
            .iter()
            .find(|r| r[1] == pid.to_string())
            .unwrap_or_else(|| panic!("{table}"))
    };
    assert_eq!(
        (sub_row(reader.pid())[3], sub_row(reader.pid())[4]),
        ("0", "0"),
        "{table}"
    );
    assert_eq!((sub_row(me)[3], sub_row(me)[4]), ("7", "0"), "{table}");
    // The end of the stream reaches both, the lagging one after its last 7 messages.
    publisher.close_stdin();
    publisher.success();
    assert_eq!(
        String::from_utf8(reader.success()).unwrap(),
        numbered(0..10)
    );
    for i in 3..10 {
        assert_eq!(lagging.recv_vec().unwrap(), format!("line {i}").as_bytes());
    }
    assert_eq!(
        lagging.recv_vec().unwrap_err().kind(),
        shmlink::ErrorKind::EndOfStream
    );
}

/// `sub --reconnect` outlives its publisher: after the first `pub` closes the topic it
/// waits, says so on stderr when a second `pub` binds the same topic, and prints that
/// one's lines too; `-n` ends it.
#[test]
fn sub_reconnect_follows_a_restarted_publisher() {
    let d = dir("topic", "reconnect");
    let name = format!("t-reconnect-{}", std::process::id());
    let mut first = spawn(&d, &["pub", "--subscribers", "1", &name]);
    first.wait_stderr("shmlink pub: publishing on ");
    let mut sub = spawn(
        &d,
        &["sub", "--reconnect", "--history", "0", "-n", "20", &name],
    );
    first.write(numbered(0..10).as_bytes());
    first.success();
    sub.wait_stdout(|out| out.ends_with(b"line 9\n"));
    let mut second = spawn(&d, &["pub", "--subscribers", "1", &name]);
    second.wait_stderr("shmlink pub: publishing on ");
    second.write(numbered(10..20).as_bytes());
    second.success();
    assert_eq!(String::from_utf8(sub.success()).unwrap(), numbered(0..20));
    let gap = sub.wait_stderr(&format!("shmlink sub: shm:{name}: the publisher "));
    assert!(
        gap.starts_with("closed the topic; subscribed again"),
        "{gap}"
    );
}

/// A topic whose publisher sends it off the host itself (`PubSubOptions::exported`, what
/// `shmlink_zenoh::ExportingPublisher` sets) is marked in both forms of `shmlink ls`.
#[test]
fn ls_marks_a_topic_exported_by_its_publisher() {
    let d = dir("topic", "exported");
    let addr = format!("shm:{}/t-exp.sock", d.0.display());
    let opts = shmlink::PubSubOptions::default().exported(true);
    let publisher = shmlink::Publisher::bind(&addr, &opts).unwrap();
    let t = wait_topic(&d, &addr, |_| true);
    assert_eq!(t["exported"], true, "{t}");
    let out = shmlink(&d, &["ls"]).output().unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&format!("{addr} (exported by its publisher)"))),
        "{table}"
    );
    publisher.close().unwrap();
}
