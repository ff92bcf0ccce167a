//! `shmlink-bench` end to end: every method does a short ping-pong and a short stream
//! between two processes with every byte of every message verified; bad arguments exit
//! 2 with the valid choices; a peer that crashes fails its method and the suite goes on;
//! corrupted data fails every method in both modes, wherever in a run it comes; the JSON
//! and CSV files are written. Timings are never asserted.

#[macro_use]
mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use shmlink_bench::methods::METHODS;
use shmlink_bench::report::{Report, CSV_HEADER};
use shmlink_bench::run::{run_isolated, RunOutput, RunSpec, FAULT_ENV};
use shmlink_bench::suite::Status;
use shmlink_measure::protocol::Stop;
use shmlink_measure::verify::Sampling;
use shmlink_measure::Mode;

use common::{iceoryx2_files, serial, shmlink_bench, text, Dir, BIN};

fn dir(test: &str) -> Dir {
    common::dir("bench", test)
}

fn spec(method: &str, mode: Mode, size: usize, count: u64, window: u64) -> RunSpec {
    RunSpec {
        method: method.into(),
        size,
        mode,
        window,
        warmup_ms: 0,
        stop: Stop::Count(count),
        // As `shmlink-bench` runs; these short runs lie inside the checksummed laps, so
        // every byte of every message is verified.
        sampling: Sampling::DEFAULT,
        cpus: None,
        tag: format!("shmlink-bench-test-{method}-{}-{size}", std::process::id()),
    }
}

fn run(spec: &RunSpec) -> RunOutput {
    run_isolated(Path::new(BIN), spec, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{} {:?} {} B: {e}", spec.method, spec.mode, spec.size))
}

/// A short ping-pong and a short stream, at small sizes and at the method's largest size
/// up to 1.5 MiB (more than a 1 MiB shared-memory ring: messages wrap and fragment).
fn exercise(name: &str) {
    let _serial = serial();
    let method = shmlink_bench::methods::find(name).unwrap();
    if let Some(reason) = method.unavailable() {
        // Only a build without the `zmq` feature may lack a method (tipc and vsock, which
        // the suite only probes for, are ignored below).
        assert!(
            name.starts_with("zmq-") && !cfg!(feature = "zmq"),
            "{name} cannot run here: {reason}"
        );
        shmlink_testkit::skip("zmq", reason);
        return;
    }
    let big = method.size_limit().map_or(3 << 19, |l| l.max.min(3 << 19));
    // Debug builds generate and checksum slowly: few messages of the big size.
    // (A method limited below 1000 bytes runs its largest size there.)
    for (size, count, stream) in [(8, 30, 120), (1000.min(big), 30, 120), (big, 2, 4)] {
        let r = run(&spec(name, Mode::Latency, size, count, 1));
        assert_eq!(r.count, count);
        let p = r.rtt_ns.expect("latency percentiles");
        assert!(p.p50 > 0 && p.p50 <= p.max);
        let window = method.max_window(size).unwrap_or(8).min(8);
        let r = run(&spec(name, Mode::Throughput, size, stream, window));
        assert!(r.count >= stream, "{name}: {} messages", r.count);
        assert!(r.msgs_per_s.unwrap() > 0.0);
        let bytes = r.msgs_per_s.unwrap() * size as f64;
        assert!((r.bytes_per_s.unwrap() - bytes).abs() <= bytes * 1e-9);
    }
}

method_tests! {
    every_method_has_a_test, METHODS;
    pipe => "pipe",
    fifo => "fifo",
    posix_mq => "posix-mq",
    sysv_mq => "sysv-mq",
    uds_stream => "uds-stream",
    uds_seqpacket => "uds-seqpacket",
    uds_dgram => "uds-dgram",
    tcp => "tcp",
    udp => "udp",
    shm_signal => "shm-signal",
    shm_eventfd => "shm-eventfd",
    shm_futex => "shm-futex",
    shm_spin => "shm-spin",
    floor_c => "floor-c",
    floor_line => "floor-line",
    shmlink_shm => "shmlink-shm",
    shmlink_shm_zc => "shmlink-shm-zc",
    shmlink_shm_batch => "shmlink-shm-batch",
    shmlink_shm_blocking => "shmlink-shm-blocking",
    shmlink_ux => "shmlink-ux",
    shmlink_tcp => "shmlink-tcp",
    iceoryx2 => "iceoryx2",
    iceoryx2_zc => "iceoryx2-zc",
    zmq_ipc => "zmq-ipc",
    zmq_tcp => "zmq-tcp",
    #[ignore = "no tipc method to run: the suite only probes for AF_TIPC (methods/absent.rs)"]
    tipc => "tipc",
    #[ignore = "no vsock method to run: the suite only probes for AF_VSOCK (methods/absent.rs)"]
    vsock => "vsock",
}

/// The ZeroMQ methods run exactly when the `zmq` feature is on (then the method tests
/// above exercise them, and none of them may skip); without it the suite lists them as
/// skipped with the way to get them.
#[test]
fn zmq_methods_run_with_the_zmq_feature_and_are_skipped_without() {
    let d = dir("zmq");
    let json = d.0.join("r.json");
    let args = [
        "--methods",
        "zmq-ipc,zmq-tcp",
        "--sizes",
        "64",
        "--iterations",
        "20",
        "--warmup",
        "0",
        "--rounds",
        "1",
        "--json",
        json.to_str().unwrap(),
    ];
    let out = bench(&d, &args, None);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let report = Report::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report.results.len(), 2 * 2);
    for c in &report.results {
        if cfg!(feature = "zmq") {
            assert_eq!(c.status, Status::Ok, "{c:?}");
        } else {
            assert_eq!(c.status, Status::Skipped, "{c:?}");
            let note = c.note.as_deref().unwrap();
            assert!(note.contains("built without the `zmq` feature"), "{note}");
        }
    }
}

#[test]
fn same_core_placement_works_for_busy_polling() {
    let _serial = serial();
    for name in [
        "shm-spin",
        "floor-c",
        "floor-line",
        "shmlink-shm",
        "shmlink-shm-zc",
        "iceoryx2",
        "iceoryx2-zc",
    ] {
        let mut s = spec(name, Mode::Latency, 64, 200, 1);
        s.cpus = Some((0, 0));
        run(&s);
    }
}

/// Both processes of a run killed (the driver at the timeout, the peer with it) run no
/// destructors; the orchestrator's cleanup still removes every iceoryx2 resource of the
/// run.
#[test]
fn iceoryx2_leaves_nothing_after_a_killed_run() {
    let _serial = serial();
    let before = iceoryx2_files();
    let s = spec("iceoryx2", Mode::Throughput, 1000, u64::MAX / 2, 8);
    let e = run_isolated(Path::new(BIN), &s, Duration::from_secs(2)).unwrap_err();
    assert!(e.contains("timed out"), "{e}");
    let after = iceoryx2_files();
    let left: Vec<_> = after.difference(&before).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `shmlink-bench ARGS` in `d`, its peers injecting `fault` ([`FAULT_ENV`]) if given.
fn bench(d: &Dir, args: &[&str], fault: Option<&str>) -> Output {
    let env: Vec<(&str, &str)> = fault.map(|f| (FAULT_ENV, f)).into_iter().collect();
    shmlink_bench(d, args, &env)
}

#[test]
fn bad_input_exits_2_with_the_valid_choices() {
    let d = dir("bad");
    for (args, want) in [
        (&["--methods", "pipe,telepathy"][..], "shm-spin"),
        (&["--sizes", "64,huge"][..], "valid sizes"),
        (&["--sizes", "1G"][..], "8 B to 16 MiB"),
        (&["--cpus", "0,4096"][..], "valid CPUs"),
        (
            &["--pattern", "remote", "--cpus", "0,4096"][..],
            "valid CPUs",
        ),
        (&["--pattern", "remote", "--cpus", "0"][..], "valid CPUs"),
        (&["--mode", "sideways"][..], "latency, throughput, both"),
    ] {
        let out = bench(&d, args, None);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn a_failing_method_is_reported_and_the_run_goes_on() {
    let d = dir("fail");
    let json = d.0.join("r.json");
    // The peer dies at message #5: pipe sees EOF, shm-spin (no EOF) sees the watchdog.
    let args = [
        "--methods",
        "pipe,shm-spin,sysv-mq",
        "--sizes",
        "64,16k",
        "--mode",
        "latency",
        "--iterations",
        "20",
        "--warmup",
        "0",
        "--rounds",
        "2",
        "--json",
        json.to_str().unwrap(),
    ];
    let out = bench(&d, &args, Some("exit:5"));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let report = Report::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for c in &report.results {
        match (c.method.as_str(), c.size) {
            ("sysv-mq", 16384) => assert_eq!(c.status, Status::Unsupported),
            _ => {
                assert_eq!(c.status, Status::Failed, "{c:?}");
                let note = c.note.as_deref().unwrap();
                assert!(note.contains("exiting at message #5"), "{note}");
            }
        }
    }
    assert!(stdout.contains("failed (round 1 of 2"), "{stdout}");
    assert!(stdout.contains("n/a (max 8192 bytes"), "{stdout}");

    // A corrupted answer fails verification; the message says which one.
    let out = bench(&d, &args[..12], Some("corrupt:3"));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("message #3 (64 bytes) failed verification"),
        "{stdout}"
    );
}

#[test]
fn json_and_csv_reports_are_written() {
    let d = dir("reports");
    let (json, csv) = (d.0.join("r.json"), d.0.join("r.csv"));
    let out = bench(
        &d,
        &[
            "--methods",
            "pipe,shm-spin,tcp,udp,tipc",
            "--sizes",
            "64,128k",
            "--iterations",
            "50",
            "--warmup",
            "1ms",
            "--rounds",
            "2",
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
        ],
        None,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("latency, 64 B") && stdout.contains("throughput, 128 KiB"));
    assert!(stdout.contains("vs tcp") && stdout.contains("vs spin"));
    let report = Report::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report.results.len(), 5 * 2 * 2);
    for c in &report.results {
        let expected = match (c.method.as_str(), c.size) {
            ("tipc", _) => Status::Skipped,
            ("udp", 131072) => Status::Unsupported,
            _ => Status::Ok,
        };
        assert_eq!(c.status, expected, "{c:?}");
        if expected == Status::Ok {
            assert_eq!(c.runs.len(), 2, "two rounds");
            assert!(c.summary.is_some());
        }
    }
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().next(), Some(CSV_HEADER));
    assert_eq!(csv.lines().count(), 1 + 20);
}

/// `corrupt:N` (the last byte of data message #N flipped by its sender: the peer's answer
/// in latency mode, the driver's message in throughput mode) fails every method in both
/// modes, zero-copy rows included: in the warm-up (#0; with `--warmup 0` it is the only
/// warm-up message), in the first measured message (#1), and past the checksummed laps
/// deep into a run, where only the sequence number in the trailer is checked on every
/// message. `scribble:N` (a byte between header and trailer flipped in every message from
/// #N on) is seen only by the random checksummed sample: it fails every method too,
/// within a few messages of #N (500 damaged messages: 1 in 16 is checksummed, the chance
/// that none is, is (15/16)^500 ≈ 1e-14). Each case is one suite run of every method.
#[test]
fn corrupt_data_fails_every_method_in_warm_up_first_measured_and_deep_messages() {
    let d = dir("corrupt");
    let json = d.0.join("r.json");
    let names: Vec<&str> = METHODS.iter().map(|m| m.name()).collect();
    let methods = names.join(",");
    // 8 KiB: the largest size every method but floor-line (64 B) carries; two laps are
    // 256 messages.
    let deep_size = 8192;
    assert_eq!(shmlink_measure::verify::laps(deep_size), 256);
    let cases = [
        ("corrupt:0", 64, 20, "trailer"),
        ("corrupt:1", 64, 20, "trailer"),
        ("corrupt:700", deep_size, 800, "trailer"),
        ("scribble:300", deep_size, 800, "checksum"),
    ];
    for (fault, size, iterations, caught_by) in cases {
        let (size_arg, iter_arg) = (size.to_string(), iterations.to_string());
        let args = [
            "--methods",
            methods.as_str(),
            "--sizes",
            size_arg.as_str(),
            "--mode",
            "both",
            "--iterations",
            iter_arg.as_str(),
            "--warmup",
            "0",
            "--window",
            "2",
            "--rounds",
            "1",
            "--json",
            json.to_str().unwrap(),
        ];
        let out = bench(&d, &args, Some(fault));
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{fault}: {stdout}");
        let report = Report::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(report.results.len(), 2 * METHODS.len(), "{fault}");
        let n: u64 = fault.split_once(':').unwrap().1.parse().unwrap();
        for c in &report.results {
            let method = shmlink_bench::methods::find(&c.method).unwrap();
            if let Some(reason) = method.unavailable() {
                assert_eq!(c.status, Status::Skipped, "{fault}: {c:?}");
                eprintln!("{fault}: {} skipped here: {reason}", c.method);
                continue;
            }
            // floor-line carries one cache line: the deep cases (8 KiB) are not its size.
            if method.size_limit().is_some_and(|l| l.max < size) {
                assert_eq!(c.status, Status::Unsupported, "{fault}: {c:?}");
                continue;
            }
            let note = c.note.as_deref().unwrap_or("");
            assert_eq!(c.status, Status::Failed, "{fault} {:?}: {c:?}", c.mode);
            let at = format!("({size} bytes) failed verification");
            let i = note.find(&at).unwrap_or_else(|| panic!("{fault}: {note}"));
            let seq: u64 = note[..i]
                .rsplit_once("message #")
                .and_then(|(_, s)| s.trim().parse().ok())
                .unwrap_or_else(|| panic!("{fault}: {note}"));
            match caught_by {
                "trailer" => {
                    assert_eq!(seq, n, "{fault} {} {:?}: {note}", c.method, c.mode);
                    assert!(note.contains("in its last 8 bytes"), "{fault}: {note}");
                }
                _ => {
                    assert!(seq >= n, "{fault} {} {:?}: {note}", c.method, c.mode);
                    assert!(note.contains("failed verification: checksum"), "{note}");
                }
            }
        }
    }
}
