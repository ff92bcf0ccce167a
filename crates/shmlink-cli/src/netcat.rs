//! `shmlink send` and `shmlink recv`: netcat for messages. `send` turns stdin lines (or
//! NUL-separated records, or whole files) into messages on one connection; `recv`
//! prints each message it receives, one per line (or NUL-terminated), until the end of
//! the stream.

use std::io::{self, BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use shmlink::{Connection, ErrorKind, Listener};

use crate::args::{parse_addr, parse_msg_size, parse_positive, ConnFlags};
use crate::error::in_cli_terms;
use crate::listen::next_client;
use crate::stop::StopSignals;
use crate::wait::{WaitFlags, Waiting};

const SEND_LONG: &str = "\
Send messages on one connection to ADDR: each line of stdin becomes one message (its
newline stripped), or with -0 each NUL-terminated record; with FILEs, each file becomes
one message (`-` is stdin, whole). Connects to ADDR (retried while nobody listens yet, for
up to --wait seconds), or with --listen binds ADDR and sends to the first peer that
connects. Closes the connection gracefully at the end: the receiver gets every message,
then the end of the stream.";

const RECV_LONG: &str = "\
Receive messages on one connection and print each on stdout followed by a newline, or
by a NUL byte with the -0 option, for messages that may contain newlines (as `xargs -0`
reads them).
Binds ADDR and takes the first peer that connects (the bound address is printed on stderr:
`recv tcp:127.0.0.1:0` picks a free port), or with --connect connects to ADDR. Exits 0 at
the end of the stream (the sender closed) or after -n messages. With --keep, serves one
sender after another (the listener stays, `shmlink ls` shows it) until Ctrl-C, SIGTERM or
-n messages in all.";

const COMMON_AFTER: &str = "\
Addresses: shm:NAME (a bare NAME means shm:NAME), shm:/path.sock, shm:@name, ux:NAME,
ux:/path, tcp:HOST:PORT, tls:HOST:PORT (with --cert/--key on the listening side, --ca on the connecting side),
auto:HOST:PORT (TCP, or TLS with the same flags, upgraded to shm on the same kernel),
vm:NAME[@REGION] (a region shared between QEMU guests and their host, docs/vms.md).

Exit status: 0 on success, 1 if the connection or a message failed, 2 on bad arguments.";

/// `shmlink send`'s arguments.
#[derive(Args, Debug)]
#[command(
    args_override_self = true,
    about = "Send stdin lines or files as messages to ADDR",
    long_about = SEND_LONG,
    after_long_help = COMMON_AFTER
)]
pub struct SendCli {
    /// Bind ADDR and send to the first peer that connects, instead of connecting
    #[arg(short = 'l', long)]
    listen: bool,
    /// Split stdin at NUL bytes instead of newlines
    #[arg(short = '0', long = "null")]
    null: bool,
    #[command(flatten)]
    common: Common,
    /// The address to connect to (or bind, with --listen)
    #[arg(value_name = "ADDR", value_parser = parse_addr)]
    addr: String,
    /// Files to send, one message each (`-`: stdin); without FILE, stdin line by line
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
}

impl SendCli {
    /// `-v`.
    pub fn verbose(&self) -> bool {
        self.common.verbose
    }
}

/// `shmlink recv`'s arguments.
#[derive(Args, Debug)]
#[command(
    args_override_self = true,
    about = "Print the messages received on ADDR",
    long_about = RECV_LONG,
    after_long_help = COMMON_AFTER
)]
pub struct RecvCli {
    /// Connect to ADDR instead of binding it
    #[arg(short = 'c', long)]
    connect: bool,
    /// End each message with a NUL byte instead of a newline
    #[arg(short = '0', long = "null")]
    null: bool,
    /// Stop after N messages
    #[arg(short = 'n', long = "count", value_name = "N", value_parser = parse_positive)]
    count: Option<u64>,
    /// Keep listening after a connection ends: serve senders one after another until
    /// Ctrl-C (SIGINT or SIGTERM, exit 0) or -n messages in all
    #[arg(short = 'k', long, conflicts_with = "connect")]
    keep: bool,
    #[command(flatten)]
    common: Common,
    /// The address to bind (or connect to, with --connect)
    #[arg(value_name = "ADDR", value_parser = parse_addr)]
    addr: String,
}

impl RecvCli {
    /// `-v`.
    pub fn verbose(&self) -> bool {
        self.common.verbose
    }
}

/// What `send` and `recv` share.
#[derive(Args, Debug)]
struct Common {
    /// Largest message, on both ends (suffixes k, M, G) [default: the library's, 64MiB]
    #[arg(short = 'm', long = "max-size", value_name = "SIZE", value_parser = parse_msg_size)]
    max_size: Option<usize>,
    /// Say on stderr which peer connected and the transport the connection really uses
    /// (an auto: connection says whether it was upgraded to shm), and print the library's
    /// events: accepts, refusals with their reasons (SHMLINK_LOG=LEVEL for more, or for
    /// any command)
    #[arg(short = 'v', long)]
    verbose: bool,
    #[command(flatten)]
    wait: WaitFlags,
    #[command(flatten)]
    conn: ConnFlags,
}

impl Common {
    fn options(&self) -> shmlink::Options {
        let opts = self.conn.options();
        match self.max_size {
            Some(m) => opts.max_msg_size(m),
            None => opts,
        }
    }
}

/// Prints `what: e` as `shmlink CMD: …` and returns exit code 1.
fn fail(cmd: &str, what: impl std::fmt::Display) -> ExitCode {
    eprintln!("shmlink {cmd}: {}", in_cli_terms(&what.to_string()));
    ExitCode::from(1)
}

/// Connects to `addr`, retrying while nobody listens yet (as `wait` says); the error
/// names the address, and how long was waited when nobody listened.
pub fn connect_retry(
    cmd: &str,
    addr: &str,
    opts: &shmlink::Options,
    wait: &WaitFlags,
) -> Result<Connection, String> {
    let mut waiting = Waiting::new(cmd, addr, wait.budget());
    loop {
        match Connection::connect(addr, opts) {
            Ok(c) => return Ok(c),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                if !waiting.again() {
                    return Err(format!("{addr}: {e} {}", waiting.gave_up()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("{addr}: {e}")),
        }
    }
}

/// Binds `addr`, says where on stderr, and takes the first peer.
fn accept_one(cmd: &str, addr: &str, opts: &shmlink::Options) -> shmlink::Result<Connection> {
    let mut listener = Listener::bind(addr, opts)?;
    eprintln!("shmlink {cmd}: listening on {}", listener.local_addr());
    listener.accept()
}

/// The connection `send`/`recv` asked for; the error names the address.
fn open(cmd: &str, listen: bool, addr: &str, common: &Common) -> Result<Connection, String> {
    let opts = common.options();
    let conn = if listen {
        accept_one(cmd, addr, &opts).map_err(|e| format!("{addr}: {e}"))?
    } else {
        connect_retry(cmd, addr, &opts, &common.wait)?
    };
    if common.verbose {
        say_connected(cmd, listen, addr, &conn);
    }
    Ok(conn)
}

/// `-v`: which peer, over which transport (what an auto: address settled on).
fn say_connected(cmd: &str, listen: bool, addr: &str, conn: &Connection) {
    let transport = conn.transport();
    if listen {
        eprintln!(
            "shmlink {cmd}: accepted {} over {transport}",
            conn.peer_addr()
        );
    } else {
        eprintln!("shmlink {cmd}: connected to {addr} over {transport}");
    }
}

/// Runs `shmlink send`.
pub fn send(args: &SendCli) -> ExitCode {
    let mut conn = match open("send", args.listen, &args.addr, &args.common) {
        Ok(c) => c,
        Err(e) => return fail("send", e),
    };
    let mut sent = 0u64;
    let mut put = |msg: &[u8], what: &dyn std::fmt::Display| {
        conn.send(msg)
            .map(|()| sent += 1)
            .map_err(|e| format!("send {what} ({} bytes) to {}: {e}", msg.len(), args.addr))
    };
    let result = if args.files.is_empty() {
        let sep = if args.null { 0 } else { b'\n' };
        for_each_record(io::stdin().lock(), sep, |n, msg| {
            put(msg, &format_args!("message #{n}"))
        })
    } else {
        args.files.iter().try_for_each(|f| {
            let body = if f.as_os_str() == "-" {
                let mut b = Vec::new();
                io::stdin().read_to_end(&mut b).map(|_| b)
            } else {
                std::fs::read(f)
            };
            let body = body.map_err(|e| format!("read {}: {e}", f.display()))?;
            put(&body, &f.display())
        })
    };
    if let Err(e) = result {
        return fail("send", e);
    }
    match conn.close() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(
            "send",
            format_args!("close {} after {sent} messages: {e}", args.addr),
        ),
    }
}

/// Calls `f` with each record of `input` ended by `sep` (the last one may lack it), the
/// separator stripped, numbered from 0; stops at the first error.
pub fn for_each_record(
    mut input: impl BufRead,
    sep: u8,
    mut f: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut buf = Vec::new();
    for n in 0.. {
        buf.clear();
        let got = input
            .read_until(sep, &mut buf)
            .map_err(|e| format!("read stdin: {e}"))?;
        if got == 0 {
            break;
        }
        if buf.last() == Some(&sep) {
            buf.pop();
        }
        f(n, &buf)?;
    }
    Ok(())
}

/// Writes `msg` and `sep` to `out` and flushes: a reader sees each message as it comes.
/// `Ok(false)` if the reader went away (a closed pipe: `| head`).
pub fn print_record(out: &mut impl Write, msg: &[u8], sep: u8) -> io::Result<bool> {
    let res = out
        .write_all(msg)
        .and_then(|()| out.write_all(&[sep]))
        .and_then(|()| out.flush());
    match res {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs `shmlink recv`.
pub fn recv(args: &RecvCli) -> ExitCode {
    if args.keep {
        return recv_keep(args);
    }
    let mut conn = match open("recv", !args.connect, &args.addr, &args.common) {
        Ok(c) => c,
        Err(e) => return fail("recv", e),
    };
    let mut out = io::stdout().lock();
    let mut received = 0u64;
    let result = print_messages(args, &mut conn, &mut out, &mut received);
    let _ = conn.close();
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail("recv", e),
    }
}

/// Why [`print_messages`] stopped early.
enum PrintError {
    /// The connection failed (the next sender may do better).
    Conn(String),
    /// stdout failed: nothing more can be printed.
    Stdout(String),
}

impl std::fmt::Display for PrintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrintError::Conn(e) | PrintError::Stdout(e) => f.write_str(e),
        }
    }
}

/// Prints the messages of `conn` until its end of stream, `-n` messages in all
/// (counted in `received`) or a closed stdout; `Ok(false)` when nothing more is wanted.
fn print_messages(
    args: &RecvCli,
    conn: &mut Connection,
    out: &mut impl Write,
    received: &mut u64,
) -> Result<bool, PrintError> {
    let sep = if args.null { 0 } else { b'\n' };
    loop {
        if matches!(args.count, Some(n) if *received >= n) {
            return Ok(false);
        }
        let msg = match conn.recv_vec() {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::EndOfStream => return Ok(true),
            Err(e) => {
                return Err(PrintError::Conn(format!(
                    "{} after {received} messages: {e}",
                    args.addr
                )))
            }
        };
        *received += 1;
        match print_record(out, &msg, sep) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => return Err(PrintError::Stdout(format!("write stdout: {e}"))),
        }
    }
}

/// `recv --keep`: one sender after another on one listener, until a signal (which
/// removes the socket and exits 0) or `-n` messages.
fn recv_keep(args: &RecvCli) -> ExitCode {
    let stop = match StopSignals::block() {
        Ok(s) => s,
        Err(e) => return fail("recv", e),
    };
    let addr = &args.addr;
    let mut listener = match Listener::bind(addr, &args.common.options()) {
        Ok(l) => l,
        Err(e) => return fail("recv", format_args!("{addr}: {e}")),
    };
    eprintln!("shmlink recv: listening on {}", listener.local_addr());
    let fd = listener.as_raw_fd();
    listener.set_nonblocking(true);
    let listener = match stop.drop_on_signal(listener) {
        Ok(l) => l,
        Err(e) => return fail("recv", e),
    };
    let mut out = io::stdout().lock();
    let mut received = 0u64;
    loop {
        let mut conn = match next_client(&listener, fd, "recv", addr, true) {
            Ok(c) => c,
            Err(e) => return fail("recv", format_args!("accept on {addr}: {e}")),
        };
        if args.common.verbose {
            say_connected("recv", true, addr, &conn);
        }
        // One sender failing is its own business: the next one is served.
        let more = match print_messages(args, &mut conn, &mut out, &mut received) {
            Ok(more) => more,
            Err(e @ PrintError::Stdout(_)) => return fail("recv", e),
            Err(PrintError::Conn(e)) => {
                eprintln!("shmlink recv: {}", in_cli_terms(&e));
                true
            }
        };
        let _ = conn.close();
        if !more {
            return ExitCode::SUCCESS;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Command};

    fn records(input: &[u8], sep: u8) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for_each_record(input, sep, |_, r| {
            out.push(r.to_vec());
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn records_are_split_and_stripped() {
        assert_eq!(records(b"a\nbb\n\nc", b'\n'), [&b"a"[..], b"bb", b"", b"c"]);
        assert_eq!(records(b"a\n", b'\n'), [b"a"]);
        assert!(records(b"", b'\n').is_empty());
        assert_eq!(records(b"x\ny\0z\0", 0), [&b"x\ny"[..], b"z"]);
    }

    #[test]
    fn arguments() {
        let p = |args: &str| {
            let argv = ["shmlink"].into_iter().chain(args.split_whitespace());
            parse(argv).map(|c| c.command).map_err(|e| e.to_string())
        };
        let Ok(Command::Send(s)) = p("send -l -0 -m64k tcp:127.0.0.1:0 a b") else {
            panic!()
        };
        assert!(s.listen && s.null);
        assert_eq!(s.common.max_size, Some(64 << 10));
        assert_eq!(s.files, [PathBuf::from("a"), PathBuf::from("b")]);
        let Ok(Command::Recv(r)) = p("recv -c -n3 --wait 1 shm:x") else {
            panic!()
        };
        assert!(r.connect && r.count == Some(3) && r.common.wait.wait == 1);
        assert!(p("recv").unwrap_err().contains("required arguments"));
        assert!(p("recv -n 0 shm:x").unwrap_err().contains("at least 1"));
        assert!(p("send foo:bar").unwrap_err().contains("unknown transport"));
        assert!(p("recv shm:x extra")
            .unwrap_err()
            .contains("unexpected argument"));
    }
}
