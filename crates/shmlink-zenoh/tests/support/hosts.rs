//! "Hosts" for the bridge tests: network namespaces joined by veth pairs, each with its
//! own rendezvous directory (`SHMLINK_DIR`), so nothing crosses through shared memory;
//! and the processes started in them. Everything is removed by guards on every exit
//! path; what a killed run left behind (its process is gone) is removed by the next.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Prefix of the namespaces and directories, followed by the test process's id.
pub const PREFIX: &str = "shz-";

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(program: &str, args: &[&str]) {
    run(program, args).unwrap_or_else(|e| panic!("{e}"));
}

/// Why the namespace tests cannot run here (`(category, reason)` for the skip), once per
/// process; removes what killed runs left behind.
pub fn unavailable() -> Option<(&'static str, String)> {
    static WHY: OnceLock<Option<(&'static str, String)>> = OnceLock::new();
    WHY.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some(("root", "needs root for ip netns".into()));
        }
        let probe = format!("{PREFIX}{}-probe", std::process::id());
        if let Err(e) = run("ip", &["netns", "add", &probe]) {
            return Some(("netns", format!("ip netns does not work here: {e}")));
        }
        let _ = run("ip", &["netns", "delete", &probe]);
        remove_stale();
        None
    })
    .clone()
}

fn remove_stale() {
    let stale = |name: &str| {
        name.strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    if let Ok(dir) = std::fs::read_dir("/run/netns") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale(&name) {
                let _ = run("ip", &["netns", "delete", &name]);
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) {
        for e in dir.flatten() {
            if stale(&e.file_name().to_string_lossy()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A started process: its stdout lines arrive on a channel; killed (SIGKILL) on drop.
pub struct Proc {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Every line read so far (for failure messages).
    pub seen: Vec<String>,
}

impl Proc {
    /// Waits for a line starting with `prefix`; panics with what was seen after `timeout`.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    // libtest's `test peer ... ` has no newline: a peer's first line
                    // follows it.
                    let l = match l.find(" ... ") {
                        Some(i) if l.starts_with("test ") => l[i + 5..].to_owned(),
                        _ => l,
                    };
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "{}: no {prefix:?} line within {timeout:?}; exit: {:?}; saw: {:?}",
                    self.name,
                    self.child.try_wait(),
                    self.seen
                ),
            }
        }
    }

    /// Writes a line to the process's stdin.
    pub fn tell(&mut self, line: &str) {
        if let Some(s) = &mut self.stdin {
            let _ = writeln!(s, "{line}");
        }
    }

    /// SIGTERM, then every line until the process exits (SIGKILL after `timeout`).
    pub fn stop(&mut self, timeout: Duration) -> Vec<String> {
        // SAFETY: kill has no memory preconditions; the pid is our child's, not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while let Ok(l) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(l);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.seen.clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A network namespace with its own rendezvous directory.
pub struct Host {
    pub ns: String,
    pub dir: PathBuf,
}

/// Network namespaces joined by veth pairs; deleted (with the directories) on drop.
pub struct Net {
    pub hosts: Vec<Host>,
    /// The test's directory (removed on drop).
    pub root: PathBuf,
    net: u8,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);
static SUBNETS: Mutex<u8> = Mutex::new(0);

impl Net {
    /// `n` hosts named `a`, `b`, …, with no links yet.
    pub fn new(n: usize) -> Net {
        let id = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let root = std::env::temp_dir().join(&id);
        std::fs::create_dir_all(&root).unwrap();
        // A block of subnets per Net: 10.(200 + k).x.0/24, k from a process-wide counter
        // and the pid, so parallel tests and parallel runs differ.
        let net = {
            let mut s = SUBNETS.lock().unwrap();
            *s = s.wrapping_add(1);
            ((std::process::id() as u8).wrapping_mul(7)).wrapping_add(*s)
        };
        let mut me = Net {
            hosts: Vec::new(),
            root,
            net,
        };
        for i in 0..n {
            let ns = format!("{id}-{}", (b'a' + i as u8) as char);
            must("ip", &["netns", "add", &ns]);
            let dir = me.root.join(format!("{}", (b'a' + i as u8) as char));
            std::fs::create_dir_all(&dir).unwrap();
            me.hosts.push(Host {
                ns: ns.clone(),
                dir,
            });
            must("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        me
    }

    /// Joins hosts `i` and `j` with a veth pair on subnet `10.<200+link>.<net>.0/24`;
    /// returns their addresses (i's, j's). Addresses exist only in the namespaces.
    pub fn link(&self, i: usize, j: usize, link: u8) -> (String, String) {
        let (a, b) = (&self.hosts[i].ns, &self.hosts[j].ns);
        let va = format!("shz{}{}{i}{j}", std::process::id() % 100_000, link);
        let vb = format!("{va}p");
        must(
            "ip",
            &[
                "link", "add", &va, "netns", a, "type", "veth", "peer", "name", &vb, "netns", b,
            ],
        );
        let ipa = format!("10.{}.{}.1", 200 + link, self.net);
        let ipb = format!("10.{}.{}.2", 200 + link, self.net);
        must(
            "ip",
            &["-n", a, "addr", "add", &format!("{ipa}/24"), "dev", &va],
        );
        must(
            "ip",
            &["-n", b, "addr", "add", &format!("{ipb}/24"), "dev", &vb],
        );
        must("ip", &["-n", a, "link", "set", &va, "up"]);
        must("ip", &["-n", b, "link", "set", &vb, "up"]);
        (ipa, ipb)
    }

    /// Starts `program args` on host `h` with `env` (and `SHMLINK_DIR` = the host's
    /// directory); dies with the test process (`PR_SET_PDEATHSIG`).
    pub fn spawn(
        &self,
        h: usize,
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, String)],
    ) -> Proc {
        let host = &self.hosts[h];
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &host.ns])
            .arg(program)
            .args(args)
            .env("SHMLINK_DIR", &host.dir)
            .env_remove("SHMLINK_REQUIRE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // SAFETY: prctl in the child between fork and exec: async-signal-safe, no
        // allocation.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc {
            name: format!("{name}@{}", host.ns),
            stdin: child.stdin.take(),
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// A stream with an outage in its middle, as the restart tests run it: a publisher
    /// and a subscriber on host 0, a subscriber on host 1, `count` small messages of
    /// `topic` under Block, 1 ms apart; 800 ms in, `outage` kills and restarts something
    /// on the path between the hosts. Returns the two subscribers' result lines (host 0,
    /// host 1) and what `outage` returned.
    pub fn stream_through_an_outage<T>(
        &self,
        topic: &str,
        count: u64,
        outage: impl FnOnce() -> T,
    ) -> (String, String, T) {
        let env = vec![
            ("SHZ_TOPIC", topic.to_owned()),
            ("SHZ_COUNT", count.to_string()),
            ("SHZ_POLICY", "block".to_owned()),
            ("SHZ_SIZES", "small".to_owned()),
            ("SHZ_IDLE_MS", "20000".to_owned()),
        ];
        let mut p = env.clone();
        p.extend([
            ("SHZ_SUBS", "2".to_owned()),
            ("SHZ_GAP_US", "1000".to_owned()),
        ]);
        let mut publisher = self.role(0, "pub", "pub", &p);
        let mut sub_a = self.role(0, "sub-a", "sub", &env);
        let mut sub_b = self.role(1, "sub-b", "sub", &env);
        publisher.expect("bound", Duration::from_secs(40));
        sub_a.expect("ready", Duration::from_secs(40));
        sub_b.expect("ready", Duration::from_secs(40));
        publisher.tell("go");
        std::thread::sleep(Duration::from_millis(800));
        let kept = outage();
        publisher.expect("done", Duration::from_secs(60));
        let ra = sub_a.expect("result", Duration::from_secs(60));
        let rb = sub_b.expect("result", Duration::from_secs(60));
        publisher.tell("exit");
        (ra, rb, kept)
    }

    /// This test binary as a peer process in role `role` (see `roles.rs`).
    pub fn role(&self, h: usize, name: &str, role: &str, env: &[(&str, String)]) -> Proc {
        let exe = std::env::current_exe().unwrap();
        let mut env = env.to_vec();
        env.push(("SHZ_ROLE", role.into()));
        self.spawn(
            h,
            name,
            &exe,
            &["peer", "--exact", "--nocapture", "--test-threads=1"],
            &env,
        )
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = run("ip", &["netns", "delete", &h.ns]);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The bridge binary.
pub fn bridge_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_shmlink-zenoh"))
}
