//! `shmlink-bench --pattern pubsub` end to end: every pub/sub method publishes to 1 and 3
//! subscriber processes at 8 B and at its largest size (up to 1 MiB), every message
//! verified at every subscriber; `--same-core`; bad `--pattern`/`--subscribers` values
//! exit 2 with the valid choices; a subscriber that dies or hangs fails its method and
//! the suite goes on; the JSON and CSV carry the pub/sub fields; brokers that are not running are
//! skipped with the reason. Timings are never asserted.
//!
//! The broker methods run against the brokers of `scripts/brokers.sh start` when they
//! run; otherwise their tests are skipped with the reason (`shmlink_testkit::skip`, a
//! failure where `SHMLINK_REQUIRE` names `brokers`). No other method may be missing,
//! except ZeroMQ from a build without the `zmq` feature.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use shmlink_bench::pubsub::report::{Report, CSV_HEADER};
use shmlink_bench::pubsub::run::{run_isolated, RunSpec, FAULT_METHOD_ENV};
use shmlink_bench::pubsub::METHODS;
use shmlink_bench::run::FAULT_ENV;
use shmlink_bench::suite::Status;

use common::{iceoryx2_files, serial, shmlink_bench, text, Dir, BIN};

fn dir(test: &str) -> Dir {
    common::dir("pubsub", test)
}

/// `shmlink-bench --pattern pubsub ARGS` in `d`, with `env` set.
fn pubsub(d: &Dir, args: &[&str], env: &[(&str, &str)]) -> Output {
    shmlink_bench(d, &[&["--pattern", "pubsub"][..], args].concat(), env)
}

/// `shmlink-bench --pattern pubsub --methods METHODS --sizes SIZES --subscribers SUBS
/// --iterations N --quick --json D/r.json`, then `more`, in `d` with `env` set: the
/// output and the JSON report's path.
fn quick_run(
    d: &Dir,
    [methods, sizes, subscribers, iterations]: [&str; 4],
    more: &[&str],
    env: &[(&str, &str)],
) -> (Output, PathBuf) {
    let json = d.0.join("r.json");
    let args = [
        "--methods",
        methods,
        "--sizes",
        sizes,
        "--subscribers",
        subscribers,
        "--iterations",
        iterations,
        "--quick",
        "--json",
        json.to_str().unwrap(),
    ];
    (pubsub(d, &[&args[..], more].concat(), env), json)
}

fn report(path: &std::path::Path) -> Report {
    Report::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What method `name` needs from outside this workspace, where it may be missing: the
/// requirement category of `shmlink_testkit::skip`. shmlink's own methods need nothing.
fn external_need(name: &str) -> Option<&'static str> {
    match name {
        "redis" | "rabbitmq" => Some("brokers"),
        "zmq-ipc" if !cfg!(feature = "zmq") => Some("zmq"),
        _ => None,
    }
}

/// A short run of `name` with 1 and 3 subscribers at 8 B and at its largest size up to
/// 1 MiB; every cell measured, with one percentile set per subscriber.
fn exercise(name: &str) {
    let method = shmlink_bench::pubsub::find(name).unwrap();
    if let Some(reason) = method.unavailable() {
        let need =
            external_need(name).unwrap_or_else(|| panic!("{name} cannot run here: {reason}"));
        shmlink_testkit::skip(need, reason);
        return;
    }
    let big = method.size_limit().map_or(1 << 20, |l| l.max.min(1 << 20));
    let d = dir(name);
    let sizes = format!("8,{big}");
    let (out, json) = quick_run(&d, [name, &sizes, "1,3", "10"], &["--rounds", "1"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let r = report(&json);
    assert_eq!(r.results.len(), 4);
    for c in &r.results {
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert_eq!(c.runs.len(), 1);
        let run = &c.runs[0];
        assert_eq!(run.count, 10);
        assert_eq!(run.per_subscriber_ns.len(), c.subscribers);
        let p = run.latency_ns;
        assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999 && p.p999 <= p.max);
        // Time and CPU inside the publish calls: some, and a number (no timing asserted).
        for v in [
            run.pub_us_per_msg,
            run.pub_cpu_us_per_msg,
            run.sub_cpu_us_per_msg,
        ] {
            assert!(v > 0.0 && v.is_finite(), "{run:?}");
        }
    }
    assert!(stdout.contains(&format!("{name} ")), "{stdout}");
}

method_tests! {
    every_pubsub_method_has_a_test, METHODS;
    shmlink => "shmlink",
    shmlink_zc => "shmlink-zc",
    iceoryx2 => "iceoryx2",
    iceoryx2_zc => "iceoryx2-zc",
    zmq_ipc => "zmq-ipc",
    uds => "uds",
    redis => "redis",
    rabbitmq => "rabbitmq",
}

#[test]
fn same_core_runs_every_process_on_one_cpu() {
    let d = dir("same-core");
    let (out, json) = quick_run(&d, ["all", "64", "3", "20"], &["--same-core"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = report(&json);
    let (a, b) = r.config.cpus.expect("pinned");
    assert_eq!(a, b);
    for c in &r.results {
        // Skipped only for a stated external reason; shmlink's methods always run.
        let may_skip = external_need(&c.method).is_some() && c.note.is_some();
        assert!(
            c.status == Status::Ok || (c.status == Status::Skipped && may_skip),
            "{c:?}"
        );
    }
}

#[test]
fn bad_pattern_and_subscriber_counts_exit_2_with_the_valid_choices() {
    let d = dir("bad");
    for (args, want) in [
        (&["--subscribers", "0"][..], "1 to 64"),
        (&["--subscribers", "65"][..], "1 to 64"),
        (
            &["--subscribers", "1,two"][..],
            "invalid value \"two\" for --subscribers",
        ),
        (&["--subscribers", ""][..], "--subscribers"),
        (&["--methods", "shmlink,pigeon"][..], "uds"),
        (
            &["--mode", "latency"][..],
            "does not apply to --pattern pubsub",
        ),
        (&["--pattern", "broadcast"][..], "valid: p2p, pubsub"),
    ] {
        let out = pubsub(&d, args, &[]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // --subscribers belongs to the pub/sub pattern.
    let out = Command::new(BIN)
        .args(["--subscribers", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--pattern pubsub"));
}

#[test]
fn a_failing_method_is_reported_and_the_run_goes_on() {
    let d = dir("fail");
    let csv = d.0.join("r.csv");
    // The first uds subscriber dies at message #5; shmlink runs on.
    let env = [(FAULT_ENV, "exit:5"), (FAULT_METHOD_ENV, "uds")];
    let (out, json) = quick_run(
        &d,
        ["uds,shmlink", "64", "2", "30"],
        &["--rounds", "2", "--csv", csv.to_str().unwrap()],
        &env,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("uds 64 B x2 failed"), "{stderr}");
    let r = report(&json);
    let uds = r.results.iter().find(|c| c.method == "uds").unwrap();
    assert_eq!(uds.status, Status::Failed);
    let note = uds.note.as_deref().unwrap();
    assert!(note.contains("injected fault"), "{note}");
    let shm = r.results.iter().find(|c| c.method == "shmlink").unwrap();
    assert_eq!(shm.status, Status::Ok, "{shm:?}");
    assert_eq!(shm.runs.len(), 2);
    assert!(stdout.contains("uds      failed (round 1 of 2"), "{stdout}");
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(
        csv.lines().any(|l| l.starts_with("uds,64,2,failed,")),
        "{csv}"
    );
}

#[test]
fn json_and_csv_carry_the_pubsub_fields() {
    let d = dir("files");
    let csv = d.0.join("r.csv");
    let (out, json) = quick_run(
        &d,
        ["shmlink,uds", "64,1k", "1,2", "20"],
        &["--csv", csv.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = report(&json);
    assert_eq!(r.pattern, "pubsub");
    assert_eq!(r.config.subscribers, vec![1, 2]);
    assert_eq!(r.results.len(), 2 * 2 * 2);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cell = &v["results"][3];
    assert_eq!(cell["subscribers"], 2);
    for field in ["p50", "p90", "p99", "p999", "max"] {
        assert!(cell["summary"]["latency_ns"][field].is_u64(), "{field}");
        assert!(
            cell["summary"]["per_subscriber_ns"][1][field].is_u64(),
            "{field}"
        );
    }
    for field in [
        "pub_us_per_msg",
        "pub_cpu_us_per_msg",
        "pub_process_cpu_us_per_msg",
        "sub_cpu_us_per_msg",
    ] {
        assert!(cell["summary"][field].is_f64(), "{field}");
    }
    let csv = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert_eq!(lines.len(), 1 + 8);
    assert!(lines[1].starts_with("shmlink,64,1,ok,"), "{csv}");
}

#[test]
fn unavailable_brokers_are_skipped_with_the_reason() {
    let d = dir("brokers");
    // Nothing listens on port 1 (privileged, unassigned on loopback).
    let env = [
        ("SHMLINK_REDIS_ADDR", "127.0.0.1:1"),
        ("SHMLINK_AMQP_ADDR", "127.0.0.1:1"),
    ];
    let (out, json) = quick_run(&d, ["redis,rabbitmq,uds", "64", "1", "10"], &[], &env);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let r = report(&json);
    for name in ["redis", "rabbitmq"] {
        let c = r.results.iter().find(|c| c.method == name).unwrap();
        assert_eq!(c.status, Status::Skipped, "{c:?}");
        assert!(c.runs.is_empty() && c.summary.is_none());
        let note = c.note.as_deref().unwrap();
        assert!(note.contains("not running on 127.0.0.1:1"), "{note}");
        let row = format!("{name:<8} skipped ({note})");
        assert!(stdout.lines().any(|l| l == row), "{row}\n{stdout}");
    }
    let uds = r.results.iter().find(|c| c.method == "uds").unwrap();
    assert_eq!(uds.status, Status::Ok);
}

#[test]
fn a_hung_subscriber_fails_its_method_after_the_ack_timeout() {
    let d = dir("hang");
    // The first shmlink subscriber stops at message #3: the publisher's wait for its
    // acknowledgement times out (10 s), the run fails, uds runs on.
    let env = [(FAULT_ENV, "hang:3"), (FAULT_METHOD_ENV, "shmlink")];
    let (out, json) = quick_run(&d, ["shmlink,uds", "64", "3", "20"], &[], &env);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let r = report(&json);
    let shm = r.results.iter().find(|c| c.method == "shmlink").unwrap();
    assert_eq!(shm.status, Status::Failed);
    let note = shm.note.as_deref().unwrap();
    assert!(
        note.contains("subscriber 0 did not acknowledge message #3 within 10s"),
        "{note}"
    );
    let uds = r.results.iter().find(|c| c.method == "uds").unwrap();
    assert_eq!(uds.status, Status::Ok, "{uds:?}");
}

/// The publisher killed at the run's timeout and its subscribers with it run no
/// destructors; the orchestrator's cleanup still removes every iceoryx2 resource of the
/// run (nodes named after the run's tag).
#[test]
fn iceoryx2_leaves_nothing_after_a_killed_run() {
    let _serial = serial();
    let before = iceoryx2_files();
    let spec = RunSpec {
        method: "iceoryx2".into(),
        size: 1000,
        subscribers: 3,
        warmup: 0,
        count: u64::MAX / 2,
        cpus: None,
        tag: format!("shmlink-pubsub-test-killed-{}", std::process::id()),
    };
    let e = run_isolated(Path::new(BIN), &spec, Duration::from_secs(2)).unwrap_err();
    assert!(e.contains("timed out"), "{e}");
    let after = iceoryx2_files();
    let left: Vec<_> = after.difference(&before).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
