//! `shmlink ls --vm REGION`: the listeners and connections of a `vm:` region, read from
//! the region (this test maps one file from two ends, as two guests map one ivshmem
//! device), as a table and as JSON; a dead listener's entry shows as stale; a file that
//! is no region is a clear error.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use shmlink::{Connection, Listener, Options};

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");

/// A fresh 16 MiB region file, owner-only (the library refuses others), removed on drop.
struct RegionFile(PathBuf);

impl RegionFile {
    fn new(tag: &str) -> RegionFile {
        use std::os::unix::fs::OpenOptionsExt;
        let p = PathBuf::from(format!(
            "/dev/shm/shmlink-lsvm-{}-{tag}",
            std::process::id()
        ));
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        RegionFile(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for RegionFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn ls(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("ls")
        .args(args)
        .env_remove("SHMLINK_VM_REGION")
        .output()
        .unwrap()
}

fn ls_json(region: &str) -> Value {
    let out = ls(&["--vm", region, "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn ls_vm_lists_listeners_and_live_connections() {
    let r = RegionFile::new("live");
    let addr = format!("vm:lsvm@{}", r.path());
    let o = Options::default();
    let mut l = Listener::bind(&addr, &o).unwrap();
    let a = addr.clone();
    let t = std::thread::spawn(move || {
        let mut c = Connection::connect(&a, &Options::default()).unwrap();
        for i in 0..10u8 {
            c.send(&[i; 1000]).unwrap();
        }
        c
    });
    let mut s = l.accept().unwrap();
    let c = t.join().unwrap();
    for _ in 0..10 {
        assert_eq!(s.recv_vec().unwrap().len(), 1000);
    }
    s.send(b"pong").unwrap();

    let v = ls_json(r.path());
    assert_eq!(v["region"], r.path());
    assert_eq!(v["size"], 16u64 << 20);
    assert_eq!(v["id"].as_str().unwrap().len(), 32, "{v}");
    let lst = v["listeners"].as_array().unwrap();
    assert_eq!(lst.len(), 1, "{v}");
    assert_eq!(lst[0]["name"], "lsvm");
    assert_eq!(lst[0]["pid"], std::process::id());
    assert_eq!(lst[0]["alive"], true);
    let cs = v["connections"].as_array().unwrap();
    assert_eq!(cs.len(), 1, "{v}");
    let c0 = &cs[0];
    assert_eq!(c0["state"], "accepted");
    assert_eq!(c0["listener"], "lsvm");
    assert_eq!(c0["client_pid"], std::process::id());
    assert_eq!(c0["server_pid"], std::process::id());
    assert_eq!(
        (c0["client_alive"].clone(), c0["server_alive"].clone()),
        (true.into(), true.into())
    );
    // 10 records of 1000 bytes one way (headers included), one of 4 the other.
    assert!(c0["c2s_bytes"].as_u64().unwrap() >= 10_000, "{c0}");
    let back = c0["s2c_bytes"].as_u64().unwrap();
    assert!((4..10_000).contains(&back), "{c0}");

    let out = ls(&["--vm", r.path()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("LISTENER"), "{text}");
    assert!(text.contains("vm:lsvm"), "{text}");
    assert!(text.contains("accepted"), "{text}");
    assert!(text.contains("live"), "{text}");

    // Both ends gone: the slot is free again; the listener gone: its entry too.
    drop(c);
    drop(s);
    let v = ls_json(r.path());
    assert_eq!(v["connections"].as_array().unwrap().len(), 0, "{v}");
    drop(l);
    let v = ls_json(r.path());
    assert_eq!(v["listeners"].as_array().unwrap().len(), 0, "{v}");
    let text = String::from_utf8(ls(&["--vm", r.path()]).stdout).unwrap();
    assert!(text.contains("no listeners, no connections"), "{text}");
}

/// A child process killed when dropped (also when the test panics).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn ls_vm_shows_a_dead_listener_as_stale() {
    let r = RegionFile::new("dead");
    // A listener in a child process (`shmlink pong --server`), killed with SIGKILL: its
    // entry stays LIVE in the region but its heartbeat stands still.
    let child = Command::new(BIN)
        .args(["pong", "--server", &format!("vm:dead@{}", r.path())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let child = &mut child.0;
    let mut seen = false;
    for _ in 0..500 {
        // Until the child has mapped the region, ls says nobody used it.
        let out = ls(&["--vm", r.path(), "--json"]);
        let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        if v["listeners"].as_array().is_some_and(|l| !l.is_empty()) {
            assert_eq!(v["listeners"][0]["alive"], true, "{v}");
            assert_eq!(v["listeners"][0]["pid"], child.id(), "{v}");
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(seen, "the listener never showed");
    let v = ls_json(r.path());
    assert_eq!(v["listeners"][0]["name"], "dead");
    assert_eq!(v["listeners"][0]["alive"], false, "{v}");
    let text = String::from_utf8(ls(&["--vm", r.path()]).stdout).unwrap();
    assert!(text.contains("stale"), "{text}");
}

#[test]
fn ls_vm_on_a_file_that_is_no_region_is_a_clear_error() {
    let r = RegionFile::new("unused");
    // Nobody used it: refused, and ls did not write the magic.
    let out = ls(&["--vm", r.path()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nobody has used it yet"), "{err}");
    let head = std::fs::read(&r.0).unwrap();
    assert!(head[..64].iter().all(|&b| b == 0));
    // Something else in it: the magic is wrong.
    std::fs::write(&r.0, vec![0xabu8; 16 << 20]).unwrap();
    let out = ls(&["--vm", r.path()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("magic"));
    // Too small, missing.
    let small = RegionFile::new("small");
    std::fs::write(&small.0, b"tiny").unwrap();
    let out = ls(&["--vm", small.path()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least"));
    let out = ls(&["--vm", "/dev/shm/shmlink-lsvm-no-such-file"]);
    assert_eq!(out.status.code(), Some(1));
}
