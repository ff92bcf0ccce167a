//! `shmlink send` and `shmlink recv` as a user types them: stdin lines and files become
//! messages and come out again on every transport (shm:, ux:, tcp:, tls: with its
//! certificate flags, auto:), either end listening; `-0` for messages with newlines,
//! `-n` to stop early, and the exit codes.

mod support;

use support::{dir, lines, spawn, write_pki, Dir};

/// `recv ADDR` binds; `send` connects to the address it printed and sends `input`;
/// returns what recv printed.
fn round_trip(
    d: &Dir,
    addr: &str,
    recv_flags: &[&str],
    send_flags: &[&str],
    input: &[u8],
) -> Vec<u8> {
    let mut recv = spawn(d, &[&["recv"], recv_flags, &[addr]].concat());
    let bound = recv.wait_stderr("shmlink recv: listening on ");
    let mut send = spawn(d, &[&["send"], send_flags, &[bound.as_str()]].concat());
    send.write(input);
    send.success();
    recv.success()
}

#[test]
fn stdin_lines_cross_every_transport() {
    let d = dir("netcat", "lines");
    let [ca, cert, key] = write_pki(&d);
    let pid = std::process::id();
    let input = b"one\ntwo words\n\nlast line without newline";
    let want = "one\ntwo words\n\nlast line without newline\n";
    let cases: [(String, Vec<&str>, Vec<&str>); 5] = [
        (format!("shm:nc-{pid}"), vec![], vec![]),
        (format!("ux:nc-{pid}"), vec![], vec![]),
        ("tcp:127.0.0.1:0".into(), vec![], vec![]),
        (
            "tls:127.0.0.1:0".into(),
            vec!["--cert", &cert, "--key", &key],
            vec!["--ca", &ca],
        ),
        ("auto:127.0.0.1:0".into(), vec![], vec![]),
    ];
    for (addr, recv_flags, send_flags) in &cases {
        let out = round_trip(&d, addr, recv_flags, send_flags, input);
        assert_eq!(String::from_utf8_lossy(&out), want, "{addr}");
    }
}

#[test]
fn files_go_as_one_message_each_to_a_listening_sender() {
    let d = dir("netcat", "files");
    let a = d.0.join("a.txt");
    let b = d.0.join("b.bin");
    std::fs::write(&a, "first file\nhas two lines\n").unwrap();
    std::fs::write(&b, [0xffu8, 1, 2, b'\n', 3]).unwrap();
    let addr = format!("ux:nc-files-{}", std::process::id());
    // The sender listens; the receiver connects (retrying until the sender listens).
    let mut send = spawn(
        &d,
        &[
            "send",
            "--listen",
            &addr,
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ],
    );
    let mut recv = spawn(&d, &["recv", "--connect", "-0", &addr]);
    send.success();
    let out = recv.success();
    let mut want = std::fs::read(&a).unwrap();
    want.push(0);
    want.extend(std::fs::read(&b).unwrap());
    want.push(0);
    assert_eq!(out, want);
}

#[test]
fn nul_separated_input_and_a_count() {
    let d = dir("netcat", "count");
    let addr = format!("shm:nc-count-{}", std::process::id());
    let mut recv = spawn(&d, &["recv", "-n", "2", &addr]);
    recv.wait_stderr("shmlink recv: listening on ");
    let mut send = spawn(&d, &["send", "-0", &addr]);
    send.write(b"a\nb\0c\0d\0e");
    send.finish();
    // Two messages printed, the first with its newline, and exit 0 without waiting for
    // the end of the stream.
    assert_eq!(lines(&recv.success()), ["a", "b", "c"]);
}

#[test]
fn failures_and_usage_errors() {
    let d = dir("netcat", "errors");
    let mut send = spawn(&d, &["send", "--wait", "0", "shm:nobody-listens"]);
    let status = send.finish();
    assert_eq!(status.code(), Some(1), "{}", send.err);
    assert!(
        send.err.starts_with("shmlink send: shm:nobody-listens: "),
        "{}",
        send.err
    );
    for args in [
        &["recv"][..],
        &["recv", "foo:bar"],
        &["send", "-n", "1", "shm:x"],
        &["recv", "-n", "0", "shm:x"],
    ] {
        let mut p = spawn(&d, args);
        let status = p.finish();
        assert_eq!(status.code(), Some(2), "{args:?}: {}", p.err);
        assert!(p.err.starts_with("shmlink: "), "{args:?}: {}", p.err);
        assert!(p.out.is_empty());
    }
}
