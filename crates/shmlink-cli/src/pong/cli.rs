//! `shmlink pong`'s command line: the clap arguments and the checks between them, ending
//! in a [`PongArgs`] with the defaults applied.

use clap::{Args, ValueEnum};

use super::args::{default_addrs, default_count, Pinning, PongArgs, Role};
use crate::args::{parse_addr, parse_msg_size, parse_positive, parse_size, ConnFlags};
use shmlink_measure::cpus::format_cpu_list;
use shmlink_measure::verify::Sampling;
use shmlink_measure::Mode;

/// Window in throughput mode when `-w` is not given.
pub const DEFAULT_WINDOW: u64 = 64;
/// Longest wait budget `--spin-us` accepts (10 s).
const MAX_SPIN_US: u64 = 10_000_000;

const PONG_LONG: &str = "\
Measure round-trip latency or streaming throughput between two processes.

Without --server or --client, pong runs both ends: for each ADDR it starts a server as a
separate process (this program re-executed with --server; it dies with this one), runs
the client against it, and prints one row per ADDR.";

const PONG_AFTER: &str = "\
Addresses: shm:NAME (a bare NAME means shm:NAME), shm:/path.sock, shm:@name, ux:NAME,
ux:/path, tcp:HOST:PORT, tls:HOST:PORT, auto:HOST:PORT (TCP, or TLS with --cert/--key/--ca, upgraded to shm when
both ends share a kernel and the rendezvous directory; the transport column says which),
vm:NAME[@REGION] (a region shared between QEMU guests and their host, docs/vms.md).
Without ADDR both ends run on shm:pong-PID ux:pong-PID tcp:127.0.0.1:0 (port 0, also on
tls: and auto:: the server picks a free port and tells the client).

Rendezvous directory (shm:NAME: $SHMLINK_DIR, else $XDG_RUNTIME_DIR/shmlink, else
/tmp/shmlink-UID): refused when it is a symbolic link, belongs to another uid than this
one or root, or other users may write it, because they could replace its sockets (unless
the --shared-dir option says it is shared on purpose).

Every message is verified: it carries its sequence number at both ends, which the
receiver checks, and a 64-bit checksum over the whole payload; messages under 16 bytes are
compared byte for byte (a 1-byte message carries the low byte of the sequence number). A
mismatch aborts the run. With --verify sample (the default, as shmlink-bench) the receiver
recomputes the checksum of the first messages (two laps of a 1 MiB ring) and of one
measured message in 16 chosen at random (neither the transport nor the library can tell
which); a round trip whose messages were checksummed is not timed, so the times are the
transport's. In latency mode with copied messages each end checks a message while the
other end works on the next one (one round trip late, off the round trip's path). With
--verify all every byte of every message is checksummed and every round trip is timed
with its checks.
CPU per message is user + system time (getrusage) of each process over the measured
part, divided by COUNT (per round trip in latency mode); the server reports its own.

Exit status: 0 on success, 1 if a run failed, 2 on bad arguments.";

/// `shmlink pong`'s arguments as given.
#[derive(Args, Debug)]
#[command(
    args_override_self = true,
    about = "Measure latency and throughput between two processes",
    long_about = PONG_LONG,
    after_long_help = PONG_AFTER
)]
pub struct PongCli {
    /// Serve ADDR (exactly one) until stopped, one client after another; the run's
    /// parameters come from each client. SIGTERM or SIGINT (Ctrl-C) removes the socket
    /// file and exits 0
    #[arg(long, conflicts_with = "client", help_heading = "Roles")]
    server: bool,
    /// Run against servers already listening on each ADDR (connecting is retried while
    /// nobody listens yet: --wait, --no-wait)
    #[arg(long, help_heading = "Roles")]
    client: bool,
    #[command(flatten)]
    wait: crate::wait::WaitFlags,

    /// One message in flight: the client sends, the server answers with a message of the
    /// same size; prints round-trip percentiles (p50, p90, p99, p99.9, max) over COUNT
    /// messages after a warm-up. Without it, throughput: the client streams COUNT
    /// messages keeping at most WINDOW unacknowledged (acknowledged cumulatively every
    /// WINDOW/2 messages); prints messages/s and bytes/s
    #[arg(long, help_heading = "Measurement")]
    latency: bool,
    /// Bytes per message [default: 64]; suffixes are binary: 1k = 1K = 1KiB = 1024,
    /// 1M = 1MiB, 1G = 1GiB; at most 1GiB
    #[arg(short = 'm', long, value_name = "SIZE", value_parser = parse_msg_size, help_heading = "Measurement")]
    size: Option<usize>,
    /// Measured messages [default: latency min(20000, max(50, 1GiB/SIZE)), throughput
    /// min(500000, max(100, 4GiB/SIZE))]; a warm-up of min(1000, COUNT/10) messages goes
    /// before them and is not measured
    #[arg(short = 'n', long, value_name = "N", value_parser = parse_positive, help_heading = "Measurement")]
    count: Option<u64>,
    /// Messages in flight in throughput mode [default: 64]
    #[arg(short = 'w', long, value_name = "N", value_parser = parse_positive, help_heading = "Measurement")]
    window: Option<u64>,
    /// Pin the client to CPU A and the server to CPU B (A = B measures same-core);
    /// `none` does not pin [default: the first two allowed CPUs when there are at least
    /// 2, else none]
    #[arg(long, value_name = "A,B|none", value_parser = parse_cpus, help_heading = "Measurement")]
    cpus: Option<Pinning>,
    /// Ring bytes per direction for shm: (power of two, 4KiB..1GiB) [default: the
    /// library's, 256KiB]
    #[arg(long, value_name = "SIZE", value_parser = parse_ring_size, help_heading = "Measurement")]
    ring_size: Option<usize>,
    /// How long a waiting end busy-polls, and then yields, before it sleeps (both budgets
    /// N microseconds, at most 10000000); 0 = always sleep [default: the library's, 20 us
    /// spin + 30 us yield]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=MAX_SPIN_US), help_heading = "Measurement")]
    spin_us: Option<u64>,
    /// Print one JSON object per run, one per line, with the fields transport, size,
    /// count, window, rtt_ns {p50,p90,p99,p999,max}, msgs_per_s, bytes_per_s,
    /// cpu_us_per_msg {client,server} (latency fields null in throughput mode and the
    /// other way round; window is 1 in latency mode)
    #[arg(long, help_heading = "Measurement")]
    json: bool,
    /// Which messages are checksummed in full (every message has its length and
    /// sequence numbers checked): `sample` one measured message in 16, at random, and
    /// those round trips are not timed; `all` every message, timed with the checks
    #[arg(long, value_enum, default_value_t = Verify::Sample, help_heading = "Measurement")]
    verify: Verify,
    /// Both ends write each message in place (reserve/commit) and read it where it
    /// arrived (recv_ref; a message in the peer's memory is still copied once before it
    /// is checked), as shmlink-bench's -zc rows; without it send and recv, which copy,
    /// as its main rows and examples/pingpong (messages under 8 bytes always go in
    /// place: the run's 8-byte control messages must fit the receiver's buffer)
    #[arg(long, help_heading = "Measurement")]
    zero_copy: bool,

    #[command(flatten)]
    conn: ConnFlags,

    /// Internal: serve one client, print the bound address on stdout first.
    #[arg(long, hide = true)]
    once: bool,
    /// Internal: die with this process.
    #[arg(long, value_name = "PID", hide = true)]
    parent_pid: Option<u32>,

    /// Addresses to measure, in order
    #[arg(value_name = "ADDR", value_parser = parse_addr)]
    addrs: Vec<String>,
}

/// `--verify`: which messages the receiver checksums in full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Verify {
    Sample,
    All,
}

/// Parses `--cpus A,B` or `--cpus none` (checked against the allowed CPUs later).
fn parse_cpus(text: &str) -> Result<Pinning, String> {
    if text == "none" {
        return Ok(Pinning::Off);
    }
    let bad = || format!("{text:?}: expected A,B with two CPU numbers, or none");
    let (a, b) = text.split_once(',').ok_or_else(bad)?;
    match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
        (Ok(client), Ok(server)) => Ok(Pinning::Cpus { client, server }),
        _ => Err(bad()),
    }
}

/// A ring size the library accepts.
fn parse_ring_size(text: &str) -> Result<usize, String> {
    let s = parse_size(text)?;
    shmlink::Options::default()
        .ring_size(s)
        .validate()
        .map_err(|e| e.message().to_string())?;
    Ok(s)
}

impl PongCli {
    /// The run's arguments with defaults applied; `cpus` are the CPUs this process may
    /// run on. Checks what clap cannot: which options go with which role and mode.
    pub fn into_args(self, cpus: &[usize]) -> Result<PongArgs, String> {
        let usage = |msg: String| Err(msg);
        let role = match (self.server, self.client) {
            (true, _) => Role::Server,
            (false, true) => Role::Client,
            (false, false) => Role::Both,
        };
        if role != Role::Server && (self.once || self.parent_pid.is_some()) {
            return usage("--once and --parent-pid are internal options of --server".into());
        }
        let mode = if self.latency {
            Mode::Latency
        } else {
            Mode::Throughput
        };
        let mut addrs = self.addrs;
        match role {
            Role::Server => {
                let client_only = [
                    ("--latency", self.latency),
                    ("-m/--size", self.size.is_some()),
                    ("-n/--count", self.count.is_some()),
                    ("-w/--window", self.window.is_some()),
                    ("--json", self.json),
                    ("--verify", self.verify != Verify::Sample),
                    ("--zero-copy", self.zero_copy),
                ];
                if let Some((name, _)) = client_only.iter().find(|(_, given)| *given) {
                    return usage(format!(
                        "{name} is a client option: a server takes each run's parameters from its client"
                    ));
                }
                if addrs.len() != 1 {
                    return usage(format!(
                        "--server needs exactly one ADDR, got {}",
                        addrs.len()
                    ));
                }
            }
            Role::Client if addrs.is_empty() => {
                return usage("--client needs at least one ADDR".into())
            }
            Role::Client => {}
            Role::Both if addrs.is_empty() => addrs = default_addrs(),
            Role::Both => {}
        }
        if mode == Mode::Latency && self.window.is_some() {
            return usage("-w/--window applies to throughput mode, not --latency".into());
        }
        let pinning = match self.cpus {
            // A server started by `pong` inherited the client's pinning: its own mask says
            // nothing about the machine, the client checked the CPUs already.
            Some(p) if self.parent_pid.is_some() => p,
            Some(Pinning::Cpus { client, server }) => {
                if let Some(cpu) = [client, server].into_iter().find(|c| !cpus.contains(c)) {
                    return usage(format!(
                        "--cpus {client},{server}: CPU {cpu} is not available (nproc: {}; CPUs: {})",
                        cpus.len(),
                        format_cpu_list(cpus)
                    ));
                }
                Pinning::Cpus { client, server }
            }
            Some(p) => p,
            None => match cpus {
                [client, server, ..] => Pinning::Auto {
                    client: *client,
                    server: *server,
                },
                _ => Pinning::Off,
            },
        };
        let size = self.size.unwrap_or(64);
        let count = self.count.unwrap_or_else(|| default_count(mode, size));
        let window = match mode {
            Mode::Latency => 1,
            Mode::Throughput => self.window.unwrap_or(DEFAULT_WINDOW),
        };
        Ok(PongArgs {
            role,
            mode,
            size,
            count,
            window,
            verify: match self.verify {
                Verify::Sample => Sampling::DEFAULT,
                Verify::All => Sampling::ALL,
            },
            zero_copy: self.zero_copy,
            pinning,
            json: self.json,
            ring_size: self.ring_size,
            spin_us: self.spin_us,
            shared_dir: self.conn.shared_dir,
            users: self.conn.users,
            cert: self.conn.cert,
            key: self.conn.key,
            ca: self.conn.ca,
            addrs,
            wait: self.wait.budget(),
            once: self.once,
            parent_pid: self.parent_pid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Command};

    /// `shmlink pong ARGS` on a machine with CPUs 0-3.
    fn pong(args: &str) -> Result<PongArgs, String> {
        let argv = ["shmlink", "pong"]
            .into_iter()
            .chain(args.split_whitespace());
        let cli = parse(argv).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Pong(p) => p.into_args(&[0, 1, 2, 3]).map_err(|e| e.to_string()),
            other => panic!("not a pong command: {other:?}"),
        }
    }

    fn err(args: &str) -> String {
        pong(args).unwrap_err()
    }

    #[test]
    fn defaults() {
        let p = pong("").unwrap();
        assert_eq!(p.role, Role::Both);
        assert_eq!(p.mode, Mode::Throughput);
        assert_eq!((p.size, p.window, p.count), (64, 64, 500_000));
        assert_eq!(p.verify, Sampling::DEFAULT);
        assert!(!p.zero_copy);
        assert_eq!(p.addrs.len(), 3);
        assert_eq!(
            p.pinning,
            Pinning::Auto {
                client: 0,
                server: 1
            }
        );
        let p = pong("--latency -m 1M tcp:127.0.0.1:0").unwrap();
        assert_eq!((p.window, p.count, p.warmup()), (1, 1024, 102));
        assert_eq!(p.addrs, ["tcp:127.0.0.1:0"]);
        assert_eq!(pong("--latency -m 64M").unwrap().count, 50);
        assert_eq!(pong("--latency").unwrap().count, 20_000);
        assert_eq!(pong("--latency -n 100000").unwrap().warmup(), 1000);
    }

    #[test]
    fn every_option() {
        let p = pong(
            "--client --latency --size=4k -n 10 --cpus 1,1 --json --ring-size 1M --spin-us 0 --verify all --zero-copy shm:a ux:b",
        )
        .unwrap();
        assert_eq!(p.role, Role::Client);
        assert_eq!(p.verify, Sampling::ALL);
        assert!(p.zero_copy);
        assert_eq!((p.size, p.count), (4096, 10));
        assert_eq!(
            p.pinning,
            Pinning::Cpus {
                client: 1,
                server: 1
            }
        );
        assert!(p.json);
        assert_eq!(p.ring_size, Some(1 << 20));
        assert_eq!(
            p.options().configured_wait_policy(),
            shmlink::WaitPolicy::BLOCKING
        );
        assert_eq!(p.addrs, ["shm:a", "ux:b"]);
        let p = pong("--server --once --parent-pid 7 --cpus none shm:x").unwrap();
        assert_eq!(
            (p.role, p.once, p.parent_pid),
            (Role::Server, true, Some(7))
        );
        assert_eq!(p.pinning, Pinning::Off);
        assert_eq!(pong("-w 8 -- ux:-odd").unwrap().addrs, ["ux:-odd"]);
        let p = pong("--cert c.pem --key k.pem --ca=ca.pem tls:127.0.0.1:0").unwrap();
        let tls = p.options().configured_tls().clone();
        assert_eq!(
            tls,
            shmlink::TlsOptions::new()
                .cert(shmlink::Pem::file("c.pem"))
                .key(shmlink::Pem::file("k.pem"))
                .ca(shmlink::Pem::file("ca.pem"))
        );
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for (args, needle) in [
            ("--frobnicate", "unexpected argument '--frobnicate'"),
            ("-m 12Q", "invalid size \"12Q\""),
            ("-m 2G", "at most 1GiB"),
            ("-n 0", "must be at least 1"),
            ("-n many", "invalid value 'many' for '--count <N>'"),
            (
                "-w 0",
                "invalid value '0' for '--window <N>': must be at least 1",
            ),
            (
                "--cpus 9,99",
                "CPU 9 is not available (nproc: 4; CPUs: 0-3)",
            ),
            ("--cpus 1,4", "CPU 4 is not available"),
            ("--cpus 0", "invalid value '0' for '--cpus <A,B|none>'"),
            ("--cpus a,b", "invalid value"),
            ("--ring-size 5000", "power of two"),
            ("--spin-us -1", "unexpected argument '-1'"),
            ("-m", "a value is required for '--size <SIZE>'"),
            ("--json=yes", "unexpected value 'yes' for '--json'"),
            (
                "--server --client shm:x",
                "'--server' cannot be used with '--client'",
            ),
            ("--server", "exactly one ADDR"),
            ("--server shm:a shm:b", "exactly one ADDR"),
            ("--server -m 64 shm:a", "-m/--size is a client option"),
            ("--client", "at least one ADDR"),
            ("--latency -w 4", "throughput mode"),
            ("--once", "internal"),
            (
                "--cert c.pem tls:h:1",
                "required arguments were not provided:\n  --key <FILE>",
            ),
            ("--ca", "a value is required for '--ca <FILE>'"),
            ("foo:bar", "unknown transport \"foo\""),
            ("shm:ok tcp:nohost", "invalid address \"tcp:nohost\""),
        ] {
            let e = err(args);
            assert!(e.contains(needle), "{args:?}: {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn attached_and_inline_values() {
        let p = pong("-m64 -n10 -w8 --window=4 --size=1k").unwrap();
        assert_eq!((p.size, p.count, p.window), (1024, 10, 4));
        let p = pong("--latency -m4k").unwrap();
        assert_eq!(p.size, 4096);
    }

    #[test]
    fn cpus_are_checked_against_the_machine() {
        let parse1 = |args: &str| {
            let argv = ["shmlink", "pong"]
                .into_iter()
                .chain(args.split_whitespace());
            match parse(argv).unwrap().command {
                Command::Pong(p) => p.into_args(&[0]).map_err(|e| e.to_string()),
                other => panic!("{other:?}"),
            }
        };
        let e = parse1("--cpus 0,1").unwrap_err();
        assert!(e.contains("CPU 1 is not available"), "{e}");
        assert_eq!(
            parse1("").unwrap().pinning,
            Pinning::Off,
            "one CPU: no default pinning"
        );
        assert_eq!(
            parse1("--server --parent-pid 1 --cpus 0,5 shm:x")
                .unwrap()
                .pinning,
            Pinning::Cpus {
                client: 0,
                server: 5
            },
            "a child trusts its parent"
        );
    }
}
