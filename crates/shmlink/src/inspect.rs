//! Introspection for tools like `shmlink ls`: which listeners serve a rendezvous
//! directory, and which connections each of them accepted, with their counters.
//!
//! Nothing of a connection is reachable by name except its listener's rendezvous socket,
//! so the questions go there: [`inspect`] connects to every socket in the directory,
//! learns the listening process from the kernel (`SO_PEERCRED`), and sends a `Query`
//! packet, which the listener answers with a `Status` (see the handshake's packet table).
//! The query passes the same credential check as a connection.
//!
//! **A listener answers while its process accepts or polls it**, like XCM's control
//! interface: in [`Listener::accept`](crate::Listener::accept), or when an event loop sees
//! the listener's fd readable and calls `accept`. A process busy elsewhere (serving one
//! client with a blocking loop, say) is reported as [`SocketState::NotAnswering`], with
//! its pid and uid all the same.
//!
//! `shm:` listeners report their connections, `auto:` listeners (through their upgrade
//! socket) those upgraded to shared memory and those that stayed on TCP/TLS. `ux:`,
//! `tcp:` and `tls:` listeners have no socket in the directory and are not seen.
//! Publish/subscribe topics (`shm:` and `auto:` publishers) answer with their
//! subscribers, each one's lag and drops ([`SocketState::Topic`], `pubsub::status`);
//! a publisher's control thread answers at any time.
//!
//! Bridges that carry topics to other hosts are not listeners: each keeps a status file
//! in the directory, which [`bridges()`] reads.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::addr::UnixName;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::socket;
use crate::transport::shm::handshake::{Packet, MAX_STATUS};

mod bridges;
pub use bridges::{
    bridge_status_path, bridges, write_bridge_status, BridgeReport, BridgedTopic,
    BRIDGE_STALE_AFTER, MAX_BRIDGE_STATUS,
};

/// How long [`inspect`] waits for answers unless told otherwise.
pub const DEFAULT_INSPECT_TIMEOUT: Duration = Duration::from_millis(500);

/// What [`inspect`](crate::inspect()) found at one socket.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SocketState {
    /// The listener answered.
    Answered(ListenerStatus),
    /// A publish/subscribe topic's publisher answered.
    Topic(TopicStatus),
    /// A process listens but did not answer in time: it is not in `accept` and does not
    /// poll its listener.
    NotAnswering,
    /// Nobody listens (`ECONNREFUSED`): the file of a listener that died.
    Stale,
    /// The socket or the listener does not admit this user.
    PermissionDenied(String),
    /// Anything else: not a shmlink socket, a refusal, a malformed answer, an I/O error.
    Failed(String),
}

/// One rendezvous socket and what [`inspect`](crate::inspect()) learned about it.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketReport {
    /// The socket file.
    pub path: PathBuf,
    /// The process that listens on it, if the socket could be connected.
    pub listener: Option<ProcessCred>,
    /// What came back.
    pub state: SocketState,
}

/// What the socket file of a transparent-mode registration (`libshmlink_preload.so`,
/// docs/transparent.md) stands for, read from its name.
///
/// `Send`, `Sync`, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransparentRegistration {
    /// `tcp-NETNS-ADDRESS-PORT.sock`: a preloaded program's listening TCP socket, in
    /// network namespace `netns` (the inode of its `/proc/PID/ns/net`).
    Listen {
        /// The address and port the program listens on (possibly a wildcard).
        addr: std::net::SocketAddr,
        /// The network namespace.
        netns: u64,
    },
    /// `tcpw-NETNS-PID-N.sock`: where a forked worker (or another process of an
    /// `SO_REUSEPORT` group) takes the connections it accepted on a shared socket.
    Worker {
        /// The worker's pid, as it named the socket.
        pid: u32,
        /// The network namespace.
        netns: u64,
    },
}

impl std::fmt::Display for TransparentRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransparentRegistration::Listen { addr, .. } => write!(f, "{addr}"),
            TransparentRegistration::Worker { pid, .. } => write!(f, "worker {pid}"),
        }
    }
}

/// Decodes the name of socket file `path` if the preload library made it (the names
/// `shmlink ls` shows as a program and a port); `None` for any other file.
///
/// ```
/// use std::path::Path;
/// let r = shmlink::inspect::transparent_registration(Path::new(
///     "/tmp/shmlink-0/tcp-effffff9-00000000000000000000ffff7f000001-6379.sock",
/// ));
/// assert_eq!(r.unwrap().to_string(), "127.0.0.1:6379");
/// ```
pub fn transparent_registration(path: &Path) -> Option<TransparentRegistration> {
    let name = path.file_name()?.to_str()?.strip_suffix(".sock")?;
    let hex =
        |t: &str| (!t.is_empty() && t.len() <= 16).then(|| u64::from_str_radix(t, 16).ok())?;
    if let Some(rest) = name.strip_prefix("tcpw-") {
        let mut parts = rest.split('-');
        let (netns, pid, nanos) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || hex(nanos).is_none() {
            return None;
        }
        return Some(TransparentRegistration::Worker {
            netns: hex(netns)?,
            pid: pid.parse().ok()?,
        });
    }
    let mut parts = name.strip_prefix("tcp-")?.split('-');
    let (netns, ip, port) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || ip.len() != 32 || !ip.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut octets = [0u8; 16];
    for (i, o) in octets.iter_mut().enumerate() {
        *o = u8::from_str_radix(&ip[2 * i..2 * i + 2], 16).ok()?;
    }
    let v6 = std::net::Ipv6Addr::from(octets);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(v6),
    };
    Some(TransparentRegistration::Listen {
        addr: std::net::SocketAddr::new(ip, port.parse().ok()?),
        netns: hex(netns)?,
    })
}

/// Asks every listener with a socket (`*.sock`) in `dir` what it serves, waiting at most
/// `timeout` in all for the answers; returns one report per socket, sorted by path.
///
/// Sockets are asked all at once, so a listener that does not answer costs `timeout`
/// once, not once per socket. Fails only if `dir` cannot be read.
///
/// ```
/// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-ls-{}", std::process::id())));
/// use shmlink::inspect::{SocketState, DEFAULT_INSPECT_TIMEOUT};
/// use shmlink::{Listener, Options};
/// let mut listener = Listener::bind("shm:doc-ls", &Options::default())?;
/// listener.set_nonblocking(true);
/// // The listener answers while its process accepts: here, a thread that polls it.
/// let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
/// let stop2 = stop.clone();
/// let server = std::thread::spawn(move || {
///     while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
///         let _ = listener.accept();
///         std::thread::sleep(std::time::Duration::from_millis(1));
///     }
/// });
/// let reports = shmlink::inspect(&shmlink::rendezvous_dir(), DEFAULT_INSPECT_TIMEOUT)?;
/// let SocketState::Answered(status) = &reports[0].state else { panic!("{reports:?}") };
/// assert_eq!(status.address, "shm:doc-ls");
/// assert_eq!(reports[0].listener.unwrap().pid, std::process::id());
/// stop.store(true, std::sync::atomic::Ordering::Relaxed);
/// server.join().unwrap();
/// # Ok::<(), shmlink::Error>(())
/// ```
pub fn inspect(dir: &Path, timeout: Duration) -> Result<Vec<SocketReport>> {
    let deadline = Instant::now() + timeout;
    let read = |e| Error::io(format!("read {}", dir.display()), e);
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(read)? {
        let entry = entry.map_err(read)?;
        let path = entry.path();
        let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
        if is_socket && path.extension().is_some_and(|e| e == "sock") {
            paths.push(path);
        }
    }
    paths.sort();
    // Every question first, then every answer: the listeners work in parallel.
    let asked: Vec<_> = paths.into_iter().map(|p| ask(p, deadline)).collect();
    let mut buf = vec![0u8; MAX_STATUS];
    Ok(asked
        .into_iter()
        .filter_map(|a| match a {
            Asked::Done(report) => report,
            Asked::Waiting { path, sock, cred } => Some(SocketReport {
                state: answer(&sock, &mut buf, deadline),
                path,
                listener: Some(cred),
            }),
        })
        .collect())
}

/// A socket after the question.
enum Asked {
    /// Nothing to wait for (`None`: the file went away meanwhile).
    Done(Option<SocketReport>),
    /// The query is sent.
    Waiting {
        path: PathBuf,
        sock: OwnedFd,
        cred: ProcessCred,
    },
}

/// Connects to the socket at `path` and sends the query.
fn ask(path: PathBuf, deadline: Instant) -> Asked {
    let done = |path, listener, state| {
        Asked::Done(Some(SocketReport {
            path,
            listener,
            state,
        }))
    };
    let sock = match socket::connect(&UnixName::Path(path.clone()), deadline) {
        Ok(s) => s,
        Err(e) => {
            let state = match e.kind() {
                io::ErrorKind::NotFound => return Asked::Done(None),
                io::ErrorKind::ConnectionRefused => SocketState::Stale,
                io::ErrorKind::PermissionDenied => SocketState::PermissionDenied(e.to_string()),
                // Its backlog stayed full: someone listens, and does not accept.
                io::ErrorKind::TimedOut => SocketState::NotAnswering,
                _ if e.raw_os_error() == Some(crate::sys::errno::EPROTOTYPE) => {
                    SocketState::Failed("not a shmlink socket (not SOCK_SEQPACKET)".to_string())
                }
                _ => SocketState::Failed(format!("connect: {e}")),
            };
            return done(path, None, state);
        }
    };
    let cred = match socket::peer_cred(sock.as_fd()) {
        Ok(c) => ProcessCred::from(c),
        Err(e) => return done(path, None, SocketState::Failed(format!("SO_PEERCRED: {e}"))),
    };
    match socket::send(sock.as_fd(), &Packet::Query.encode()) {
        Ok(_) => Asked::Waiting { path, sock, cred },
        Err(e) => done(path, Some(cred), SocketState::Failed(format!("send: {e}"))),
    }
}

/// Waits for the listener's answer on `sock` until `deadline`.
fn answer(sock: &OwnedFd, buf: &mut [u8], deadline: Instant) -> SocketState {
    let mut fds = Vec::new();
    let n = match socket::recv_until(sock.as_fd(), buf, &mut fds, deadline) {
        Ok(0) => return SocketState::Failed("closed without an answer".to_string()),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::TimedOut => return SocketState::NotAnswering,
        Err(e) => return SocketState::Failed(format!("receive: {e}")),
    };
    if !fds.is_empty() {
        return SocketState::Failed("the answer carried descriptors".to_string());
    }
    if let Some(topic) = crate::pubsub::status::decode_answer(&buf[..n]) {
        return topic.map_or_else(|e| SocketState::Failed(e.to_string()), SocketState::Topic);
    }
    match Packet::decode(&buf[..n]) {
        Ok(Packet::Status(status)) => SocketState::Answered(status),
        Ok(Packet::Refuse(code, reason)) if code.kind() == ErrorKind::PermissionDenied => {
            SocketState::PermissionDenied(reason)
        }
        Ok(Packet::Refuse(_, reason)) => SocketState::Failed(format!("refused: {reason}")),
        Ok(other) => SocketState::Failed(format!("answered the query with {other:?}")),
        Err(e) => SocketState::Failed(e.to_string()),
    }
}

pub use crate::pubsub::{SubscriberInfo, TopicStatus};
pub use crate::status::{ConnectionStatus, ListenerStatus, ProcessCred, Refusals};
pub use crate::transport::vm::inspect::{
    inspect_vm, VmConnectionStatus, VmListenerStatus, VmRegionReport,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transparent_registrations_are_named_by_address_and_port() {
        let r = |n: &str| transparent_registration(Path::new(n)).map(|r| r.to_string());
        assert_eq!(
            r("tcp-effffff9-00000000000000000000ffff7f000001-6379.sock").as_deref(),
            Some("127.0.0.1:6379")
        );
        assert_eq!(
            r("d/tcp-1-00000000000000000000ffff00000000-80.sock").as_deref(),
            Some("0.0.0.0:80")
        );
        assert_eq!(
            r("tcp-1-00000000000000000000000000000001-443.sock").as_deref(),
            Some("[::1]:443")
        );
        assert_eq!(
            r("tcpw-effffff9-1234-3b9ac9ff.sock").as_deref(),
            Some("worker 1234")
        );
        for other in [
            "tcp-1-00-80.sock",
            "tcp-1-00000000000000000000ffff7f000001-99999.sock",
            "tcp-1-00000000000000000000ffff7f000001-80",
            "tcp-zz-00000000000000000000ffff7f000001-80.sock",
            "tcp-1-00000000000000000000ffff7f000001-80-x.sock",
            "redis.sock",
            "tcpw-1-x-1.sock",
        ] {
            assert_eq!(r(other), None, "{other}");
        }
    }
}
