//! `--pattern connect`: connection setup. Per connection the client connects, sends one
//! 64-byte message, receives it back and closes; the server (another process) accepts,
//! echoes the message and drops the connection. Reported: connections per second and the
//! p50/p90/p99 of one connect + round trip + close.
//!
//! - `shmlink-shm`: `shm:NAME` (the rendezvous directory), default options;
//! - `shmlink-auto`: `auto:127.0.0.1:PORT` (negotiated over TCP, upgraded to `shm:`);
//! - `shmlink-inproc`: `shm:NAME` with the server a thread of the client's process (the
//!   in-process path, the default between two ends of one process: no memfd, no socket
//!   per connection), pinned like the server process of the others;
//! - `uds`: a plain Unix stream socket (`std::os::unix::net`) at a path;
//! - `tcp`: a plain TCP socket on 127.0.0.1 (`std::net`), `TCP_NODELAY`.
//!
//! The server serves one connection at a time in one thread, like a plain accept loop.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use shmlink::{Connection, Listener, Options};

/// Bytes of the one round trip per connection.
pub const SIZE: usize = 64;

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
        about: "shmlink auto:127.0.0.1:PORT: TCP negotiation, then the shm: upgrade",
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
            "shmlink-auto" => Listener::bind("auto:127.0.0.1:0", &Options::default())
                .map(Server::Shmlink)
                .map_err(err),
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
    /// connection: the one who sets it connects once more to wake the accept).
    pub fn serve_until(&mut self, stop: &std::sync::atomic::AtomicBool) -> io::Result<()> {
        let mut buf = [0u8; SIZE];
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            // A client that fails half-way is its own problem: serve the next.
            let _ = match self {
                Server::Shmlink(l) => l.accept().map_err(err).and_then(|mut c| {
                    let n = c.recv(&mut buf).map_err(err)?;
                    c.send(&buf[..n]).map_err(err)
                }),
                Server::Uds(l, _) => l.accept().and_then(|(mut s, _)| {
                    s.read_exact(&mut buf)?;
                    s.write_all(&buf)
                }),
                Server::Tcp(l) => l.accept().and_then(|(mut s, _)| {
                    s.set_nodelay(true)?;
                    s.read_exact(&mut buf)?;
                    s.write_all(&buf)
                }),
            };
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

/// One connection: connect, one round trip of [`SIZE`] bytes, close.
pub fn once(method: &str, addr: &str) -> io::Result<()> {
    let msg = [0xa5u8; SIZE];
    let mut back = [0u8; SIZE];
    match method {
        "shmlink-shm" | "shmlink-auto" | "shmlink-inproc" => {
            let mut c = Connection::connect(addr, &Options::default()).map_err(err)?;
            c.send(&msg).map_err(err)?;
            let n = c.recv(&mut back).map_err(err)?;
            if n != SIZE {
                return Err(io::Error::other(format!("echo of {n} bytes")));
            }
            c.close().map_err(err)?;
        }
        "uds" => {
            let mut s = std::os::unix::net::UnixStream::connect(addr)?;
            s.write_all(&msg)?;
            s.read_exact(&mut back)?;
        }
        "tcp" => {
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            s.write_all(&msg)?;
            s.read_exact(&mut back)?;
        }
        other => return Err(io::Error::other(format!("unknown connect method {other}"))),
    }
    if back != msg {
        return Err(io::Error::other("echo differs"));
    }
    Ok(())
}

/// What a client run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub method: &'static str,
    pub connections: u64,
    pub rounds: u32,
    pub per_s: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub error: Option<String>,
}

/// Connects to `addr` over and over for `time` (after `warm` connections untimed).
pub fn measure(method: &'static ConnectMethod, addr: &str, warm: u64, time: Duration) -> Row {
    let mut row = Row {
        method: method.name,
        connections: 0,
        rounds: 1,
        per_s: 0.0,
        p50_us: 0.0,
        p90_us: 0.0,
        p99_us: 0.0,
        error: None,
    };
    for _ in 0..warm {
        if let Err(e) = once(method.name, addr) {
            row.error = Some(format!("warm-up: {e}"));
            return row;
        }
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < time {
        let t0 = Instant::now();
        if let Err(e) = once(method.name, addr) {
            row.error = Some(e.to_string());
            return row;
        }
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed();
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
    out
}
