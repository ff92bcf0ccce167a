//! `shmlink ls` names the registrations of transparent mode by program, pid and the TCP
//! address the program listens on, not by their socket files. The program here is
//! `shmlink recv tcp:127.0.0.1:0` itself under `shmlink run`. Needs the preload library
//! next to the binary (`cargo build -p shmlink-preload`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use shmlink_testkit::{KillOnDrop as Kill, TempDir as Dir};

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");

#[test]
fn ls_names_a_preloaded_program_and_its_port() {
    let lib = Path::new(BIN).with_file_name("libshmlink_preload.so");
    if !lib.is_file() {
        shmlink_testkit::skip(
            "preload",
            format!(
                "{} is not built (cargo build -p shmlink-preload)",
                lib.display()
            ),
        );
        return;
    }
    let dir =
        Dir(std::env::temp_dir().join(format!("shmlink-cli-ls-preload-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    let cmd = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("SHMLINK_DIR", &dir.0)
            .env("SHMLINK_PRELOAD_LIB", &lib)
            .env_remove("LD_PRELOAD");
        c
    };
    let mut server = Kill(
        cmd(&["run", "--", BIN, "recv", "tcp:127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = server.0.id();
    let mut line = String::new();
    BufReader::new(server.0.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("shmlink recv: listening on tcp:")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    let want = format!("shmlink (pid {pid}) {addr}");
    // The registration appears with the listen call; its helper answers at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    let table = loop {
        let out = cmd(&["ls"]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let table = String::from_utf8_lossy(&out.stdout).into_owned();
        if table.contains(&want) || Instant::now() > deadline {
            break table;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let row = table
        .lines()
        .find(|l| l.starts_with(&want))
        .unwrap_or_else(|| panic!("no line {want:?} in:\n{table}"));
    assert!(row.contains("preload"), "{row}");
    assert!(
        !table.contains("tcp-"),
        "no socket file name shown:\n{table}"
    );

    let out = cmd(&["ls", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let l = &v["listeners"][0];
    assert_eq!(l["transparent"], addr.as_str(), "{v:#}");
    assert_eq!(l["program"], "shmlink", "{v:#}");
    assert_eq!(l["pid"], pid, "{v:#}");
}
