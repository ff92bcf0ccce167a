//! `SHMLINK_BENCH_FAULT` in every pattern but point-to-point (whose faults `bench.rs`
//! tests): `corrupt:40` (a message of the warm-up) and `corrupt:5000` (one well into the
//! run) fail every method's cell of `pubsub`, `inproc`, `connect`, `async` and
//! `sessions` with their verification's reason and a non-zero exit; `apps`, whose data are the programs' own,
//! refuses every fault with exit status 2, as every pattern does a fault it does not
//! inject. The runs are the shortest the flags allow that still reach message #5000.

// Shared with bench.rs and pubsub.rs, which use the rest of it.
#[allow(dead_code, unused_macros)]
mod common;

use std::process::Output;

use common::{shmlink_bench, text, Dir};
use shmlink_bench::run::FAULT_ENV;

fn dir(test: &str) -> Dir {
    common::dir("fault", test)
}

/// `shmlink-bench ARGS` with `SHMLINK_BENCH_FAULT=fault` (and `env`).
fn with_fault(d: &Dir, fault: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let env: Vec<(&str, &str)> = [(FAULT_ENV, fault)]
        .into_iter()
        .chain(env.iter().copied())
        .collect();
    shmlink_bench(d, args, &env)
}

/// The run failed (exit status 1), every method in `methods` has a failed row saying
/// `why` on stdout, and `reason` (the verifier's words) is in its output.
fn failed_with(out: &Output, methods: &[&str], why: &str, reason: &str) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit status\n{stdout}\n{stderr}"
    );
    for m in methods {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("{m} "))
                && l.contains("failed")
                && l.contains(why)),
            "{m}: no failed row saying {why:?}\n{stdout}\n{stderr}"
        );
    }
    assert!(
        stdout.contains(reason) || stderr.contains(reason),
        "no {reason:?} in the output\n{stdout}\n{stderr}"
    );
}

/// The pub/sub methods that need nothing from outside the workspace.
fn pubsub_methods() -> Vec<&'static str> {
    let mut v = vec!["shmlink", "shmlink-zc", "iceoryx2", "iceoryx2-zc", "uds"];
    if cfg!(feature = "zmq") {
        v.push("zmq-ipc");
    }
    v
}

#[test]
fn pubsub_subscribers_catch_a_corrupt_message() {
    let d = dir("pubsub");
    let methods = pubsub_methods();
    let list = methods.join(",");
    let base = ["--pattern", "pubsub", "--methods", &list, "--sizes", "64"];
    // 120 messages (--quick): #40 is one of the warm-up's.
    let out = with_fault(
        &d,
        "corrupt:40",
        &[&base[..], &["--subscribers", "1,2", "--quick"]].concat(),
        &[],
    );
    failed_with(&out, &methods, "message #40", "failed verification");
    // 5020 messages: #5000 is one of the last measured.
    let args = [
        &base[..],
        &["--subscribers", "1", "--quick", "--iterations", "5000"],
    ]
    .concat();
    let out = with_fault(&d, "corrupt:5000", &args, &[]);
    failed_with(&out, &methods, "message #5000", "failed verification");
    // scribble (a byte in the middle: only a full checksum sees it), from #40 on.
    let quick = [&base[..], &["--subscribers", "1", "--quick"]].concat();
    let out = with_fault(&d, "scribble:40", &quick, &[]);
    failed_with(&out, &methods, "message #40", "checksum");
}

#[test]
fn inproc_receivers_catch_a_corrupt_message() {
    let d = dir("inproc");
    let methods = [
        "shmlink-inproc",
        "std-mpsc",
        "crossbeam-channel",
        "flume",
        "tokio-mpsc-blocking",
    ];
    // --quick: 11 000 round trips, 200 000 streamed messages.
    let args = ["--pattern", "inproc", "--sizes", "64", "--quick"];
    for n in [40, 5000] {
        let out = with_fault(&d, &format!("corrupt:{n}"), &args, &[]);
        failed_with(
            &out,
            &methods,
            &format!("message #{n} "),
            "failed verification",
        );
    }
    let out = with_fault(&d, "scribble:5000", &args, &[]);
    failed_with(&out, &methods, "message #5000 ", "checksum");
}

#[test]
fn connect_servers_catch_a_corrupt_message() {
    let d = dir("connect");
    let all = [
        "shmlink-shm",
        "shmlink-auto",
        "shmlink-auto-fresh",
        "shmlink-inproc",
        "uds",
        "tcp",
    ];
    // #40 is in every method's warm-up (50 connections).
    let args = ["--pattern", "connect", "--quick", "--seconds", "0.1"];
    let out = with_fault(&d, "corrupt:40", &args, &[]);
    failed_with(&out, &all, "connection #40", "failed verification");
    // #5000: the run goes on until then (the fastest methods: a debug build makes a few
    // hundred shmlink connections a second).
    let fast = ["uds", "tcp"];
    let out = with_fault(
        &d,
        "corrupt:5000",
        &[&args[..], &["--methods", "uds,tcp"]].concat(),
        &[],
    );
    failed_with(&out, &fast, "connection #5000", "failed verification");
}

#[test]
fn connect_fails_a_shmlink_auto_row_that_stays_on_tcp() {
    let d = dir("connect-auto");
    // SHMLINK_AUTO_SHM=0: auto: announces no boot id, so it never upgrades.
    let out = with_fault(
        &d,
        "",
        &[
            "--pattern",
            "connect",
            "--methods",
            "shmlink-auto",
            "--quick",
            "--seconds",
            "0.1",
        ],
        &[("SHMLINK_AUTO_SHM", "0")],
    );
    failed_with(&out, &["shmlink-auto"], "not on shared memory", "Tcp");
}

#[test]
fn async_clients_catch_a_corrupt_echo() {
    let d = dir("async");
    let all = [
        "shmlink-async",
        "shmlink-async-nospin",
        "shmlink-async-stream",
        "tokio-uds",
        "tokio-tcp",
        "tonic-shm",
        "tonic-uds",
        "tonic-tcp",
    ];
    let args = ["--pattern", "async", "--quick", "--callers", "1"];
    let out = with_fault(&d, "corrupt:40", &args, &[]);
    failed_with(&out, &all, "wrong echo", "wrong echo");
    // 4600 measured after 460 warm-up round trips or calls: #5000 is in the run.
    let some = ["shmlink-async", "tonic-shm"];
    let more = [
        "--iterations",
        "4600",
        "--methods",
        "shmlink-async,tonic-shm",
    ];
    let out = with_fault(&d, "corrupt:5000", &[&args[..], &more[..]].concat(), &[]);
    failed_with(&out, &some, "5000", "wrong echo");
}

#[test]
fn sessions_catch_a_corrupt_message_in_every_session() {
    let d = dir("sessions");
    let methods = [
        "shmlink-shm",
        "shmlink-shm-blocking",
        "uds-stream",
        "tcp",
        "iceoryx2",
    ];
    let args = [
        "--pattern",
        "sessions",
        "--sessions",
        "2",
        "--idle",
        "0",
        "--sizes",
        "64",
        "--quick",
    ];
    // #40: in the warm-up; #5000: past the checksummed laps.
    // A run fails where the fault is, so a longer one costs nothing.
    let long = [&args[..], &["--duration", "3s"]].concat();
    for n in [40, 5000] {
        let out = with_fault(&d, &format!("corrupt:{n}"), &long, &[]);
        failed_with(
            &out,
            &methods,
            &format!("message #{n} "),
            "failed verification",
        );
    }
    let out = with_fault(&d, "scribble:40", &args, &[]);
    failed_with(&out, &methods, "round 1", "checksum");
    // hang:N is pub/sub's alone.
    let out = with_fault(&d, "hang:3", &args, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// A fault past a run's last message fails the run: it was not injected.
#[test]
fn a_fault_the_run_does_not_reach_fails_it() {
    let d = dir("unreached");
    let out = with_fault(
        &d,
        "corrupt:5000",
        &[
            "--pattern",
            "inproc",
            "--sizes",
            "64",
            "--iterations",
            "100",
        ],
        &[],
    );
    failed_with(
        &out,
        &["shmlink-inproc"],
        "would not be injected",
        "would not be injected",
    );
    let out = with_fault(
        &d,
        "corrupt:5000",
        &[
            "--pattern",
            "pubsub",
            "--methods",
            "shmlink",
            "--subscribers",
            "1",
            "--sizes",
            "64",
            "--quick",
        ],
        &[],
    );
    failed_with(
        &out,
        &["shmlink"],
        "would not be injected",
        "would not be injected",
    );
}

/// What a pattern does not inject, it refuses before running anything: exit status 2.
#[test]
fn faults_a_pattern_cannot_inject_exit_2() {
    let d = dir("refused");
    let apps = ["--pattern", "apps", "--apps", "redis", "--quick"];
    for fault in ["corrupt:40", "corrupt:5000", "scribble:1", "exit:3"] {
        let out = with_fault(&d, fault, &apps, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "apps {fault}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("the programs' own"),
            "{}",
            text(&out.stderr)
        );
    }
    for (fault, args) in [
        ("exit:3", &["--pattern", "inproc", "--quick"][..]),
        ("hang:3", &["--pattern", "connect", "--quick"][..]),
        ("exit:3", &["--pattern", "async", "--quick"][..]),
        ("hang:3", &["--methods", "shmlink", "--quick"][..]),
        ("corrupt", &["--pattern", "pubsub", "--quick"][..]),
        ("bogus:1", &["--pattern", "inproc", "--quick"][..]),
    ] {
        let out = with_fault(&d, fault, args, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{fault} {args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(FAULT_ENV),
            "{}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "nothing ran: {}", text(&out.stdout));
    }
}
