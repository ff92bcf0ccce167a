//! `--pattern sessions`: a short run of every method with 1 and 2 parallel sessions and
//! 20 idle connections per idle method has every row, each with figures that make sense
//! (messages counted, p50 within p99, CPU and memory per session read, shared memory
//! touched where the method has some), and leaves none of iceoryx2's files behind; a bad
//! option is refused. Faults are in `fault.rs`. Timings are never asserted.

#[allow(dead_code, unused_macros)]
mod common;

use shmlink_bench::patterns::sessions::{Report, Row, IDLE_METHODS, METHODS};
use shmlink_bench::suite::Status;
use shmlink_measure::Mode;

use common::{iceoryx2_files, shmlink_bench, text};

#[test]
fn a_short_run_has_every_row_with_sane_figures() {
    let d = common::dir("sessions", "quick");
    let json = d.0.join("s.json");
    let before = iceoryx2_files();
    let out = shmlink_bench(
        &d,
        &[
            "--pattern",
            "sessions",
            "--quick",
            "--sessions",
            "1,2",
            "--idle",
            "20",
            "--sizes",
            "64",
            "--duration",
            "100ms",
            "--warmup",
            "20ms",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let report = Report::from_json(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report.pattern, "sessions");
    let mut sessions = 0;
    let mut idle = 0;
    for row in &report.results {
        match row {
            Row::Sessions(r) => {
                sessions += 1;
                assert_eq!(r.status, Status::Ok, "{r:?}");
                let f = r.summary.as_ref().expect("a summary");
                assert!(f.messages > 0 && f.msgs_per_s > 0.0, "{r:?}");
                assert!(
                    f.cpu_s_per_m > 0.0 && f.cpu_s_per_m >= f.cpu_s_per_m_driver,
                    "{r:?}"
                );
                match r.mode {
                    Mode::Latency => {
                        let (p50, p99) = (f.p50_ns.unwrap(), f.p99_ns.unwrap());
                        assert!(p50 > 0 && p50 <= p99, "{r:?}");
                    }
                    Mode::Throughput => assert_eq!(f.p50_ns, None, "{r:?}"),
                }
                let m = f.mem_per_session;
                assert!(m.pss_kib > 0.0 && m.rss_kib >= m.pss_kib, "{r:?}");
                assert!(
                    m.rss_kib >= m.shared_clean_kib + m.shared_dirty_kib + m.private_dirty_kib,
                    "{r:?}"
                );
                // The shared-memory methods' rings or pools are touched (both ends'
                // share of the pages: at least one 4 KiB page).
                if r.method.starts_with("shmlink") || r.method.starts_with("iceoryx2") {
                    assert!(m.pss_shmem_kib >= 4.0, "{r:?}");
                }
            }
            Row::Idle(r) => {
                idle += 1;
                assert_eq!(r.status, Status::Ok, "{r:?}");
                assert_eq!(r.connections, 20);
                let f = r.figures.as_ref().unwrap();
                // Each side holds at least one fd per connection, and stdio.
                assert!(f.server_fds >= 20 + 3 && f.client_fds >= 20 + 3, "{r:?}");
                assert!(f.fd_limit >= f.server_fds as u64, "{r:?}");
                // 20 connections are far within the descriptor budget: every shm:
                // connection has its doorbell pipes (three ends on the server's side),
                // and the listener may hold one pair made ahead for its next client
                // (four ends).
                let pipe_ends: &[usize] = if r.method == "shmlink-shm" {
                    &[60, 64]
                } else {
                    &[0]
                };
                assert!(pipe_ends.contains(&f.server_pipe_ends), "{r:?}");
                assert!(f.window_s >= 0.9, "{r:?}");
                assert!(
                    f.server_mem.pss_kib > 0.0 && f.client_mem.pss_kib > 0.0,
                    "{r:?}"
                );
            }
        }
    }
    // Every method x 2 modes x 2 session counts, and every idle method once.
    assert_eq!(sessions, METHODS.len() * 2 * 2, "{stdout}");
    assert_eq!(idle, IDLE_METHODS.len(), "{stdout}");
    for m in METHODS {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("{m} "))),
            "no row of {m}\n{stdout}"
        );
    }
    assert!(
        stdout.contains("idle connections on one listener"),
        "{stdout}"
    );
    let after = iceoryx2_files();
    let left: Vec<_> = after.difference(&before).collect();
    assert!(left.is_empty(), "iceoryx2 files left behind: {left:?}");
}

#[test]
fn bad_options_are_refused() {
    let d = common::dir("sessions", "refused");
    for (args, says) in [
        (&["--sessions", "0"][..], "--sessions"),
        (&["--sessions", "2,x"][..], "--sessions"),
        (&["--idle", "-1"][..], "--idle"),
        (&["--methods", "pipe"][..], "unknown method"),
        (
            &["--window", "4"][..],
            "does not apply to --pattern sessions",
        ),
    ] {
        let argv = [&["--pattern", "sessions"][..], args].concat();
        let out = shmlink_bench(&d, &argv, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
