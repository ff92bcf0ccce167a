//! The serving commands across users: `recv`, `pub` and `pong --server`, run by root,
//! admit a client of another uid (`nobody`, 65534) over `shm:` only when told so with
//! `--allow-uid 65534`; without it the client is refused with the reason. The
//! rendezvous directory is root's and lets other users reach sockets in it (0711), so
//! that the flag is the only difference. Needs root (to run the clients as nobody).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shmlink_testkit::Reaped;

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");
const DEADLINE: Duration = Duration::from_secs(20);
const NOBODY: u32 = 65534;

/// The test's directory, removed on drop: `shmlink` (a copy nobody can run) and the
/// rendezvous directory `rdv` (root's, 0711).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("shmlink-cli-xuid-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("rdv")).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(d.join("rdv"), std::fs::Permissions::from_mode(0o711)).unwrap();
        shmlink_testkit::install_executable(Path::new(BIN), &d.join("shmlink"));
        Scratch(d)
    }

    /// `shmlink ARGS` with the test's rendezvous directory, as `uid` (None: ours).
    fn cmd(&self, uid: Option<u32>, args: &[&str]) -> Command {
        let mut c = Command::new(self.0.join("shmlink"));
        c.args(args)
            .env("SHMLINK_DIR", self.0.join("rdv"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(uid) = uid {
            c.uid(uid).gid(uid);
        }
        c
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|v| v.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Starts `cmd`, writes `input` to its stdin and closes it. A child that ends before
/// reading its input (a refused `send` exits at once) leaves a broken pipe, which is its
/// outcome to check, not the test's failure.
fn start(mut cmd: Command, input: &[u8]) -> Reaped {
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    match stdin.write_all(input) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.unwrap(),
    }
    drop(stdin);
    Reaped(Some(child))
}

/// Waits until the socket file `NAME.sock` of a listener appears.
fn wait_socket(s: &Scratch, name: &str) {
    let path = s.0.join("rdv").join(format!("{name}.sock"));
    let deadline = Instant::now() + DEADLINE;
    while !Path::new(&path).exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The reason a refused client of uid 65534 prints.
fn assert_refused(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: nobody was admitted: {err}");
    assert!(
        err.to_lowercase().contains("permission denied"),
        "{what}: the client says why: {err}"
    );
}

#[test]
fn recv_pub_and_pong_server_admit_another_uid_only_with_allow_uid() {
    if !is_root() {
        shmlink_testkit::skip("root", "running a client as nobody needs root");
        return;
    }
    let s = Scratch::new("serve");
    let pid = std::process::id();
    for allow in [false, true] {
        let flags: &[&str] = if allow {
            &["--allow-uid", "65534"]
        } else {
            &[]
        };
        let tag = if allow { "allowed" } else { "refused" };

        // recv: nobody sends one line.
        let name = format!("recv-{tag}-{pid}");
        let addr = format!("shm:{name}");
        let mut recv = start(
            s.cmd(
                None,
                &[&["recv", "-n", "1"], flags, &[addr.as_str()]].concat(),
            ),
            b"",
        );
        wait_socket(&s, &name);
        let send = start(
            s.cmd(Some(NOBODY), &["send", "--wait", "1", &addr]),
            b"from nobody\n",
        )
        .output("send as nobody", DEADLINE);
        if allow {
            assert!(send.status.success(), "{send:?}");
            let got = recv.output("recv", DEADLINE);
            assert_eq!(String::from_utf8_lossy(&got.stdout), "from nobody\n");
        } else {
            assert_refused(&send, "recv without --allow-uid");
        }

        // pub: nobody subscribes and reads one line.
        let name = format!("pub-{tag}-{pid}");
        let addr = format!("shm:{name}");
        let mut publisher = Reaped(Some(
            s.cmd(
                None,
                &[&["pub", "--subscribers", "1"], flags, &[addr.as_str()]].concat(),
            )
            .spawn()
            .unwrap(),
        ));
        wait_socket(&s, &name);
        let mut sub = start(s.cmd(Some(NOBODY), &["sub", "-n", "1", &addr]), b"");
        if allow {
            let mut stdin = publisher.0.as_mut().unwrap().stdin.take().unwrap();
            stdin.write_all(b"to nobody\n").unwrap();
            drop(stdin);
            let got = sub.output("sub as nobody", DEADLINE);
            assert!(got.status.success(), "{got:?}");
            assert_eq!(String::from_utf8_lossy(&got.stdout), "to nobody\n");
            assert!(publisher.output("pub", DEADLINE).status.success());
        } else {
            assert_refused(
                &sub.output("sub as nobody", DEADLINE),
                "pub without --allow-uid",
            );
        }

        // pong --server: nobody measures 100 round trips.
        let name = format!("pong-{tag}-{pid}");
        let addr = format!("shm:{name}");
        let _server = start(
            s.cmd(
                None,
                &[&["pong", "--server"], flags, &[addr.as_str()]].concat(),
            ),
            b"",
        );
        wait_socket(&s, &name);
        let client = start(
            s.cmd(
                Some(NOBODY),
                &[
                    "pong",
                    "--client",
                    "--latency",
                    "-n",
                    "100",
                    "--json",
                    &addr,
                ],
            ),
            b"",
        )
        .output("pong as nobody", DEADLINE);
        if allow {
            assert!(client.status.success(), "{client:?}");
            let text = String::from_utf8_lossy(&client.stdout);
            assert!(text.contains("\"count\":100"), "{text}");
        } else {
            assert_refused(&client, "pong --server without --allow-uid");
        }
    }
}
