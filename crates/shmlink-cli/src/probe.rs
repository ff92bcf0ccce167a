//! `shmlink probe ADDR`: whether a process listens at an address, for container health
//! checks (Kubernetes liveness/readiness probes, Compose `healthcheck`). Unlike a test
//! for the socket file (`test -S`), it connects: the file of a listener that was killed
//! (SIGKILL leaves it behind) answers `ECONNREFUSED`, and the probe fails.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use shmlink::inspect::{SocketReport, SocketState};
use shmlink::{Address, UnixName};

/// Longest `--timeout` accepted (one minute).
const MAX_TIMEOUT_MS: u64 = 60_000;

const PROBE_LONG: &str = "\
Exit 0 if a process listens at ADDR, 1 if nobody does: a health check for containers
(Kubernetes exec probes, Compose healthcheck). It connects rather than looking for the
socket file: the file of a listener that was killed (SIGKILL leaves it behind) refuses
the connection, and the probe fails at once.";

const PROBE_AFTER: &str = "\
shm:NAME and shm:/path.sock: the listener is asked over its socket, as `shmlink ls`
does; a listener or topic publisher that answers, and one whose process listens but is
busy (not in accept), count as listening. shm:@name, ux:NAME and ux:/path: a connection
is made and closed. tcp:, tls: and auto:HOST:PORT: a TCP connection is made and closed
(the listener drops it before any handshake; for tls: the certificate is not checked).
vm: addresses are not probed (`shmlink ls --vm`).

Prints one line: on stdout what listens (PID and UID where the kernel tells them), on
stderr why nothing does.

Exit status: 0 when a process listens at ADDR, 1 when nobody does (no socket file, the
file of a dead listener, connection refused or timed out, permission denied), 2 on bad
arguments.";

/// `shmlink probe`'s arguments.
#[derive(clap::Args, Debug)]
#[command(
    about = "Exit 0 if a process listens at an address, 1 if not (health checks)",
    long_about = PROBE_LONG,
    after_long_help = PROBE_AFTER
)]
pub struct ProbeCli {
    /// How long to wait for the connection and the listener's answer, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_MS))]
    timeout: u64,
    /// The address: shm:NAME, shm:/path.sock, shm:@name, ux:…, tcp:/tls:/auto:HOST:PORT
    #[arg(value_name = "ADDR", value_parser = crate::args::parse_addr)]
    addr: String,
}

/// What the probe found.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// A process listens; what to say about it.
    Listening(String),
    /// Nobody listens; why.
    Nobody(String),
}

/// Runs `shmlink probe`: its exit code, or a usage error's message (exit 2).
pub fn run(p: &ProbeCli) -> Result<ExitCode, String> {
    let timeout = Duration::from_millis(p.timeout);
    let addr = match Address::parse(&p.addr) {
        Ok(a) => a,
        Err(e) => return Err(e.to_string()),
    };
    let found = match &addr {
        Address::Shm {
            socket: UnixName::Path(path),
            ..
        } => shm_path(path, timeout),
        Address::Shm { socket, .. } | Address::Ux(socket) => unix(socket, timeout),
        Address::Tcp { host, port }
        | Address::Tls { host, port }
        | Address::Auto { host, port } => tcp(host, *port, timeout),
        Address::Vm { .. } => {
            return Err(
                "vm: addresses are not probed (`shmlink ls --vm` lists a region's listeners)"
                    .to_string(),
            );
        }
    };
    match found {
        Found::Listening(what) => {
            println!("{}: {what}", p.addr);
            Ok(ExitCode::SUCCESS)
        }
        Found::Nobody(why) => {
            eprintln!("shmlink probe: {}: {why}", p.addr);
            Ok(ExitCode::from(1))
        }
    }
}

/// `shm:` with a socket file: asks the listener as `shmlink ls` does.
fn shm_path(path: &Path, timeout: Duration) -> Found {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let reports = match shmlink::inspect(dir, timeout) {
        Ok(r) => r,
        Err(e) => return Found::Nobody(e.to_string()),
    };
    match reports.into_iter().find(|r| r.path == path) {
        Some(report) => judge(&report),
        None => Found::Nobody(format!("no socket {}", path.display())),
    }
}

/// What one socket's report means for the probe.
fn judge(r: &SocketReport) -> Found {
    let who = r
        .listener
        .map(|c| format!("pid {}, uid {}", c.pid, c.uid))
        .unwrap_or_else(|| "pid unknown".to_string());
    match &r.state {
        SocketState::Answered(s) => {
            let n = s.connections.len();
            let s_ = if n == 1 { "" } else { "s" };
            Found::Listening(format!(
                "listening ({who}), {} listener, {n} connection{s_}",
                s.transport
            ))
        }
        SocketState::Topic(t) => {
            let n = t.subscribers.len();
            let s_ = if n == 1 { "" } else { "s" };
            Found::Listening(format!(
                "listening ({who}), topic publisher, {n} subscriber{s_}"
            ))
        }
        SocketState::NotAnswering => Found::Listening(format!(
            "listening ({who}), busy: did not answer the query in time"
        )),
        SocketState::Stale => Found::Nobody(format!(
            "nobody listens: {} is the socket file of a listener that is gone",
            r.path.display()
        )),
        // The kernel named the listening process before it refused the query: it lives.
        SocketState::PermissionDenied(why) if r.listener.is_some() => Found::Listening(format!(
            "listening ({who}), but it does not admit this user: {why}"
        )),
        SocketState::PermissionDenied(why) => Found::Nobody(format!("permission denied: {why}")),
        SocketState::Failed(why) => Found::Nobody(why.clone()),
        other => Found::Nobody(format!("{other:?}")),
    }
}

/// An abstract `shm:@name` or a `ux:` socket: connects and closes.
fn unix(name: &UnixName, timeout: Duration) -> Found {
    match shmlink_sys::socket::connect(name, Instant::now() + timeout) {
        Ok(sock) => {
            let who = shmlink_sys::socket::peer_cred(std::os::fd::AsFd::as_fd(&sock))
                .map(|c| format!("pid {}, uid {}", c.pid, c.uid))
                .unwrap_or_else(|_| "pid unknown".to_string());
            Found::Listening(format!("listening ({who})"))
        }
        Err(e) => Found::Nobody(match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "nobody listens (connection refused: a socket file left by a listener that is gone, or no listener)".to_string()
            }
            std::io::ErrorKind::NotFound => "no such socket".to_string(),
            _ => format!("connect: {e}"),
        }),
    }
}

/// `tcp:`, `tls:`, `auto:`: a TCP connection to any of the host's addresses.
fn tcp(host: &str, port: u16, timeout: Duration) -> Found {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return Found::Nobody(format!("resolve {host}: {e}")),
    };
    let mut last = format!("{host} has no address");
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = format!("timed out after {} ms", timeout.as_millis());
            break;
        }
        match TcpStream::connect_timeout(&a, left) {
            Ok(_) => return Found::Listening(format!("accepts TCP connections at {a}")),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Found::Nobody(format!("nobody listens: {last}"))
}
