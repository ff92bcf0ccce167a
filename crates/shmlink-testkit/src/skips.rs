//! Skipped tests that show: the one way a test of this workspace says it cannot run here.
//!
//! libtest has no "skipped" outcome — a test that returns early is counted as passed, and
//! what it printed with `println!`/`eprintln!` is captured and thrown away. So [`skip`]
//! writes `SKIPPED <test>: <reason>` straight to the process's stderr (libtest captures
//! only the print macros), appends the same line to the file named by [`SKIP_LOG_ENV`]
//! (`scripts/test.sh` sets it, counts the lines and lists them in its summary), and, when
//! [`REQUIRE_ENV`] names the test's requirement, fails the test instead: CI, which has
//! everything, sets every category below but `zmq` (see `.ci/run`).
//!
//! Requirements (the `category` of [`skip`]):
//!
//! | category  | what the test needs |
//! |-----------|---------------------|
//! | `brokers` | Redis and RabbitMQ, as `scripts/brokers.sh start` runs them |
//! | `root`    | root, to run a peer under another uid |
//! | `netns`   | root, `unshare`, `mount` and `ip netns` that work here |
//! | `nightly` | a nightly toolchain (the fuzz step of `scripts/test.sh`) |
//! | `zmq`     | the `zmq` feature (on by default) |
//! | `cc`      | a C compiler (`cc`), for the tests that compile C programs |
//! | `capi`    | `libshmlink` built and installable (`scripts/capi.sh`) |
//! | `apps`    | redis, nginx, wrk, curl, iperf3 (`scripts/apps.sh install`) |
//! | `qemu`    | QEMU, a guest kernel and busybox (`scripts/vm.sh install`), for the `vm:` guest checks |
//! | `cli`     | the `shmlink` binary built beside the test (the workspace's test run builds it) |
//! | `zenoh-py` | the official Zenoh Python client in `target/zenoh-venv` (`scripts/zenoh.sh`) |
//! | `prometheus` | Debian's Prometheus server on PATH (`scripts/prometheus.sh install`), for `shmlink metrics`' scrape test |
//! | `zenohd`  | the Zenoh router, `scripts/zenoh.sh --zenohd` (a debug build; .ci/run runs it) |
//! | `zenoh-bin` | `shmlink-zenoh` and `shmlink-zenoh-perf` beside `shmlink-bench` (the workspace's test run builds them), for `--pattern remote`'s test |

use std::io::Write;

/// Comma-separated requirement categories (or `all`) whose skips are failures.
pub const REQUIRE_ENV: &str = "SHMLINK_REQUIRE";
/// A file each skip appends its `SKIPPED` line to.
pub const SKIP_LOG_ENV: &str = "SHMLINK_SKIP_LOG";

/// Skips the calling test: it needs `category` (see the module docs), which this machine
/// lacks for `reason`. Writes `SKIPPED <test>: <reason> [<category>]` to stderr and to
/// the skip log, then returns — the test then returns too. Panics instead when
/// `SHMLINK_REQUIRE` names `category` (or is `all`).
///
/// Call it from the test's own thread: libtest names that thread after the test, which is
/// how the line names it (with the package and test binary that cargo ran).
#[track_caller]
pub fn skip(category: &str, reason: impl std::fmt::Display) {
    let test = test_name();
    let reason = reason.to_string().replace('\n', " ");
    let required = std::env::var(REQUIRE_ENV).unwrap_or_default();
    if required
        .split(',')
        .any(|r| r.trim() == category || r.trim() == "all")
    {
        panic!("{test} needs {category}: {reason} ({REQUIRE_ENV}={required} makes that a failure)");
    }
    let line = format!("SKIPPED {test}: {reason} [{category}]\n");
    // Unbuffered, and not captured by libtest (it captures only the print macros).
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        // One `write` of one line with O_APPEND: lines of parallel tests do not mix.
        let logged = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = logged {
            panic!("{test}: cannot log the skip to {path:?} ({SKIP_LOG_ENV}): {e}");
        }
    }
}

/// `PACKAGE/BINARY::TEST`: the package cargo ran the test for, the test binary (its file
/// name without cargo's hash) and the test (libtest's name for the running thread).
fn test_name() -> String {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.file_name()?.to_str()?.to_string()))
        .map(|name| match name.rsplit_once('-') {
            Some((stem, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => stem.into(),
            _ => name,
        })
        .unwrap_or_else(|| "?".into());
    match std::env::var("CARGO_PKG_NAME") {
        Ok(package) => format!("{package}/{binary}::{test}"),
        Err(_) => format!("{binary}::{test}"),
    }
}
