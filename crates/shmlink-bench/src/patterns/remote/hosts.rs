//! `--pattern remote`'s two hosts: the network namespaces and their veth pair, the
//! processes run in them (with their CPU time), and the brokers started in host B.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------- the hosts

/// Prefix of the namespaces and the run's directory, followed by the bench's pid.
pub(super) const PREFIX: &str = "shbr-";

pub(super) fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two network namespaces `a` and `b` joined by a veth pair, with their rendezvous
/// directories and, with `--cpus`, the CPU each host's processes run on; removed on drop.
pub(super) struct Net {
    pub(super) ns: [String; 2],
    pub(super) cpus: Option<[usize; 2]>,
    pub(super) addr: [String; 2],
    pub(super) veth: [String; 2],
    pub(super) dir: [PathBuf; 2],
    pub(super) root: PathBuf,
}

impl Net {
    pub(super) fn new(cpus: Option<[usize; 2]>) -> Result<Net, String> {
        remove_stale();
        let pid = std::process::id();
        let id = format!("{PREFIX}{pid}");
        let root = std::env::temp_dir().join(&id);
        let subnet = 1 + pid % 250;
        let net = Net {
            ns: [format!("{id}-a"), format!("{id}-b")],
            cpus,
            addr: [format!("10.252.{subnet}.1"), format!("10.252.{subnet}.2")],
            veth: [
                format!("shbr{}a", pid % 1_000_000),
                format!("shbr{}b", pid % 1_000_000),
            ],
            dir: [root.join("a"), root.join("b")],
            root,
        };
        for i in 0..2 {
            std::fs::create_dir_all(&net.dir[i]).map_err(|e| e.to_string())?;
            ip(&["netns", "add", &net.ns[i]])?;
            ip(&["-n", &net.ns[i], "link", "set", "lo", "up"])?;
        }
        ip(&[
            "link",
            "add",
            &net.veth[0],
            "type",
            "veth",
            "peer",
            "name",
            &net.veth[1],
        ])?;
        for i in 0..2 {
            ip(&["link", "set", &net.veth[i], "netns", &net.ns[i]])?;
            let cidr = format!("{}/24", net.addr[i]);
            ip(&["-n", &net.ns[i], "addr", "add", &cidr, "dev", &net.veth[i]])?;
            ip(&["-n", &net.ns[i], "link", "set", &net.veth[i], "up"])?;
        }
        Ok(net)
    }

    /// Bytes sent by A's end of the veth (A to B).
    pub(super) fn bytes_a_to_b(&self) -> Result<u64, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns[0], "cat"])
            .arg(format!(
                "/sys/class/net/{}/statistics/tx_bytes",
                self.veth[0]
            ))
            .output()
            .map_err(|e| format!("ip netns exec: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("veth counter: {}", String::from_utf8_lossy(&out.stderr)))
    }

    /// A command run in host `h`'s namespace with its rendezvous directory (on host
    /// `h`'s CPU with `--cpus`).
    pub(super) fn command(&self, h: usize, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[h]]);
        on_cpu(&mut c, self.cpus.map(|c| c[h]));
        c.arg("env")
            .arg(format!("SHMLINK_DIR={}", self.dir[h].display()))
            .arg(program);
        c
    }
}

/// Makes the rest of `c`'s command line (and every process and thread it starts) run on
/// `cpu`, if given.
fn on_cpu(c: &mut Command, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        c.args(["taskset", "-c", &cpu.to_string()]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns", "delete", ns]);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Removes the namespaces and directories of runs whose process is gone.
pub(super) fn remove_stale() {
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
                let _ = ip(&["netns", "delete", &name]);
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

/// The CPU time of a process so far: each thread's (`/proc/PID/task/TID/schedstat`, in
/// ns) and the whole process's (`/proc/PID/stat`, user + system in 10 ms ticks, which
/// keeps the time of threads that ended).
#[derive(Clone, Default)]
pub(super) struct CpuSample {
    pub(super) threads: BTreeMap<String, u64>,
    pub(super) stat_ns: u64,
}

pub(super) fn cpu_sample(pid: u32) -> CpuSample {
    let mut s = CpuSample::default();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let text = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            if let Some(ns) = text.split_whitespace().next().and_then(|x| x.parse().ok()) {
                s.threads
                    .insert(t.file_name().to_string_lossy().into_owned(), ns);
            }
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // utime and stime: the 12th and 13th fields after the command name, which is in
    // parentheses and may hold spaces.
    if let Some(rest) = stat.rfind(')').and_then(|i| stat.get(i + 2..)) {
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        if f.len() > 12 {
            s.stat_ns = (f[11] + f[12]) * 10_000_000;
        }
    }
    s
}

/// The CPU time between two samples of one process, in µs: the threads' (ns), unless a
/// thread ended in between (its part is gone from `/proc`) and the process's ticks say
/// more. The ticks alone would be too coarse: 10 ms is 0.5 µs per message of a 20,000
/// message run.
pub(super) fn cpu_delta_us(a: &CpuSample, b: &CpuSample) -> f64 {
    let threads: u64 = b
        .threads
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(a.threads.get(tid).copied().unwrap_or(0)))
        .sum();
    let ended = a.threads.keys().any(|tid| !b.threads.contains_key(tid));
    let ns = if ended {
        threads.max(b.stat_ns.saturating_sub(a.stat_ns))
    } else {
        threads
    };
    ns as f64 / 1e3
}

// ------------------------------------------------------------------------ processes

/// A child process in a host: its stdout lines on a channel; killed on drop.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) host: usize,
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) lines: mpsc::Receiver<String>,
    pub(super) log: PathBuf,
}

impl Proc {
    pub(super) fn start(
        name: &str,
        host: usize,
        mut cmd: Command,
        log: PathBuf,
    ) -> Result<Proc, String> {
        let err = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Ok(Proc {
            name: name.to_string(),
            host,
            stdin: child.stdin.take(),
            child,
            lines,
            log,
        })
    }

    /// The next line starting with `prefix`, within `timeout`.
    pub(super) fn expect(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(_) => {}
                Err(_) => {
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(3).collect();
                    return Err(format!(
                        "{}: no {prefix:?} within {timeout:?} (exit {:?}; stderr: {})",
                        self.name,
                        self.child.try_wait().ok().flatten(),
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    ));
                }
            }
        }
    }

    pub(super) fn tell(&mut self, line: &str) {
        if let Some(s) = &mut self.stdin {
            let _ = writeln!(s, "{line}");
        }
    }

    /// Closes stdin (the ends exit) or sends SIGTERM (the bridges), then waits, killing
    /// after 5 s.
    pub(super) fn stop(&mut self, term: bool) {
        self.stdin = None;
        if term {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses `key=value` fields of a line.
pub(super) fn fields(line: &str) -> BTreeMap<&str, f64> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect()
}

/// The brokers in B: their addresses and processes, stopped on drop.
pub(super) struct Brokers {
    pub(super) ns: String,
    pub(super) dir: PathBuf,
    pub(super) redis: Result<String, String>,
    pub(super) rabbitmq: Result<String, String>,
    pub(super) pids: Vec<u32>,
}

impl Brokers {
    /// Starts them in host B's namespace `ns` (address `b`, on `cpu` if given), state in
    /// `dir`.
    pub(super) fn start(ns: String, dir: PathBuf, b: String, cpu: Option<usize>) -> Brokers {
        let script = crate::patterns::containers::root().join("scripts/brokers.sh");
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns]);
        on_cpu(&mut c, cpu);
        let out = c
            .arg(&script)
            .arg("start")
            .env("SHMLINK_BROKERS_DIR", &dir)
            .env("SHMLINK_BROKERS_BIND", "0.0.0.0")
            .stdin(Stdio::null())
            .output();
        let why = match &out {
            Ok(o) => format!(
                "scripts/brokers.sh start in B failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ),
            Err(e) => format!("scripts/brokers.sh: {e}"),
        };
        let pid = |f: &str| -> Option<u32> {
            std::fs::read_to_string(dir.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let redis_pid = pid("redis/redis.pid");
        let rabbit_pid = pid("rabbitmq/rabbitmq.pid");
        Brokers {
            ns,
            redis: redis_pid
                .map(|_| format!("{b}:16379"))
                .ok_or_else(|| why.clone()),
            rabbitmq: rabbit_pid
                .filter(|_| out.as_ref().is_ok_and(|o| o.status.success()))
                .map(|_| format!("{b}:15673"))
                .ok_or(why),
            pids: redis_pid.into_iter().chain(rabbit_pid).collect(),
            dir,
        }
    }
}

impl Drop for Brokers {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(crate::patterns::containers::root().join("scripts/brokers.sh"))
            .arg("stop")
            .env("SHMLINK_BROKERS_DIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
