//! `--pattern connect`: connection setup. Per connection the client connects, sends one
//! 64-byte message, receives it back and closes; the server (another process) accepts,
//! echoes the message and drops the connection. Reported: connections per second and the
//! p50/p90/p99 of one connect + round trip + close.
//!
//! - `shmlink-shm`: `shm:NAME` (the rendezvous directory), default options;
//! - `shmlink-auto`: `auto:127.0.0.1:PORT`, default options: the first connect
//!   negotiates over TCP and upgrades to `shm:`, every later one resumes with the ticket
//!   the one before brought (straight to the upgrade socket, no TCP);
//! - `shmlink-auto-fresh`: the same with
//!   [`Options::auto_resume`](::shmlink::Options::auto_resume) off at the client: every
//!   connect negotiates over TCP, as a client's first connect to a listener does;
//! - `shmlink-inproc`: `shm:NAME` with the server a thread of the client's process (the
//!   in-process path, the default between two ends of one process: no memfd, no socket
//!   per connection), pinned like the server process of the others;
//! - `uds`: a plain Unix stream socket (`std::os::unix::net`) at a path;
//! - `tcp`: a plain TCP socket on 127.0.0.1 (`std::net`), `TCP_NODELAY`.
//!
//! The server serves one connection at a time in one thread, like a plain accept loop.
//!
//! The message of connection #i (counted from 0 at both ends, warm-up included) is data
//! message #i of [`shmlink_measure::payload`], and both ends check all of it as the
//! point-to-point bench does, with the same code
//! ([`payload::verify`](shmlink_measure::payload::verify): length, both copies of the
//! sequence number, the checksum over every other byte): the server the message it
//! received (a wrong one is said on its stderr, and the connection closed unanswered),
//! the client the echo. A `shmlink-*` connection must be on shared memory
//! ([`Transport::Shm`](::shmlink::Transport::Shm): `auto:` must have upgraded).
//! `SHMLINK_BENCH_FAULT=corrupt:N|scribble:N` makes the client damage what it sends (for
//! tests: the run must fail); the run then lasts until connection #N at least
//! ([`measure`](crate::methods::connect::measure)).

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use shmlink::{Connection, Listener, Options, Transport};
use shmlink_measure::payload;
use shmlink_measure::protocol::Fault;

/// Bytes of the one round trip per connection.
pub const SIZE: usize = 64;
/// How much longer than asked a run with a fault may last to reach the damaged message.
pub const FAULT_GRACE: Duration = Duration::from_secs(60);

/// A connect method: its name and what it is.
pub struct ConnectMethod {
    pub name: &'static str,
    pub about: &'static str,
}

/// Every method, in table order.
pub static METHODS: &[ConnectMethod] = &[
    ConnectMethod {
        name: "shmlink-shm",
        about: "shmlink shm:NAME: rendezvous socket, two sealed memfds, handshake",
    },
    ConnectMethod {
        name: "shmlink-auto",
        about: "shmlink auto:127.0.0.1:PORT: resumed at the upgrade socket with the last connection's ticket",
    },
    ConnectMethod {
        name: "shmlink-auto-fresh",
        about: "shmlink auto:127.0.0.1:PORT, no tickets: TCP negotiation, then the shm: upgrade",
    },
    ConnectMethod {
        name: "shmlink-inproc",
        about: "shmlink shm:NAME, server a thread of this process: the in-process path (default)",
    },
    ConnectMethod {
        name: "uds",
        about: "Unix stream socket (std::os::unix::net), 64 B write/read",
    },
    ConnectMethod {
        name: "tcp",
        about: "TCP on 127.0.0.1 (std::net), TCP_NODELAY, 64 B write/read",
    },
];

/// The method called `name`.
pub fn find(name: &str) -> Option<&'static ConnectMethod> {
    METHODS.iter().find(|m| m.name == name)
}

fn err(e: shmlink::Error) -> io::Error {
    io::Error::other(e.to_string())
}

/// A bound server: its address for the client, and its accept loop.
pub enum Server {
    Shmlink(Listener),
    Uds(std::os::unix::net::UnixListener, std::path::PathBuf),
    Tcp(std::net::TcpListener),
}

impl Server {
    /// Binds `method`'s server; `tag` makes names unique.
    pub fn bind(method: &str, tag: &str) -> io::Result<Server> {
        match method {
            "shmlink-shm" | "shmlink-inproc" => {
                Listener::bind(&format!("shm:{tag}"), &Options::default())
                    .map(Server::Shmlink)
                    .map_err(err)
            }
            "shmlink-auto" | "shmlink-auto-fresh" => {
                Listener::bind("auto:127.0.0.1:0", &Options::default())
                    .map(Server::Shmlink)
                    .map_err(err)
            }
            "uds" => {
                let path = std::env::temp_dir().join(format!("{tag}.sock"));
                let _ = std::fs::remove_file(&path);
                Ok(Server::Uds(
                    std::os::unix::net::UnixListener::bind(&path)?,
                    path,
                ))
            }
            "tcp" => Ok(Server::Tcp(std::net::TcpListener::bind("127.0.0.1:0")?)),
            other => Err(io::Error::other(format!("unknown connect method {other}"))),
        }
    }

    /// The address a client connects to.
    pub fn addr(&self) -> io::Result<String> {
        Ok(match self {
            Server::Shmlink(l) => l.local_addr(),
            Server::Uds(_, path) => path.display().to_string(),
            Server::Tcp(l) => l.local_addr()?.to_string(),
        })
    }

    /// Serves connections one at a time, forever (the client ends the process).
    pub fn serve(&mut self) -> io::Result<()> {
        self.serve_until(&std::sync::atomic::AtomicBool::new(false))
    }

    /// Serves connections one at a time until `stop` is set (checked after each
    /// connection: the one who sets it connects once more to wake the accept). The
    /// message of the `i`th connection must be data message #i; a wrong one is said on
    /// stderr and left unanswered (the client then fails).
    pub fn serve_until(&mut self, stop: &std::sync::atomic::AtomicBool) -> io::Result<()> {
        let mut buf = [0u8; SIZE];
        let mut seq = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            let check = |msg: &[u8]| {
                payload::verify(msg, seq, SIZE).map_err(|e| {
                    eprintln!("shmlink-bench: connect server: connection #{seq}: {e}");
                    io::Error::other(e.to_string())
                })
            };
            // A client that fails half-way is its own problem: serve the next.
            let _ = match self {
                Server::Shmlink(l) => l.accept().map_err(err).and_then(|mut c| {
                    let n = c.recv(&mut buf).map_err(err)?;
                    check(&buf[..n])?;
                    c.send(&buf[..n]).map_err(err)
                }),
                Server::Uds(l, _) => l.accept().and_then(|(mut s, _)| {
                    s.read_exact(&mut buf)?;
                    check(&buf)?;
                    s.write_all(&buf)
                }),
                Server::Tcp(l) => l.accept().and_then(|(mut s, _)| {
                    s.set_nodelay(true)?;
                    s.read_exact(&mut buf)?;
                    check(&buf)?;
                    s.write_all(&buf)
                }),
            };
            seq += 1;
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Server::Uds(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Connection #`seq`: connect, one round trip of [`SIZE`] bytes (data message #`seq`,
/// damaged as `fault` says), close.
pub fn once(method: &str, addr: &str, seq: u64, fault: Option<Fault>) -> io::Result<()> {
    let mut msg = [0u8; SIZE];
    payload::write(&mut msg, seq);
    if let Some(f) = fault {
        f.damage(&mut msg, seq);
    }
    let mut back = [0u8; SIZE];
    let unanswered = |e: io::Error| {
        io::Error::other(format!(
            "connection #{seq}: no answer ({e}; the server's reason, if it gave one, is on \
             stderr)"
        ))
    };
    let n = match method {
        "shmlink-shm" | "shmlink-auto" | "shmlink-auto-fresh" | "shmlink-inproc" => {
            let opts = Options::default().auto_resume(method != "shmlink-auto-fresh");
            let mut c = Connection::connect(addr, &opts).map_err(err)?;
            if c.transport() != Transport::Shm {
                return Err(io::Error::other(format!(
                    "connection #{seq} to {addr} is not on shared memory: {:?}",
                    c.transport()
                )));
            }
            c.send(&msg).map_err(err)?;
            let n = c.recv(&mut back).map_err(|e| unanswered(err(e)))?;
            c.close().map_err(err)?;
            n
        }
        "uds" => {
            let mut s = std::os::unix::net::UnixStream::connect(addr)?;
            s.write_all(&msg)?;
            s.read_exact(&mut back).map_err(unanswered)?;
            SIZE
        }
        "tcp" => {
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            s.write_all(&msg)?;
            s.read_exact(&mut back).map_err(unanswered)?;
            SIZE
        }
        other => return Err(io::Error::other(format!("unknown connect method {other}"))),
    };
    payload::verify(&back[..n], seq, SIZE)
        .map_err(|e| io::Error::other(format!("connection #{seq}: echo: {e}")))
}

/// What a client run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub method: &'static str,
    /// Connections timed.
    pub connections: u64,
    /// Connections made, warm-up included (the next one is #`made`).
    #[serde(skip)]
    pub made: u64,
    pub rounds: u32,
    pub per_s: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub error: Option<String>,
}

impl Row {
    /// A row of one round of `method` with nothing measured yet (or `error`).
    pub fn empty(method: &'static str, error: Option<String>) -> Row {
        Row {
            method,
            connections: 0,
            made: 0,
            rounds: 1,
            per_s: 0.0,
            p50_us: 0.0,
            p90_us: 0.0,
            p99_us: 0.0,
            error,
        }
    }
}

/// Connects to `addr` over and over for `time` (after `warm` connections untimed). With a
/// `fault`, for at least as long as it takes to reach the connection it damages (at most
/// [`FAULT_GRACE`] longer): a run that ends before is an error.
pub fn measure(
    method: &'static ConnectMethod,
    addr: &str,
    warm: u64,
    time: Duration,
    fault: Option<Fault>,
) -> Row {
    let mut row = Row::empty(method.name, None);
    for seq in 0..warm {
        row.made = seq + 1;
        if let Err(e) = once(method.name, addr, seq, fault) {
            row.error = Some(format!("warm-up: {e}"));
            return row;
        }
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    let until = fault.and_then(Fault::first_damaged).map_or(0, |n| n + 1);
    while start.elapsed() < time || (row.made < until && start.elapsed() < time + FAULT_GRACE) {
        let seq = row.made;
        row.made += 1;
        let t0 = Instant::now();
        if let Err(e) = once(method.name, addr, seq, fault) {
            row.error = Some(e.to_string());
            return row;
        }
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed();
    if let Err(e) = crate::fault::reached(fault, row.made) {
        row.error = Some(e);
        return row;
    }
    row.connections = samples.len() as u64;
    row.per_s = samples.len() as f64 / total.as_secs_f64();
    if let Some(p) = shmlink_measure::stats::Percentiles::of(&mut samples) {
        row.p50_us = p.p50 as f64 / 1e3;
        row.p90_us = p.p90 as f64 / 1e3;
        row.p99_us = p.p99 as f64 / 1e3;
    }
    row
}

/// The median row of several rounds (each figure's median); the first error if any.
pub fn median(rows: &[Row]) -> Row {
    let mut out = rows[0].clone();
    if let Some(e) = rows.iter().find_map(|r| r.error.clone()) {
        out.error = Some(e);
        return out;
    }
    out.rounds = rows.len() as u32;
    let med = |f: fn(&Row) -> f64| super::median_f64(rows.iter().map(f));
    out.per_s = med(|r| r.per_s);
    out.p50_us = med(|r| r.p50_us);
    out.p90_us = med(|r| r.p90_us);
    out.p99_us = med(|r| r.p99_us);
    out.connections = rows.iter().map(|r| r.connections).sum();
    out.made = rows.iter().map(|r| r.made).sum();
    out
}
