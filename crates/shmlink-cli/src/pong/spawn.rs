//! The server as a separate process: started by re-executing this program with
//! `pong --server --once`, killed when this process drops it or dies.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use shmlink::{Address, Connection, ErrorKind, Options};

use super::args::PongArgs;
use crate::error::{Context, Result, RunError};
use crate::wait::Waiting;

/// How long a server may take to start listening, and a client to get connected.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server may take to exit after its client is done.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between connection attempts while nobody listens yet.
const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// A running server process; killed (and reaped) on drop unless it has exited.
pub struct ServerProcess {
    child: Child,
    /// The address to connect to (for `tcp:`, `tls:` and `auto:HOST:0`, with the port the
    /// server got).
    pub addr: String,
}

impl ServerProcess {
    /// Starts a server for `addr` with the connection options and pinning of `args`, and
    /// waits until it listens (it prints its bound address on stdout).
    pub fn start(args: &PongArgs, addr: &str) -> Result<ServerProcess> {
        let exe = std::env::current_exe().context(|| "find this program".to_string())?;
        let mut cmd = Command::new(exe);
        cmd.args(["pong", "--server", "--once", "--parent-pid"])
            .arg(std::process::id().to_string());
        cmd.arg("--cpus").arg(args.pinning.to_arg());
        if let Some(ring) = args.ring_size {
            cmd.arg("--ring-size").arg(ring.to_string());
        }
        if let Some(us) = args.spin_us {
            cmd.arg("--spin-us").arg(us.to_string());
        }
        if args.shared_dir {
            cmd.arg("--shared-dir");
        }
        for (flag, file) in [
            ("--cert", &args.cert),
            ("--key", &args.key),
            ("--ca", &args.ca),
        ] {
            if let Some(file) = file {
                cmd.arg(flag).arg(file);
            }
        }
        cmd.arg("--").arg(addr);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .context(|| format!("start the server for {addr}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut server = ServerProcess {
            child,
            addr: addr.to_string(),
        };

        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let res = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = tx.send(res);
        });
        let bound = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) if !line.trim().is_empty() => line.trim().to_string(),
            Ok(_) => {
                let status = server.wait_exit(EXIT_TIMEOUT);
                return Err(RunError::new(format!(
                    "the server for {addr} exited before it listened ({})",
                    describe(status)
                )));
            }
            Err(_) => {
                return Err(RunError::new(format!(
                    "the server for {addr} did not listen within {START_TIMEOUT:?}"
                )))
            }
        };
        // Only a port the OS chose needs the server's word; other addresses are used as
        // given (the server's rendering of them need not be connectable from here).
        if matches!(
            Address::parse(addr),
            Ok(Address::Tcp { port: 0, .. }
                | Address::Tls { port: 0, .. }
                | Address::Auto { port: 0, .. })
        ) {
            server.addr = bound;
        }
        Ok(server)
    }

    /// An error if the server has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(RunError::new(format!(
                "the server for {} exited ({})",
                self.addr,
                describe(Some(status))
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits for the server to exit after its run; an error unless it exited with 0.
    pub fn finish(mut self) -> Result<()> {
        match self.wait_exit(EXIT_TIMEOUT) {
            Some(s) if s.success() => Ok(()),
            status => Err(RunError::new(format!(
                "the server for {} {}",
                self.addr,
                describe(status)
            ))),
        }
    }

    /// Waits up to `timeout` for the process to exit.
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(RETRY_PAUSE),
                _ => return None,
            }
        }
    }
}

fn describe(status: Option<ExitStatus>) -> String {
    match status {
        Some(s) if s.success() => "exited normally".into(),
        Some(s) => format!("failed: {s}"),
        None => "did not exit in time".into(),
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Connects to `addr`, retrying while nobody listens there yet (`ConnectionRefused`)
/// as `waiting` allows; `alive` is asked between attempts whether waiting still makes
/// sense.
pub fn connect_retry(
    addr: &str,
    opts: &Options,
    waiting: &mut Waiting<'_>,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<Connection> {
    loop {
        match Connection::connect(addr, opts) {
            Ok(conn) => return Ok(conn),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                if !waiting.again() {
                    return Err(RunError::new(format!("{e} {}", waiting.gave_up())));
                }
                alive()?;
                std::thread::sleep(RETRY_PAUSE);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Makes the kernel kill this process when its parent dies (`PR_SET_PDEATHSIG`), and
/// exits at once if the parent `parent` is already gone.
pub fn die_with_parent(parent: u32) -> Result<()> {
    shmlink_sys::process::kill_with_parent()
        .map_err(|e| RunError::new(format!("prctl(PR_SET_PDEATHSIG): {e}")))?;
    // The parent may have died before the prctl: then we were re-parented already.
    if std::os::unix::process::parent_id() != parent {
        std::process::exit(1);
    }
    Ok(())
}
