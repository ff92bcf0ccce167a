//! `shmlink-bench --pattern remote --quick` end to end: two network namespaces, the
//! Zenoh bridge and `shmlink-zenoh-perf` (built next to the bench by `cargo test
//! --workspace`, or in `$SHMLINK_ZENOH_BIN_DIR`), the brokers when installed. Checks that
//! the report has every row and column, that every receiver got every measured message,
//! and what the veth carried: one copy per message with the bridge or the importing
//! subscriber and 8 subscribers on B, eight with the tcp: fan-out. Timings are never
//! asserted.

#[allow(dead_code, unused_macros)]
mod common;

use std::path::{Path, PathBuf};

use common::{shmlink_bench, text};
use serde_json::Value;

/// Where the Zenoh programs are, if built.
fn zenoh_bins() -> Option<PathBuf> {
    let dir = match std::env::var_os("SHMLINK_ZENOH_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(common::BIN).parent()?.to_path_buf(),
    };
    ["shmlink-zenoh", "shmlink-zenoh-perf"]
        .iter()
        .all(|p| dir.join(p).is_file())
        .then_some(dir)
}

fn have(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn every_row_is_measured_and_one_copy_crosses_per_message() {
    if shmlink_sys::euid() != 0 {
        shmlink_testkit::skip("root", "needs root for ip netns");
        return;
    }
    let Some(bins) = zenoh_bins() else {
        shmlink_testkit::skip(
            "zenoh-bin",
            "no shmlink-zenoh / shmlink-zenoh-perf next to shmlink-bench (cargo build -p \
             shmlink-zenoh, or set SHMLINK_ZENOH_BIN_DIR)",
        );
        return;
    };
    let brokers = have("redis-server") && have("rabbitmq-server");
    let d = common::dir("remote", "quick");
    let json = d.0.join("remote.json");
    let args = [
        "--pattern",
        "remote",
        "--quick",
        "--json",
        json.to_str().unwrap(),
    ];
    let t = std::time::Instant::now();
    let out = shmlink_bench(
        &d,
        &args,
        &[("SHMLINK_ZENOH_BIN_DIR", bins.to_str().unwrap())],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{stdout}\n{stderr}\n({:.1} s)", t.elapsed().as_secs_f64());
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["pattern"], "remote");
    assert!(
        report["cpus"].is_null(),
        "no --cpus: both hosts on every CPU"
    );
    let cells = report["cells"].as_array().unwrap();
    // 8 ways x 4 columns, 4 ways with 8 subscribers, 4 local conditions.
    assert_eq!(cells.len(), 32 + 4 + 4, "{stdout}");
    for row in [
        "both bridges, subscribers joined after",
        "exporting pub > Zenoh > bridge > shmlink",
        "exporting pub > Zenoh > importing sub",
        "Zenoh pub/sub, 37-byte attachment",
    ] {
        assert!(cells.iter().any(|c| c["row"] == row), "{row}\n{stdout}");
    }
    for c in cells {
        let row = c["row"].as_str().unwrap();
        let broker = row.starts_with("Redis") || row.starts_with("RabbitMQ");
        if broker && !brokers {
            assert_eq!(c["status"], "skipped", "{c}");
            continue;
        }
        assert_eq!(c["status"], "ok", "{c}");
        let runs = c["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{c}");
        let run = &runs[0];
        let sent = run["sent"].as_u64().unwrap();
        assert!(sent > 0, "{c}");
        for r in run["received"].as_array().unwrap() {
            // Every path is lossless here (Block, reliable links, brokers with room).
            assert_eq!(r["count"].as_u64(), Some(sent), "{row}: {r}");
            assert_eq!(r["lost"].as_u64(), Some(0), "{row}: {r}");
            let p50 = r["p50_ns"].as_u64().unwrap();
            assert!(
                p50 > 0 && p50 <= r["max_ns"].as_u64().unwrap(),
                "{row}: {r}"
            );
            assert!(
                r["last_ns"].as_u64() >= r["first_ns"].as_u64(),
                "{row}: {r}"
            );
        }
        let want = match c["table"].as_str().unwrap() {
            "fanout" => 8,
            "local" => 2,
            _ => 1,
        };
        assert_eq!(run["received"].as_array().unwrap().len(), want, "{c}");
        let cpu = run["cpu_us"].as_array().unwrap();
        assert!(cpu.iter().all(|x| x.as_f64().unwrap() >= 0.0), "{c}");
        if c["table"] == "fanout" {
            // 64 KiB messages: one copy per message crosses with the bridges and with the
            // importing subscriber, one per subscriber with the tcp: fan-out and with 8
            // Zenoh peers on B.
            let per_msg = run["bytes_a_to_b"].as_u64().unwrap() / sent;
            if row.starts_with("shmlink >") || row.ends_with("importing sub") {
                assert!(
                    (65536..2 * 65536).contains(&per_msg),
                    "{row}: {per_msg} B/msg"
                );
            } else if row.starts_with("shmlink tcp:") || row.starts_with("Zenoh") {
                assert!(per_msg >= 8 * 65536, "{row}: {per_msg} B/msg");
            }
        }
    }
    for table in [
        "A -> B, 1 subscriber on B",
        "8 subscribers on B",
        "local 64 B",
    ] {
        assert!(stdout.contains(table), "{stdout}");
    }
}
