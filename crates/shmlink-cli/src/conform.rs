//! `shmlink conform` (hidden): the conformance scenarios the CLI's verified pong runs do
//! not cover — echo, flow control, non-blocking + poll, graceful close both ways — run
//! over any address between two processes, for places where the test suite cannot run
//! (inside QEMU guests: scripts/vm-test.sh). Every message carries its sequence number
//! and a pattern derived from it, and is compared whole; each scenario prints one line
//! saying what it verified, or fails the command.
//!
//! The client opens one connection per scenario and names the scenario in its first
//! message; the server (`--server`) serves connections one at a time, forever.

use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use shmlink::options::MAX_MSG_SIZE_LIMIT;
use shmlink::{Connection, ErrorKind, Listener, Options};

use shmlink_sys::{poll_fd, Interest};

use crate::error::{Context, Result, RunError};

/// `shmlink conform`'s arguments.
#[derive(clap::Args, Debug)]
#[command(about = "Run conformance scenarios between two processes (for VM guests)")]
pub struct ConformCli {
    /// Serve the scenarios (else run them as a client)
    #[arg(long)]
    server: bool,
    /// Scenarios to run (client): echo, flow, poll, close-out, close-in [default: all]
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// The address to listen on or connect to
    #[arg(value_name = "ADDRESS")]
    addr: String,
}

/// Every scenario, in the order a client runs them.
const ALL: [&str; 5] = ["echo", "flow", "poll", "close-out", "close-in"];
/// Longest any single wait may take (TCG guests are slow).
const PATIENCE: Duration = Duration::from_secs(60);
/// Messages and sizes of each scenario.
const ECHO_SIZES: [usize; 7] = [1, 7, 64, 1000, 4096, 65_536, 1 << 20];
const ECHO_ROUNDS: usize = 60;
const FLOW_COUNT: u64 = 2000;
const FLOW_SIZE: usize = 4096;
/// How long the flow scenario's receiver sleeps before reading.
const FLOW_SLEEP: Duration = Duration::from_secs(1);
const POLL_COUNT: u64 = 200;
const POLL_DELAY: Duration = Duration::from_millis(300);
const CLOSE_COUNT: u64 = 1000;

/// Runs the command.
pub fn run(cli: &ConformCli) -> ExitCode {
    let r = if cli.server {
        serve(&cli.addr)
    } else {
        let names: Vec<&str> = if cli.scenarios.is_empty() {
            ALL.to_vec()
        } else {
            cli.scenarios.iter().map(String::as_str).collect()
        };
        names.iter().try_for_each(|n| client(&cli.addr, n))
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmlink conform: {e}");
            ExitCode::from(1)
        }
    }
}

fn options() -> Options {
    Options::default().max_msg_size(MAX_MSG_SIZE_LIMIT)
}

/// Message `seq` of `len` bytes: the sequence number, then a pattern derived from it.
fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (seq as usize).wrapping_mul(131).wrapping_add(i * 7) as u8)
        .collect();
    let n = len.min(8);
    v[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    v
}

fn check(got: &[u8], seq: u64, len: usize, what: &str) -> Result<()> {
    if got.len() != len {
        return Err(RunError::new(format!(
            "{what}: message {seq} has {} bytes, expected {len}",
            got.len()
        )));
    }
    if got != payload(seq, len) {
        return Err(RunError::new(format!(
            "{what}: message {seq} differs from what was sent (order or content)"
        )));
    }
    Ok(())
}

/// Waits until `conn`'s fd is readable — for a connection, "worth calling again", also
/// after a send's `WouldBlock` — or the timeout passes; true if it is.
fn wait_fd(conn: &Connection, timeout: Duration) -> bool {
    poll_fd(
        conn.as_fd(),
        Interest::READABLE,
        Some(Instant::now() + timeout),
    )
    .unwrap_or(false)
}

fn close_size(seq: u64) -> usize {
    1 + (seq as usize * 997) % 20_000
}

/// The client's side of scenario `name` on a fresh connection to `addr`.
fn client(addr: &str, name: &str) -> Result<()> {
    let mut c = Connection::connect(addr, &options()).context(|| format!("connect {addr}"))?;
    let t = c.transport().as_str();
    c.send(name.as_bytes())
        .context(|| format!("{name}: send"))?;
    let what = format!("{name} over {t}");
    let line = match name {
        "echo" => {
            let mut n = 0u64;
            for _ in 0..ECHO_ROUNDS {
                for len in ECHO_SIZES {
                    c.send(&payload(n, len)).context(|| what.clone())?;
                    let got = c.recv_vec().context(|| what.clone())?;
                    check(&got, n, len, &what)?;
                    n += 1;
                }
            }
            c.close().context(|| what.clone())?;
            format!("{n} messages of 1 B - 1 MiB echoed, all verified")
        }
        "flow" => {
            // The server sleeps before reading: a non-blocking sender must meet
            // WouldBlock once the ring is full, wait on the fd, and lose nothing.
            c.set_nonblocking(true);
            let start = Instant::now();
            let (mut seq, mut blocked_at, mut blocks) = (0u64, None, 0u64);
            while seq < FLOW_COUNT {
                match c.send(&payload(seq, FLOW_SIZE)) {
                    Ok(()) => seq += 1,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        blocked_at.get_or_insert((seq, start.elapsed()));
                        blocks += 1;
                        if start.elapsed() > PATIENCE {
                            return Err(RunError::new(format!("{what}: no room for {PATIENCE:?}")));
                        }
                        wait_fd(&c, Duration::from_millis(100));
                    }
                    Err(e) => return Err(RunError::new(format!("{what}: send {seq}: {e}"))),
                }
            }
            let Some((at, when)) = blocked_at else {
                return Err(RunError::new(format!(
                    "{what}: {FLOW_COUNT} messages of {FLOW_SIZE} B never met a full ring"
                )));
            };
            if when >= FLOW_SLEEP {
                return Err(RunError::new(format!(
                    "{what}: the first WouldBlock came after {when:?}, once the receiver woke"
                )));
            }
            c.set_nonblocking(false);
            let answer = c.recv_vec().context(|| what.clone())?;
            let expect = format!("received {FLOW_COUNT}");
            if answer != expect.as_bytes() {
                return Err(RunError::new(format!(
                    "{what}: the receiver answered {:?}",
                    String::from_utf8_lossy(&answer)
                )));
            }
            format!(
                "WouldBlock after {at} of {FLOW_COUNT} messages of {FLOW_SIZE} B while the \
                 receiver slept ({blocks} retries after polling the fd); the receiver verified \
                 all {FLOW_COUNT} in order"
            )
        }
        "poll" => {
            c.set_nonblocking(true);
            match c.recv_vec() {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Ok(_) => {
                    return Err(RunError::new(format!(
                        "{what}: a message before any was sent"
                    )))
                }
                Err(e) => return Err(RunError::new(format!("{what}: first recv: {e}"))),
            }
            let start = Instant::now();
            let (mut seq, mut polls, mut first) = (0u64, 0u64, None);
            while seq < POLL_COUNT {
                match c.recv_vec() {
                    Ok(m) => {
                        first.get_or_insert(start.elapsed());
                        check(&m, seq, 100 + seq as usize, &what)?;
                        seq += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if start.elapsed() > PATIENCE {
                            return Err(RunError::new(format!(
                                "{what}: {seq} of {POLL_COUNT} came"
                            )));
                        }
                        let _ = poll_fd(
                            c.as_fd(),
                            Interest::READABLE,
                            Some(Instant::now() + Duration::from_secs(1)),
                        );
                        polls += 1;
                    }
                    Err(e) => return Err(RunError::new(format!("{what}: recv {seq}: {e}"))),
                }
            }
            let first = first.unwrap_or_default();
            format!(
                "recv WouldBlock before the server sent; {POLL_COUNT} messages received \
                 non-blocking with {polls} poll(2) waits on the fd (first after {:.0} ms), \
                 all verified",
                first.as_secs_f64() * 1e3
            )
        }
        "close-out" => {
            // The server sends and closes: everything arrives, then end of stream.
            for seq in 0..CLOSE_COUNT {
                let m = c.recv_vec().context(|| format!("{what}: recv {seq}"))?;
                check(&m, seq, close_size(seq), &what)?;
            }
            match c.recv_vec() {
                Err(e) if e.kind() == ErrorKind::EndOfStream => {}
                Ok(_) => return Err(RunError::new(format!("{what}: a message after the last"))),
                Err(e) => {
                    return Err(RunError::new(format!(
                        "{what}: after the last message {e} ({:?}), not end of stream",
                        e.kind()
                    )))
                }
            }
            format!(
                "{CLOSE_COUNT} messages the server sent before closing, all verified, then \
                 end of stream"
            )
        }
        "close-in" => {
            for seq in 0..CLOSE_COUNT {
                c.send(&payload(seq, close_size(seq)))
                    .context(|| format!("{what}: send {seq}"))?;
            }
            c.close().context(|| what.clone())?;
            format!("{CLOSE_COUNT} messages sent, then closed (the server checks them)")
        }
        other => return Err(RunError::new(format!("unknown scenario {other:?}"))),
    };
    println!("shmlink conform: {name} ok over {t}: {line}");
    Ok(())
}

/// Serves scenarios on `addr`, one connection at a time, until killed.
fn serve(addr: &str) -> Result<()> {
    let mut l = Listener::bind(addr, &options()).context(|| format!("bind {addr}"))?;
    eprintln!("shmlink conform: serving {}", l.local_addr());
    loop {
        let c = match l.accept() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("shmlink conform: accept on {addr}: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let t = c.transport().as_str();
        match serve_one(c) {
            Ok(line) => eprintln!("shmlink conform: served over {t}: {line}"),
            Err(e) => eprintln!("shmlink conform: client over {t}: {e}"),
        }
    }
}

fn serve_one(mut c: Connection) -> Result<String> {
    let name =
        String::from_utf8_lossy(&c.recv_vec().context(|| "scenario".to_string())?).into_owned();
    let what = name.clone();
    match name.as_str() {
        "echo" => {
            let mut n = 0u64;
            loop {
                match c.recv_vec() {
                    Ok(m) => {
                        c.send(&m).context(|| what.clone())?;
                        n += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::EndOfStream => break,
                    Err(e) => return Err(RunError::new(format!("{what}: {e}"))),
                }
            }
            Ok(format!("echo: {n} messages echoed, then end of stream"))
        }
        "flow" => {
            std::thread::sleep(FLOW_SLEEP);
            for seq in 0..FLOW_COUNT {
                let m = c.recv_vec().context(|| format!("{what}: recv {seq}"))?;
                check(&m, seq, FLOW_SIZE, &what)?;
            }
            c.send(format!("received {FLOW_COUNT}").as_bytes())
                .context(|| what.clone())?;
            let _ = c.close();
            Ok(format!(
                "flow: slept {FLOW_SLEEP:?}, then received {FLOW_COUNT} messages in order, verified"
            ))
        }
        "poll" => {
            std::thread::sleep(POLL_DELAY);
            for seq in 0..POLL_COUNT {
                c.send(&payload(seq, 100 + seq as usize))
                    .context(|| what.clone())?;
            }
            let _ = c.close();
            Ok(format!(
                "poll: sent {POLL_COUNT} messages after {POLL_DELAY:?}"
            ))
        }
        "close-out" => {
            for seq in 0..CLOSE_COUNT {
                c.send(&payload(seq, close_size(seq)))
                    .context(|| what.clone())?;
            }
            c.close().context(|| what.clone())?;
            Ok(format!("close-out: sent {CLOSE_COUNT} messages, closed"))
        }
        "close-in" => {
            for seq in 0..CLOSE_COUNT {
                let m = c.recv_vec().context(|| format!("{what}: recv {seq}"))?;
                check(&m, seq, close_size(seq), &what)?;
            }
            match c.recv_vec() {
                Err(e) if e.kind() == ErrorKind::EndOfStream => Ok(format!(
                    "close-in: {CLOSE_COUNT} messages verified, then end of stream"
                )),
                Ok(_) => Err(RunError::new(format!("{what}: a message after the last"))),
                Err(e) => Err(RunError::new(format!(
                    "{what}: after the last message {e}, not end of stream"
                ))),
            }
        }
        other => Err(RunError::new(format!("unknown scenario {other:?}"))),
    }
}
