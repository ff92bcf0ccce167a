//! `shmlink-bench --pattern apps` end to end with redis (Debian's, `scripts/apps.sh
//! install`): preloaded, every row is measured; with the preload turned off
//! (`SHMLINK_PRELOAD=off`), no connection moves to shared memory and every row fails, exit
//! status 1 (it used to print `skipped:` and exit 0). Numbers are never asserted.

#[allow(dead_code, unused_macros)]
mod common;

use std::path::PathBuf;

use common::{shmlink_bench, text};

/// The preload library the bench looks for next to itself, if built.
fn preload_lib() -> Option<PathBuf> {
    let lib = PathBuf::from(common::BIN)
        .parent()?
        .join("libshmlink_preload.so");
    lib.is_file().then_some(lib)
}

/// Whether redis and the preload library are here; the test is skipped if not.
fn ready() -> bool {
    let have = |p: &str| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !(have("redis-server") && have("redis-benchmark")) {
        shmlink_testkit::skip(
            "apps",
            "redis-server or redis-benchmark is not installed (scripts/apps.sh install)",
        );
        return false;
    }
    if preload_lib().is_none() {
        shmlink_testkit::skip(
            "apps",
            "no libshmlink_preload.so next to shmlink-bench (cargo build -p shmlink-preload)",
        );
        return false;
    }
    true
}

#[test]
fn redis_rows_need_every_connection_on_shared_memory() {
    if !ready() {
        return;
    }
    let d = common::dir("apps", "redis");
    let args = ["--pattern", "apps", "--apps", "redis", "--quick"];
    let out = shmlink_bench(&d, &args, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains("failed") && !stdout.contains("skipped"),
        "{stdout}"
    );
    assert!(stdout.contains("redis -c 50 -P 16"), "{stdout}");

    let out = shmlink_bench(&d, &args, &[("SHMLINK_PRELOAD", "off")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    for (case, conns) in [("redis -c 1 ", 2), ("redis -c 50 -P 16 ", 100)] {
        assert!(
            stdout.lines().any(|l| l.starts_with(case)
                && l.contains("failed")
                && l.contains(&format!("0 of the run's {conns} connections"))),
            "{case}: {stdout}"
        );
    }
    assert!(stderr.contains("2 of 2 rows failed"), "{stderr}");
}
