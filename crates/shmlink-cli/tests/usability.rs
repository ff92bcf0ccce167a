//! What an operator meets first: one address rule for every command (a bare NAME is
//! shm:NAME), clients that say they wait for a server (`--wait`, `--no-wait`), errors in
//! terms of the command's flags, the transport a connection really uses (`-v`), and
//! `recv --keep`.

mod support;

use std::time::{Duration, Instant};

use support::{dir, lines, shmlink, spawn, spawn_env};

#[test]
fn a_bare_name_means_shm_name_in_every_command() {
    let d = dir("usability", "bare");
    let name = format!("bare-{}", std::process::id());
    let mut recv = spawn(&d, &["recv", &name]);
    let bound = recv.wait_stderr("shmlink recv: listening on ");
    assert_eq!(bound, format!("shm:{name}"));
    let mut send = spawn(&d, &["send", &name]);
    send.write(b"hello\n");
    send.success();
    assert_eq!(lines(&recv.success()), ["hello"]);
    // Documented where the addresses are: the help of each command and the manual.
    for cmd in ["send", "recv", "pong", "pub", "sub"] {
        let out = shmlink(&d, &[cmd, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("a bare NAME means shm:NAME"), "{cmd}: {help}");
    }
    let out = shmlink(&d, &["man"]).output().unwrap();
    let man = String::from_utf8_lossy(&out.stdout);
    assert!(man.contains("means shm:NAME"), "{man}");
}

/// Runs `shmlink ARGS` to its end (stdin empty); returns the exit code, stderr and how
/// long it took.
fn run(d: &support::Dir, args: &[&str]) -> (Option<i32>, String, Duration) {
    let start = Instant::now();
    let mut p = spawn(d, args);
    let status = p.finish();
    (status.code(), p.err.clone(), start.elapsed())
}

#[test]
fn no_wait_fails_at_once_and_names_the_address() {
    let d = dir("usability", "nowait");
    for args in [
        &["send", "--no-wait", "typo"][..],
        &["sub", "--no-wait", "typo"],
        &["pong", "--client", "--no-wait", "typo"],
        &["recv", "--connect", "--no-wait", "typo"],
    ] {
        let (code, err, took) = run(&d, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("shm:typo"), "{args:?}: {err}");
        assert!(err.contains("--no-wait"), "{args:?}: {err}");
        assert!(!err.contains("waiting for"), "{args:?}: {err}");
        // Well before the default wait of 10 s (no tight timing).
        assert!(took < Duration::from_secs(8), "{args:?}: {took:?}");
    }
    // --wait and --no-wait contradict each other.
    let (code, err, _) = run(&d, &["send", "--wait", "3", "--no-wait", "typo"]);
    assert_eq!(code, Some(2), "{err}");
}

#[test]
fn a_waiting_client_says_so_then_fails_after_wait() {
    let d = dir("usability", "wait");
    for args in [
        &["send", "--wait", "2", "typo"][..],
        &["sub", "--wait", "2", "typo"],
        &["pong", "--client", "--wait", "2", "typo"],
    ] {
        let (code, err, took) = run(&d, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        let cmd = args[0];
        let notice = err
            .lines()
            .find(|l| l.starts_with(&format!("shmlink {cmd}: waiting for shm:typo")))
            .unwrap_or_else(|| panic!("{args:?}: no waiting line in {err:?}"));
        assert!(notice.contains("up to 2 s"), "{notice}");
        assert!(notice.contains("Ctrl-C"), "{notice}");
        // The failure comes after the notice and says how long it waited.
        let after = &err[err.find(notice).unwrap() + notice.len()..];
        assert!(after.contains("waited 2 s"), "{args:?}: {err}");
        assert!(took < Duration::from_secs(8), "{args:?}: {took:?}");
    }
}

#[test]
fn errors_name_the_flags_not_the_library_calls() {
    let d = dir("usability", "flags");
    let pid = std::process::id();
    // A directory other users may write: the way out is --shared-dir.
    let open = d.0.join("open");
    std::fs::create_dir(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = shmlink(&d, &["send", "--no-wait", "x"])
        .env("SHMLINK_DIR", &open)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--shared-dir"), "{err}");
    assert!(!err.contains("Options::"), "{err}");

    // `send` to a topic: subscribe with `shmlink sub`.
    let topic = format!("flags-topic-{pid}");
    let mut publisher = spawn(&d, &["pub", "--subscribers", "1", "--wait", "20", &topic]);
    publisher.wait_stderr("shmlink pub: publishing on ");
    let (code, err, _) = run(&d, &["send", "--no-wait", &topic]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("`shmlink sub`"), "{err}");
    assert!(!err.contains("Subscriber::connect"), "{err}");
    drop(publisher);

    // `sub` to a plain listener: no packet kinds.
    let plain = format!("flags-plain-{pid}");
    let mut recv = spawn(&d, &["recv", &plain]);
    recv.wait_stderr("shmlink recv: listening on ");
    let (code, err, _) = run(&d, &["sub", "--no-wait", &plain]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("plain listener"), "{err}");
    assert!(!err.contains("packet kind"), "{err}");
}

#[test]
fn verbose_says_the_transport_really_used() {
    let d = dir("usability", "verbose");
    // auto: between two processes of one kernel and one rendezvous directory: upgraded
    // to shm. tcp: stays tcp.
    for (addr, over) in [("auto:127.0.0.1:0", "shm"), ("tcp:127.0.0.1:0", "tcp")] {
        let mut recv = spawn(&d, &["recv", "-v", addr]);
        let bound = recv.wait_stderr("shmlink recv: listening on ");
        let mut send = spawn(&d, &["send", "-v", &bound]);
        send.write(b"m\n");
        send.success();
        assert_eq!(lines(&recv.success()), ["m"]);
        let want = format!("shmlink send: connected to {bound} over {over}");
        assert!(
            send.err.lines().any(|l| l == want),
            "{want:?} in {:?}",
            send.err
        );
        let accepted = recv
            .err
            .lines()
            .find(|l| l.starts_with("shmlink recv: accepted "))
            .unwrap_or_else(|| panic!("{:?}", recv.err));
        assert!(
            accepted.ends_with(&format!(" over {over}")),
            "{addr}: {accepted}"
        );
    }
}

#[test]
fn recv_keep_serves_one_sender_after_another() {
    let d = dir("usability", "keep");
    let name = format!("keep-{}", std::process::id());
    let mut recv = spawn(&d, &["recv", "--keep", &name]);
    recv.wait_stderr("shmlink recv: listening on ");
    for (i, text) in ["first\n", "second\nthird\n"].iter().enumerate() {
        let mut send = spawn(&d, &["send", &name]);
        send.write(text.as_bytes());
        send.success();
        let want = ["first", "second", "third"][..i * 2 + 1].join("\n") + "\n";
        recv.wait_stdout(|out| out == want.as_bytes());
    }
    // Still listening after both: ls lists it.
    assert!(recv.child.try_wait().unwrap().is_none(), "{}", recv.err);
    let out = shmlink(&d, &["ls"]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&format!("shm:{name}")), "{table}");
    // SIGTERM: exit 0, the socket removed.
    let sock = d.0.join(format!("{name}.sock"));
    assert!(sock.exists(), "{}", sock.display());
    let status = std::process::Command::new("kill")
        .args(["-TERM", &recv.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(recv.finish().success(), "{}", recv.err);
    assert!(!sock.exists(), "{}", sock.display());
}

/// The library's events on stderr: `-v` on `send`/`recv`, `SHMLINK_LOG` on any command.
/// A server's refusal says why, where the operator looks.
#[test]
fn refusal_reasons_reach_the_servers_stderr_with_v_or_shmlink_log() {
    let d = dir("usability", "log");
    let pid = std::process::id();
    // `recv -v`, a plain listener, refuses a subscriber.
    let plain = format!("log-plain-{pid}");
    let mut recv = spawn(&d, &["recv", "-v", &plain]);
    recv.wait_stderr("shmlink recv: listening on ");
    let (code, err, _) = run(&d, &["sub", "--no-wait", &plain]);
    assert_eq!(code, Some(1), "{err}");
    let line = recv.wait_stderr(" WARN shmlink: client refused");
    assert!(line.contains("publish/subscribe"), "{line}");
    drop(recv);
    // Without -v, nothing; with SHMLINK_LOG=info a publisher says why it refused a
    // plain client.
    for (log, shown) in [(None, false), (Some("info"), true)] {
        let topic = format!("log-topic-{pid}-{shown}");
        let env: Vec<(&str, &str)> = log.iter().map(|l| ("SHMLINK_LOG", *l)).collect();
        let mut publisher = spawn_env(
            &d,
            &["pub", "--subscribers", "1", "--wait", "20", &topic],
            &env,
        );
        publisher.wait_stderr("shmlink pub: publishing on ");
        let (code, err, _) = run(&d, &["send", "--no-wait", &topic]);
        assert_eq!(code, Some(1), "{err}");
        if shown {
            let line = publisher.wait_stderr(" WARN shmlink: subscriber refused");
            assert!(line.contains("reason="), "{line}");
        } else {
            std::thread::sleep(Duration::from_millis(300));
            let _ = publisher.child.kill();
            publisher.finish();
            assert!(!publisher.err.contains("refused"), "{}", publisher.err);
        }
    }
}
