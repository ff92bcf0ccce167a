//! Helpers of the end-to-end tests of `send`, `recv`, `pub`, `sub` and `ls`: a
//! rendezvous directory per test, the built binary, child processes that are killed
//! when a test fails, output read with deadlines, and TLS certificates made at test time.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_shmlink");

/// How long any one step may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A directory of this test's own (`SHMLINK_DIR`, files), removed on drop.
pub struct Dir(pub PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh `shmlink-cli-{suite}-{test}-{pid}` in the temporary directory, mode 0700.
pub fn dir(suite: &str, test: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("shmlink-cli-{suite}-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// `shmlink ARGS` with the test's rendezvous directory.
pub fn shmlink(d: &Dir, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("SHMLINK_DIR", &d.0);
    cmd
}

/// A running `shmlink`, its output collected by threads; killed on drop.
pub struct Proc {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    stdout: Receiver<Vec<u8>>,
    stderr_lines: Receiver<String>,
    /// Everything read so far.
    pub out: Vec<u8>,
    pub err: String,
    what: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `shmlink ARGS` with its three streams piped.
pub fn spawn(d: &Dir, args: &[&str]) -> Proc {
    spawn_env(d, args, &[])
}

/// [`spawn`] with more environment variables.
pub fn spawn_env(d: &Dir, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut child = shmlink(d, args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out_tx, stdout) = mpsc::channel();
    let mut out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = out.read(&mut buf) {
            if out_tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let (err_tx, stderr_lines) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if err_tx.send(line).is_err() {
                break;
            }
        }
    });
    Proc {
        stdin: child.stdin.take(),
        child,
        stdout,
        stderr_lines,
        out: Vec::new(),
        err: String::new(),
        what: format!("shmlink {}", args.join(" ")),
    }
}

impl Proc {
    /// Takes what arrived on stdout and stderr until now (waiting at most `wait`).
    fn pump(&mut self, wait: Duration) {
        if let Ok(b) = self.stdout.recv_timeout(wait) {
            self.out.extend(b);
        }
        while let Ok(b) = self.stdout.try_recv() {
            self.out.extend(b);
        }
        while let Ok(l) = self.stderr_lines.try_recv() {
            self.err.push_str(&l);
            self.err.push('\n');
        }
    }

    /// Waits until stdout holds something `done` accepts.
    pub fn wait_stdout(&mut self, done: impl Fn(&[u8]) -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while !done(&self.out) {
            assert!(
                Instant::now() < deadline,
                "{}: stdout {:?}, stderr {:?}",
                self.what,
                String::from_utf8_lossy(&self.out),
                self.err
            );
            self.pump(Duration::from_millis(20));
        }
    }

    /// Waits for a stderr line that starts with `prefix`; returns the rest of it.
    pub fn wait_stderr(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(rest) = self.err.lines().find_map(|l| l.strip_prefix(prefix)) {
                return rest.trim().to_string();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{}: no {prefix:?} in {:?}",
                self.what,
                self.err
            );
            if let Ok(l) = self
                .stderr_lines
                .recv_timeout(left.min(Duration::from_millis(50)))
            {
                self.err.push_str(&l);
                self.err.push('\n');
            }
        }
    }

    /// Writes `bytes` on stdin.
    pub fn write(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Closes stdin (end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to exit (killing it and failing after the deadline); all
    /// of its output is in `out` and `err` afterwards.
    pub fn finish(&mut self) -> ExitStatus {
        self.close_stdin();
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{}: did not exit; stderr {:?}", self.what, self.err);
            }
            self.pump(Duration::from_millis(20));
        };
        // The pipes close with the process: drain them.
        while let Ok(b) = self.stdout.recv_timeout(Duration::from_secs(5)) {
            self.out.extend(b);
        }
        while let Ok(l) = self.stderr_lines.recv_timeout(Duration::from_secs(5)) {
            self.err.push_str(&l);
            self.err.push('\n');
        }
        status
    }

    /// Waits for exit 0; returns stdout.
    pub fn success(&mut self) -> Vec<u8> {
        let status = self.finish();
        assert!(
            status.success(),
            "{}: {status}; stderr {:?}",
            self.what,
            self.err
        );
        self.out.clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// PEM files of a CA and of a certificate it signed for `localhost` and `127.0.0.1`, in
/// `d`: `ca.pem`, `cert.pem`, `key.pem`.
pub fn write_pki(d: &Dir) -> [String; 3] {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, "shmlink-cli test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key).unwrap();
    let files = [
        ("ca.pem", ca_cert.pem()),
        ("cert.pem", leaf_cert.pem()),
        ("key.pem", leaf_key.serialize_pem()),
    ];
    files.map(|(name, pem)| {
        let path = d.0.join(name);
        std::fs::write(&path, pem).unwrap();
        path.to_str().unwrap().to_string()
    })
}

/// Lines of `bytes`.
pub fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::to_string)
        .collect()
}
