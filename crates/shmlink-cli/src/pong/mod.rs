//! `shmlink pong`: runs the server, the client, or both as separate processes, one address
//! after another, and prints a result per address.

pub mod args;
pub mod cli;
mod client;
mod report;
mod server;
pub mod spawn;
mod wire;

use std::io::Write;
use std::os::fd::AsRawFd;

use shmlink::options::MAX_MSG_SIZE_LIMIT;
use shmlink::{ErrorKind, Listener, Options};

use shmlink_measure::size;
use shmlink_measure::sys::pin_to_cpu;
use shmlink_measure::Mode;

use self::args::{Pinning, PongArgs, Role};
use self::report::{RunResult, Table};
use self::spawn::{connect_retry, die_with_parent, ServerProcess, START_TIMEOUT};
use self::wire::Hello;
use crate::error::{Context, Result, RunError};
use crate::listen::{per_client, wait_readable};
use crate::stop::StopSignals;
use crate::wait::Waiting;

/// Runs the command.
pub fn run(args: &PongArgs) -> Result<()> {
    match args.role {
        Role::Server => serve(args),
        Role::Client | Role::Both => run_clients(args),
    }
}

/// Pins this process to its CPU; returns the CPU, if pinned. Only the default pinning
/// tolerates a failure (with a warning).
fn pin(pinning: Pinning, server: bool) -> Result<Option<usize>> {
    let Some(cpu) = pinning.cpu(server) else {
        return Ok(None);
    };
    match pin_to_cpu(cpu) {
        Ok(()) => Ok(Some(cpu)),
        Err(e) if matches!(pinning, Pinning::Auto { .. }) => {
            eprintln!("shmlink pong: warning: cannot pin to CPU {cpu} ({e}); not pinned");
            Ok(None)
        }
        Err(e) => Err(RunError::new(e.to_string())),
    }
}

/// `--server`: serves clients one after another (only one with `--once`).
fn serve(args: &PongArgs) -> Result<()> {
    if let Some(parent) = args.parent_pid {
        die_with_parent(parent)?;
    }
    pin(args.pinning, true)?;
    // Before binding: a SIGTERM from now on ends with the socket file removed.
    let stop = StopSignals::block()?;
    let addr = &args.addrs[0];
    let opts = args.options().max_msg_size(MAX_MSG_SIZE_LIMIT);
    let mut listener = Listener::bind(addr, &opts)?;
    if args.once {
        // The parent waits for this line: it means we listen, and says on which port.
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", listener.local_addr())
            .and_then(|()| out.flush())
            .context(|| "report the bound address".to_string())?;
    } else {
        eprintln!(
            "shmlink pong: serving {} (Ctrl-C to stop)",
            listener.local_addr()
        );
    }
    let fd = listener.as_raw_fd();
    listener.set_nonblocking(true);
    let listener = std::sync::Arc::new(stop.drop_on_signal(listener)?);
    let conns = accept_always(listener.clone(), fd, addr.clone(), args.once)?;
    let served = serve_clients(args, &conns);
    // The accept thread holds the listener too: closed here (its socket file removed),
    // whichever way serving ended; the thread sees it gone and ends.
    drop(listener.lock().take());
    served
}

/// Serves the connections of [`accept_always`] one after another (only one with `--once`).
fn serve_clients(
    args: &PongArgs,
    conns: &std::sync::mpsc::Receiver<shmlink::Result<shmlink::Connection>>,
) -> Result<()> {
    let addr = &args.addrs[0];
    loop {
        let conn = match conns.recv() {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(e).context(|| format!("accept on {addr}")),
            // Stopped by a signal: the signal thread exits the process.
            Err(_) => loop {
                std::thread::park();
            },
        };
        // Which transport the connection ended on (an `auto:` address: upgraded or not).
        let transport = conn.transport();
        match server::serve(conn) {
            Ok(_) if args.once => return Ok(()),
            Err(e) if args.once => return Err(e).context(|| format!("serve on {addr}")),
            Ok(h) => eprintln!(
                "shmlink pong: served a {} run: {} messages of {} bytes, {} (over {})",
                h.mode.name(),
                h.total(),
                h.size,
                if h.one_in == 1 {
                    "all verified".to_string()
                } else {
                    format!(
                        "verified (every byte of 1 in {}, the ends of all)",
                        h.one_in
                    )
                },
                transport.as_str()
            ),
            Err(e) => eprintln!(
                "shmlink pong: client on {addr}: {}",
                crate::error::in_cli_terms(&e.to_string())
            ),
        }
    }
}

/// How many accepted clients may wait while `pong --server` serves another.
const WAITING_CLIENTS: usize = 8;

/// Accepts on `listener` from a thread of its own, for as long as the process serves, and
/// hands the connections over (at most [`WAITING_CLIENTS`] waiting; a fatal accept error
/// ends the stream). The listener is polled while the server is busy with a client, so
/// `shmlink ls` gets its answer (the listener, and the connection it serves with the
/// peer's uid and counters) instead of "not answering" (docs/design.md §6.3);
/// the thread sleeps in `poll` otherwise and costs the run nothing. A client that comes
/// meanwhile has its handshake done and waits for its run, served in order.
fn accept_always(
    listener: std::sync::Arc<crate::stop::DropOnStop<Listener>>,
    fd: std::os::fd::RawFd,
    addr: String,
    once: bool,
) -> Result<std::sync::mpsc::Receiver<shmlink::Result<shmlink::Connection>>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(WAITING_CLIENTS);
    std::thread::Builder::new()
        .name("shmlink-accept".into())
        .spawn(move || loop {
            let accepted = listener.lock().as_mut().map(|l| l.accept());
            match accepted {
                // Stopped by a signal: the listener is gone.
                None => return,
                Some(Ok(c)) => {
                    if tx.send(Ok(c)).is_err() {
                        return;
                    }
                }
                Some(Err(e)) if e.kind() == ErrorKind::WouldBlock => wait_readable(fd),
                Some(Err(e)) if !once && per_client(e.kind()) => eprintln!(
                    "shmlink pong: accept on {addr}: {}",
                    crate::error::in_cli_terms(&e.to_string())
                ),
                Some(Err(e)) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        })
        .map_err(|e| RunError::new(format!("start the accept thread: {e}")))?;
    Ok(rx)
}

/// The client (and, without `--client`, the servers): one run per address.
fn run_clients(args: &PongArgs) -> Result<()> {
    let client_cpu = pin(args.pinning, false)?;
    let mut out = std::io::stdout().lock();
    let mut print = |line: String| {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .context(|| "write to stdout".to_string())
    };
    if !args.json {
        print(describe(args, client_cpu))?;
    }
    let mut table = Table::new(args.mode);
    let mut failed = 0;
    for addr in &args.addrs {
        match run_one(args, addr) {
            Ok(r) if args.json => print(r.to_json())?,
            Ok(r) => print(table.next(&r))?,
            Err(e) => {
                eprintln!(
                    "shmlink pong: {addr}: {}",
                    crate::error::in_cli_terms(&e.to_string())
                );
                failed += 1;
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(RunError::new(format!(
            "{n} of {} runs failed",
            args.addrs.len()
        ))),
    }
}

/// The line that says what is measured and how.
fn describe(args: &PongArgs, client_cpu: Option<usize>) -> String {
    let server_cpu = args.pinning.cpu(true);
    let cpu = |c: Option<usize>| c.map_or("unpinned".to_string(), |c| format!("CPU {c}"));
    let wait = args.options().configured_wait_policy();
    format!(
        "# pong {}: {} messages of {} after {} warm-up{}; client {}, server {}; wait: spin {:?}, yield {:?}{}",
        args.mode.name(),
        args.count,
        match size::exact(args.size) {
            s if s.ends_with('B') => s,
            s => format!("{s} B"),
        },
        args.warmup(),
        if args.mode == Mode::Throughput {
            format!(", window {}", args.window)
        } else {
            String::new()
        },
        cpu(client_cpu),
        cpu(server_cpu),
        wait.spin,
        wait.yield_,
        args.ring_size
            .map_or(String::new(), |r| format!("; ring {}", size::exact(r)))
    )
}

/// One run against `addr`, with a server process of its own unless `--client`.
fn run_one(args: &PongArgs, addr: &str) -> Result<RunResult> {
    let opts: Options = args
        .options()
        .max_msg_size(args.size.max(Options::default().configured_max_msg_size()));
    let mut server = match args.role {
        Role::Both => Some(ServerProcess::start(args, addr)?),
        _ => None,
    };
    let target = server
        .as_ref()
        .map_or(addr, |s| s.addr.as_str())
        .to_string();
    // Our own server listens already (it said so); one started by the user may not yet.
    let budget = match server {
        Some(_) => START_TIMEOUT,
        None => args.wait,
    };
    let mut waiting = Waiting::new("pong", &target, budget);
    let conn = connect_retry(&target, &opts, &mut waiting, || {
        server.as_mut().map_or(Ok(()), |s| s.check_alive())
    })
    .context(|| format!("connect to {target}"))?;
    let hello = Hello {
        version: wire::VERSION,
        mode: args.mode,
        size: args.size as u64,
        count: args.count,
        warmup: args.warmup(),
        window: args.window,
        one_in: args.verify.one_in,
        zero_copy: args.zero_copy,
        seed: shmlink_measure::verify::fresh_seed().map_err(|e| RunError::new(e.to_string()))?,
    };
    let result = client::run(conn, hello)?;
    if let Some(server) = server {
        server.finish()?;
    }
    Ok(result)
}
