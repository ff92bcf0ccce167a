//! The machinery of the namespace tests (`namespaces.rs`): whether this machine can run
//! them, the test's directory, the veth network and the peer processes, each a guard
//! that removes what it made, on every exit path.
//!
//! Names carry the process id and a counter ([`PREFIX`]`PID-N`), so tests run in
//! parallel and overlapping runs do not clash; what a killed run left behind is removed
//! by the next one ([`unavailable`] does it once per process).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use crate::remote::{Role, MARK};

/// Prefix of every name the tests create (network namespaces, directories), followed
/// by the process id.
pub const PREFIX: &str = "shmlink-ns-";
/// The veth pair's addresses, which exist only inside the test's network namespaces.
pub const SERVER_IP: &str = "10.199.0.1";
pub const CLIENT_IP: &str = "10.199.0.2";

/// The namespaces every peer gets (a network namespace comes from `ip netns exec` or
/// from `--net`). `--kill-child`: when `unshare` dies, its child (PID 1 of the new PID
/// namespace) is killed, and with it everything in the namespace.
pub const UNSHARE: &[&str] = &[
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
    "--mount",
    "--ipc",
    "--uts",
];

pub fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Runs a command to completion; panics with its stderr if it fails.
fn run_tool(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {} ({})",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim(),
        out.status
    );
}

// ---------------------------------------------------------------------------------------
// What the tests need from this machine.

/// Tools the tests run, and the Debian package of each.
const TOOLS: &[(&str, &str)] = &[
    ("unshare", "util-linux"),
    ("mount", "mount"),
    ("ip", "iproute2"),
    ("sh", "dash"),
];

/// Why the tests cannot run here, if they cannot: checked once per process, before
/// anything is created. Also removes what killed runs left behind.
pub fn unavailable() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Some("needs root (unshare, mount, ip netns)".into());
        }
        for (tool, package) in TOOLS {
            if !on_path(tool) {
                return Some(format!("needs `{tool}` on PATH (Debian package {package})"));
            }
        }
        let probe = Command::new("unshare")
            .args(UNSHARE)
            .args(["--net", "--", "true"])
            .stdin(Stdio::null())
            .output();
        match probe {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Some(format!(
                    "unshare cannot create namespaces here: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
            Err(e) => return Some(format!("unshare: {e}")),
        }
        let ns = format!("{PREFIX}{}-probe", std::process::id());
        let added = Command::new("ip")
            .args(["netns", "add", &ns])
            .stdin(Stdio::null())
            .output();
        match added {
            Ok(out) if out.status.success() => run_tool("ip", &["netns", "delete", &ns]),
            Ok(out) => {
                return Some(format!(
                    "ip netns add fails here: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
            Err(e) => return Some(format!("ip: {e}")),
        }
        remove_stale();
        None
    })
    .as_deref()
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// The process id in a name this file created (`shmlink-ns-PID-…`).
fn owner(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the network namespaces and directories of runs that were killed before
/// their guards ran (their process is gone).
fn remove_stale() {
    let stale = |name: &str| owner(name).is_some_and(|pid| !alive(pid));
    if let Ok(dir) = std::fs::read_dir("/run/netns") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale(&name) {
                eprintln!("removing network namespace {name} of a killed run");
                let _ = Command::new("ip").args(["netns", "delete", &name]).output();
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) {
        for e in dir.flatten() {
            if stale(&e.file_name().to_string_lossy()) {
                eprintln!("removing {} of a killed run", e.path().display());
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A number unique within this process, for names.
fn next_id() -> usize {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------
// Guards: the test's directory, the network, the peers.

/// The test's directory on the host: `shared/` (what the sides may share), the mount
/// points of the sides' rendezvous directories (empty on the host: the mounts live in
/// the sides' mount namespaces) and a foreign boot id. Removed on drop.
pub struct TestRoot {
    path: PathBuf,
}

impl TestRoot {
    pub fn new() -> TestRoot {
        let path =
            std::env::temp_dir().join(format!("{PREFIX}{}-{}", std::process::id(), next_id()));
        let _ = std::fs::remove_dir_all(&path); // a killed run's, if its pid came back
        let root = TestRoot { path };
        std::fs::create_dir(&root.path).unwrap();
        std::fs::create_dir(root.shared()).unwrap();
        std::fs::write(root.boot_id(), "00000000-0000-4000-8000-000000000000\n").unwrap();
        root
    }

    pub fn shared(&self) -> PathBuf {
        self.path.join("shared")
    }

    pub fn boot_id(&self) -> PathBuf {
        self.path.join("boot_id")
    }

    /// `name` under the root, created if needed.
    pub fn mount_point(&self, name: &str) -> PathBuf {
        let dir = self.path.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Every file under the root but the boot id, relative to the root.
    pub fn files(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, root, out);
                } else {
                    out.push(p.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.path, &self.path, &mut out);
        out.retain(|f| f != "boot_id");
        out.sort();
        out
    }

    /// After the peers exited: their listeners removed their sockets.
    pub fn check_nothing_left(&self) {
        let files = self.files();
        assert!(files.is_empty(), "left behind: {files:?}");
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("cannot remove {}: {e}", self.path.display());
        }
    }
}

/// Two network namespaces joined by a veth pair: the server's at [`SERVER_IP`], the
/// client's at [`CLIENT_IP`]. The interfaces are created inside the namespaces, never on
/// the host. Deleted on drop (which deletes the interfaces).
pub struct Network {
    server: String,
    client: String,
}

impl Network {
    pub fn new() -> Network {
        let base = format!("{PREFIX}{}-{}", std::process::id(), next_id());
        let net = Network {
            server: format!("{base}-server"),
            client: format!("{base}-client"),
        };
        for ns in [&net.server, &net.client] {
            if Path::new("/run/netns").join(ns).exists() {
                // A killed run's whose pid came back: ours cannot exist yet.
                run_tool("ip", &["netns", "delete", ns]);
            }
            run_tool("ip", &["netns", "add", ns]);
        }
        let (s, c) = (net.server.as_str(), net.client.as_str());
        run_tool(
            "ip",
            &[
                "link", "add", "veth-s", "netns", s, "type", "veth", "peer", "name", "veth-c",
                "netns", c,
            ],
        );
        for (ns, dev, ip) in [(s, "veth-s", SERVER_IP), (c, "veth-c", CLIENT_IP)] {
            run_tool(
                "ip",
                &["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev],
            );
            run_tool("ip", &["-n", ns, "link", "set", dev, "up"]);
            run_tool("ip", &["-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }

    pub fn name(&self, role: Role) -> &str {
        match role {
            Role::Server => &self.server,
            Role::Client => &self.client,
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for ns in [&self.server, &self.client] {
            if Path::new("/run/netns").join(ns).exists() {
                let out = Command::new("ip").args(["netns", "delete", ns]).output();
                if !out.is_ok_and(|o| o.status.success()) {
                    eprintln!("cannot delete network namespace {ns}");
                }
            }
        }
    }
}

/// A peer process; killed and reaped on drop unless it has exited.
pub struct Peer {
    role: Role,
    child: Child,
    /// Held open: the peer exits when it closes (the test is gone).
    _stdin: ChildStdin,
    /// Its [`MARK`] lines, without the mark.
    marks: mpsc::Receiver<String>,
    status: Option<ExitStatus>,
}

impl Peer {
    pub fn spawn(role: Role, mut cmd: Command) -> Peer {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start the {}: {e}", role.name()));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, marks) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness prints text of its own, some on the same line.
                if let Some((_, mark)) = line.split_once(MARK) {
                    if tx.send(mark.trim().to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        Peer {
            role,
            child,
            _stdin: stdin,
            marks,
            status: None,
        }
    }

    /// The next mark, which must start with `prefix`; returns the rest of it.
    pub fn expect_mark(&mut self, prefix: &str, deadline: Instant) -> String {
        let who = self.role.name();
        match self.marks.recv_timeout(remaining(deadline)) {
            Ok(m) => match m.strip_prefix(prefix) {
                Some(rest) => rest.to_string(),
                None => panic!("{who}: expected {prefix:?}, got {m:?}"),
            },
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("{who}: no {prefix:?} in time"),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.wait(deadline);
                panic!("{who} ended ({status}) before {prefix:?}")
            }
        }
    }

    /// The marks up to the peer's exit, which must come by `deadline` and be a success.
    pub fn finish(&mut self, deadline: Instant) -> Vec<String> {
        let who = self.role.name();
        let mut marks = Vec::new();
        loop {
            match self.marks.recv_timeout(remaining(deadline)) {
                Ok(m) => marks.push(m),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{who}: not done in time; so far {marks:?}")
                }
            }
        }
        let status = self.wait(deadline);
        assert!(status.success(), "{who} failed ({status}) after {marks:?}");
        marks
    }

    /// Waits for the exit (its output has ended, so it is imminent) until `deadline`.
    fn wait(&mut self, deadline: Instant) -> ExitStatus {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.status = Some(status);
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit in time",
                self.role.name()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
