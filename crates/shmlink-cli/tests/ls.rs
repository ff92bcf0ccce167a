//! Runs the built `shmlink ls` against a directory with a `pong --server` process, a
//! listener in this process holding connections with known counters, and a stale
//! socket: the table, the JSON, a listener that does not accept shown as not answering,
//! and the exit codes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use shmlink::{Connection, ErrorKind, Listener, Options};
use shmlink_testkit::{wait_readable, KillOnDrop as Kill, TempDir as Dir};

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");

fn ls(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("ls")
        .args(args)
        .output()
        .expect("run shmlink ls")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Accepts on `listener` until stopped, keeping every connection until its client
/// closes it; each one's first message says how many more follow, and all are answered
/// with one 5-byte message.
fn serve(mut listener: Listener, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        listener.set_nonblocking(true);
        let mut conns: Vec<Connection> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            // Drop the connections whose client is gone.
            conns.retain_mut(|c| match c.recv_vec() {
                Err(e) if e.kind() == ErrorKind::WouldBlock => true,
                Err(e) if e.kind() == ErrorKind::EndOfStream => false,
                other => panic!("a client sent more: {other:?}"),
            });
            match listener.accept() {
                Ok(mut c) => {
                    let n = c.recv_vec().unwrap()[0];
                    for _ in 0..n {
                        c.recv_vec().unwrap();
                    }
                    c.send(b"done!").unwrap();
                    c.set_nonblocking(true);
                    conns.push(c);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    wait_readable(&listener, Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    })
}

/// Starts `shmlink pong --server --once` on `addr`; returns once it listens.
fn pong_server(addr: &str) -> Kill {
    let mut child = Command::new(BIN)
        .args(["pong", "--server", "--once", addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start pong --server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), addr, "pong --server reports its address");
    Kill(child)
}

/// The line of the listener at `addr` (or socket path).
fn row(lines: &[&str], addr: &str) -> usize {
    lines
        .iter()
        .position(|l| l.starts_with(addr))
        .unwrap_or_else(|| panic!("no line for {addr} in\n{}", lines.join("\n")))
}

#[test]
fn ls_lists_listeners_connections_and_stale_sockets() {
    let dir = Dir(std::env::temp_dir().join(format!("shmlink-cli-ls-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let d = dir.0.to_str().unwrap().to_string();
    let here = format!("shm:{d}/here.sock");
    let pong = format!("shm:{d}/pong.sock");

    let stop = Arc::new(AtomicBool::new(false));
    let server = serve(
        Listener::bind(&here, &Options::default()).unwrap(),
        stop.clone(),
    );
    // Two clients: 1 + 2 messages of 1000 bytes, and 1 + 9.
    let mut clients = Vec::new();
    for more in [2u8, 9] {
        let mut c = Connection::connect(&here, &Options::default()).unwrap();
        for _ in 0..=more {
            c.send(&[more; 1000]).unwrap();
        }
        assert_eq!(c.recv_vec().unwrap(), b"done!");
        clients.push(c);
    }
    let pong_child = pong_server(&pong);
    let pong_pid = pong_child.0.id();
    drop(std::os::unix::net::UnixListener::bind(dir.0.join("stale.sock")).unwrap());

    let table = stdout(&ls(&[&d]));
    eprintln!("{table}");
    let lines: Vec<&str> = table.lines().collect();
    let words = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert_eq!(
        words(lines[0]),
        ["ADDRESS", "TRANSPORT", "PID", "UID", "AGE", "CONNS"]
    );
    let me = std::process::id().to_string();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() }.to_string();
    let h = row(&lines, &here);
    let w = words(lines[h]);
    assert_eq!(
        (&w[1], &w[2], &w[3], &w[5]),
        (&"shm".into(), &me, &uid, &"2".into()),
        "{}",
        lines[h]
    );
    assert_eq!(
        words(lines[h + 1]),
        ["PEER", "UID", "AGE", "MSGS", "IN", "MSGS", "OUT", "BYTES", "IN", "BYTES", "OUT"]
    );
    let mut conns: Vec<Vec<String>> = vec![words(lines[h + 2]), words(lines[h + 3])];
    conns.sort_by_key(|c| c[3].parse::<u64>().unwrap());
    for (c, (msgs, bytes)) in conns.iter().zip([("3", "2.9KiB"), ("10", "9.8KiB")]) {
        assert!(lines[h + 2].starts_with("  "), "connections are indented");
        assert_eq!(
            (&c[0], &c[1], &c[3], &c[4], &c[5], &c[6]),
            (
                &me,
                &uid,
                &msgs.into(),
                &"1".into(),
                &bytes.into(),
                &"5B".into()
            ),
        );
    }
    let p = row(&lines, &pong);
    let w = words(lines[p]);
    assert_eq!(
        (&w[1], &w[2], &w[5]),
        (&"shm".into(), &pong_pid.to_string(), &"0".into())
    );
    let s = row(&lines, &format!("{d}/stale.sock"));
    assert!(lines[s].ends_with("stale (nobody listens)"), "{}", lines[s]);

    // The same as JSON.
    let json: Value = serde_json::from_str(&stdout(&ls(&["--json", &d]))).unwrap();
    assert_eq!(json["dir"], d.as_str());
    let listeners = json["listeners"].as_array().unwrap();
    assert_eq!(listeners.len(), 3);
    let by_path = |name: &str| {
        listeners
            .iter()
            .find(|l| l["path"] == format!("{d}/{name}").as_str())
            .unwrap_or_else(|| panic!("{name} in {json}"))
    };
    let l = by_path("here.sock");
    assert_eq!(l["state"], "answered");
    assert_eq!(l["address"], here.as_str());
    assert_eq!(l["pid"], std::process::id());
    assert_eq!(l["transport"], "shm");
    let mut msgs_in: Vec<u64> = l["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["peer_pid"], std::process::id());
            assert_eq!(
                c["bytes_in"].as_u64().unwrap(),
                1000 * c["msgs_in"].as_u64().unwrap()
            );
            assert_eq!(
                (c["msgs_out"].as_u64(), c["bytes_out"].as_u64()),
                (Some(1), Some(5))
            );
            c["msgs_in"].as_u64().unwrap()
        })
        .collect();
    msgs_in.sort();
    assert_eq!(msgs_in, [3, 10]);
    assert_eq!(by_path("pong.sock")["pid"], pong_pid);
    assert_eq!(by_path("stale.sock")["state"], "stale");
    assert_eq!(by_path("stale.sock")["pid"], Value::Null);

    // A connection gone from the application is gone from the list: the client with 10
    // messages closes, the server drops its end.
    clients.pop();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let json: Value = serde_json::from_str(&stdout(&ls(&["--json", &d]))).unwrap();
        let here = json["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["address"] == here.as_str())
            .unwrap_or_else(|| panic!("{here} in {json}"));
        let msgs_in: Vec<&Value> = here["connections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["msgs_in"])
            .collect();
        if msgs_in == [3] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection is still listed: {msgs_in:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();

    // pong's server accepts on a thread of its own, so it answers while it serves a
    // client. A listener that never accepts does not answer: ls says so, with its pid,
    // and does not wait longer than told.
    let _busy = Connection::connect(&pong, &Options::default()).unwrap();
    let idle = format!("{d}/idle.sock");
    let _idle = Listener::bind(&format!("shm:{idle}"), &Options::default()).unwrap();
    let start = Instant::now();
    let table = stdout(&ls(&["--timeout", "200", &d]));
    assert!(start.elapsed() < Duration::from_secs(5));
    let lines: Vec<&str> = table.lines().collect();
    let w = words(lines[row(&lines, &pong)]);
    assert_eq!(
        (&w[2], &w[5]),
        (&pong_pid.to_string(), &"1".into()),
        "{table}"
    );
    let w = words(lines[row(&lines, &idle)]);
    assert_eq!(w[2], me, "{table}");
    assert!(
        lines[row(&lines, &idle)].contains("not answering"),
        "{table}"
    );
    // `here` stopped accepting too (its listener is gone with the thread).
    assert!(!table.contains(&here), "{table}");
}

#[test]
fn ls_exit_codes() {
    let out = ls(&["/nonexistent/shmlink-ls-dir"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/shmlink-ls-dir"));
    for bad in [&["a", "b"][..], &["--timeout", "x"], &["--what"]] {
        let out = ls(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("shmlink: "));
    }
    let help = stdout(&ls(&["--help"]));
    assert!(help.starts_with("List the listeners"), "{help}");
    let empty = std::env::temp_dir().join(format!("shmlink-cli-ls-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let _dir = Dir(empty.clone());
    assert_eq!(stdout(&ls(&[empty.to_str().unwrap()])), "no listeners\n");
    let json: Value =
        serde_json::from_str(&stdout(&ls(&["--json", empty.to_str().unwrap()]))).unwrap();
    assert_eq!(json["listeners"], Value::Array(vec![]));
}

#[test]
fn ls_before_any_listener_made_the_rendezvous_directory() {
    // The default directory ($SHMLINK_DIR here) does not exist until a listener makes it:
    // nothing listens, which is no failure.
    let missing = std::env::temp_dir().join(format!(
        "shmlink-cli-ls-missing-{}/not-yet",
        std::process::id()
    ));
    let run = |args: &[&str]| {
        Command::new(BIN)
            .arg("ls")
            .args(args)
            .env("SHMLINK_DIR", &missing)
            .output()
            .expect("run shmlink ls")
    };
    assert_eq!(stdout(&run(&[])), "no listeners\n");
    let json: Value = serde_json::from_str(&stdout(&run(&["--json"]))).unwrap();
    assert_eq!(json["listeners"], Value::Array(vec![]));
    assert_eq!(json["topics"], Value::Array(vec![]));
    assert!(!missing.exists(), "ls made {}", missing.display());
}

/// A bridge's status file (as `shmlink-zenoh` writes it through the library) is listed
/// with its topics and counters, live while fresh and stale once it is not rewritten;
/// a file that is not a status file is named as such, its bytes never printed.
#[test]
fn ls_lists_bridges_from_their_status_files() {
    use shmlink::inspect::{bridge_status_path, write_bridge_status, BridgedTopic};
    let d =
        Dir(std::env::temp_dir().join(format!("shmlink-cli-ls-bridges-{}", std::process::id())));
    std::fs::create_dir_all(&d.0).unwrap();
    let topic = |export: bool, name: &str, messages: u64| BridgedTopic {
        export,
        topic: name.into(),
        key: format!("shmlink/{name}"),
        messages,
        bytes: messages * 64,
        dropped: 2,
        state: "active".into(),
    };
    let live = bridge_status_path(d.0.as_path(), 1);
    write_bridge_status(
        &live,
        &[topic(true, "sensors", 40), topic(false, "cmds", 3)],
    )
    .unwrap();
    let text = stdout(&ls(&[d.0.as_path().to_str().unwrap()]));
    assert!(text.starts_with("no listeners\n\nBRIDGE"), "{text}");
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(lines.iter().any(|l| l.ends_with(&["live"])), "{text}");
    let sensors = [
        "out",
        "sensors",
        "shmlink/sensors",
        "40",
        "2.5KiB",
        "2",
        "active",
    ];
    assert!(lines.contains(&sensors.to_vec()), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&["in", "cmds", "shmlink/cmds", "3"])),
        "{text}"
    );

    // Killed: the file stays and goes stale. And a file in the way that is not one.
    let f = std::fs::File::options().append(true).open(&live).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
        .unwrap();
    std::fs::write(d.0.as_path().join("bridge-0-x.status"), "\x1b]0;hi\x07\n").unwrap();
    let json: Value =
        serde_json::from_str(&stdout(&ls(&["--json", d.0.as_path().to_str().unwrap()]))).unwrap();
    let bridges = json["bridges"].as_array().unwrap();
    assert_eq!(bridges.len(), 2, "{json:#}");
    assert_eq!(
        bridges[0]["problem"], "not a bridge status file",
        "{json:#}"
    );
    assert_eq!(bridges[1]["live"], false);
    assert!(bridges[1]["age_ms"].as_u64().unwrap() >= 59_000, "{json:#}");
    assert_eq!(bridges[1]["pid"], std::process::id());
    assert_eq!(bridges[1]["topics"][0]["direction"], "export");
    assert_eq!(bridges[1]["topics"][0]["messages"], 40);
    assert_eq!(bridges[1]["topics"][1]["key"], "shmlink/cmds");
    let text = stdout(&ls(&[d.0.as_path().to_str().unwrap()]));
    assert!(
        text.contains("stale: not rewritten, the bridge is gone"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "{text:?}");
}
