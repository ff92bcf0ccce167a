//! What an operator meets first: one address rule for every command (a bare NAME is
//! shm:NAME), clients that say they wait for a server (`--wait`, `--no-wait`), errors in
//! terms of the command's flags, the transport a connection really uses (`-v`), and
//! `recv --keep`.

mod support;

use std::time::{Duration, Instant};

use support::{dir, lines, shmlink, spawn};

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
