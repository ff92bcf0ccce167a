//! Command-line parsing. Every mistake becomes a [`UsageError`] (exit code 2), never a
//! panic.

use std::ffi::OsString;
use std::fmt;

use crate::help::{LS_HELP, PONG_HELP, TOP_HELP};
use crate::ls::{parse_ls, LsArgs};
use crate::pong_args::{default_addrs, default_count, Pinning, PongArgs, Role};
use shmlink_measure::cpus::format_cpu_list;
use shmlink_measure::Mode;

/// Largest message size `-m` accepts (the library's hard limit).
pub const MAX_SIZE: usize = shmlink::MAX_MSG_SIZE_LIMIT;
/// Window in throughput mode when `-w` is not given.
pub const DEFAULT_WINDOW: u64 = 64;
/// Longest wait budget `--spin-us` accepts (10 s).
const MAX_SPIN_US: u64 = 10_000_000;

/// A bad command line.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Splits `--flag=value` into the flag and its inline value; any other argument is a flag
/// whose value, if it takes one, is the next argument.
pub fn split_flag(arg: &str) -> (String, Option<String>) {
    match arg.split_once('=') {
        Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
        _ => (arg.to_string(), None),
    }
}

/// The value of `flag`: its inline value, else the next argument.
pub fn flag_value(
    flag: &str,
    inline: &Option<String>,
    args: &mut impl Iterator<Item = String>,
    what: &str,
) -> Result<String, UsageError> {
    match inline.clone().or_else(|| args.next()) {
        Some(v) => Ok(v),
        None => usage(format!("{flag} needs a value ({what})")),
    }
}

fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Print this text and exit 0.
    Help(&'static str),
    Version,
    Pong(PongArgs),
    Ls(LsArgs),
}

/// Sizes as the measurement core parses and prints them (`64`, `1k`, `1MiB`).
pub use shmlink_measure::size::{exact as format_size, parse as parse_size};

fn parse_positive(flag: &str, text: &str) -> Result<u64, UsageError> {
    match text.parse::<u64>() {
        Ok(0) => usage(format!("{flag} must be at least 1")),
        Ok(n) => Ok(n),
        Err(_) => usage(format!(
            "invalid value {text:?} for {flag} (expected a positive integer)"
        )),
    }
}

/// Parses `--cpus A,B` or `--cpus none` (checked against the allowed CPUs later).
fn parse_cpus(text: &str) -> Result<Pinning, UsageError> {
    if text == "none" {
        return Ok(Pinning::Off);
    }
    let bad = || {
        usage(format!(
            "invalid value {text:?} for --cpus (expected A,B with two CPU numbers, or none)"
        ))
    };
    let Some((a, b)) = text.split_once(',') else {
        return bad();
    };
    let (Ok(client), Ok(server)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) else {
        return bad();
    };
    Ok(Pinning::Cpus { client, server })
}

/// Parses the whole command line (without the program name); `cpus` are the CPUs this
/// process may run on ([`allowed_cpus`]).
pub fn parse(argv: Vec<OsString>, cpus: &[usize]) -> Result<Command, UsageError> {
    let mut argv = argv.into_iter().map(|a| {
        a.into_string()
            .map_err(|a| UsageError(format!("argument {a:?} is not valid UTF-8")))
    });
    let Some(first) = argv.next().transpose()? else {
        return usage("missing command (try 'shmlink --help')");
    };
    match first.as_str() {
        "-h" | "--help" => Ok(Command::Help(TOP_HELP)),
        "-V" | "--version" => Ok(Command::Version),
        "help" => match argv.next().transpose()?.as_deref() {
            None => Ok(Command::Help(TOP_HELP)),
            Some("pong") => Ok(Command::Help(PONG_HELP)),
            Some("ls") => Ok(Command::Help(LS_HELP)),
            Some(other) => usage(format!("no help for unknown command {other:?}")),
        },
        "pong" => parse_pong(argv.collect::<Result<Vec<_>, _>>()?, cpus),
        "ls" => parse_ls(argv.collect::<Result<Vec<_>, _>>()?),
        other => usage(format!("unknown command {other:?} (try 'shmlink --help')")),
    }
}

/// Parses `shmlink pong`'s arguments.
pub fn parse_pong(argv: Vec<String>, cpus: &[usize]) -> Result<Command, UsageError> {
    let mut server = false;
    let mut client = false;
    let mut latency = false;
    let mut json = false;
    let mut once = false;
    let mut shared_dir = false;
    let mut size = None;
    let mut count = None;
    let mut window = None;
    let mut pinning = None;
    let mut ring_size = None;
    let mut spin_us = None;
    let (mut cert, mut key, mut ca) = (None, None, None);
    let mut parent_pid = None;
    let mut addrs = Vec::new();

    let mut args = argv.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            addrs.extend(args.by_ref());
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            addrs.push(arg);
            continue;
        }
        let (flag, inline) = split_flag(&arg);
        let mut value = |what: &str| flag_value(&flag, &inline, &mut args, what);
        let takes_value = matches!(
            flag.as_str(),
            "-m" | "--size"
                | "-n"
                | "--count"
                | "-w"
                | "--window"
                | "--cpus"
                | "--ring-size"
                | "--spin-us"
                | "--cert"
                | "--key"
                | "--ca"
                | "--parent-pid"
        );
        if inline.is_some() && !takes_value {
            return usage(format!("{flag} takes no value"));
        }
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help(PONG_HELP)),
            "--server" => server = true,
            "--client" => client = true,
            "--latency" => latency = true,
            "--json" => json = true,
            "--once" => once = true,
            "--shared-dir" => shared_dir = true,
            "-m" | "--size" => {
                let v = value("SIZE")?;
                let s = parse_size(&v).map_err(|e| UsageError(format!("{flag}: {e}")))?;
                if s > MAX_SIZE {
                    return usage(format!(
                        "{flag} {v}: at most {} bytes per message",
                        format_size(MAX_SIZE)
                    ));
                }
                size = Some(s);
            }
            "-n" | "--count" => count = Some(parse_positive(&flag, &value("COUNT")?)?),
            "-w" | "--window" => window = Some(parse_positive(&flag, &value("WINDOW")?)?),
            "--cpus" => pinning = Some(parse_cpus(&value("A,B or none")?)?),
            "--ring-size" => {
                let v = value("SIZE")?;
                let s = parse_size(&v).map_err(|e| UsageError(format!("{flag}: {e}")))?;
                if let Err(e) = shmlink::Options::default().ring_size(s).validate() {
                    return usage(format!("{flag} {v}: {}", e.message()));
                }
                ring_size = Some(s);
            }
            "--spin-us" => {
                let v = value("microseconds")?;
                match v.parse::<u64>() {
                    Ok(n) if n <= MAX_SPIN_US => spin_us = Some(n),
                    _ => {
                        return usage(format!(
                            "invalid value {v:?} for --spin-us (expected 0..={MAX_SPIN_US})"
                        ))
                    }
                }
            }
            "--cert" => cert = Some(value("FILE")?),
            "--key" => key = Some(value("FILE")?),
            "--ca" => ca = Some(value("FILE")?),
            "--parent-pid" => {
                let v = value("PID")?;
                parent_pid = Some(
                    v.parse::<u32>()
                        .map_err(|_| UsageError(format!("invalid --parent-pid {v:?}")))?,
                );
            }
            _ => {
                return usage(format!(
                    "unknown option {flag:?} (try 'shmlink pong --help')"
                ))
            }
        }
    }

    let role = match (server, client) {
        (true, true) => return usage("--server and --client exclude each other"),
        (true, false) => Role::Server,
        (false, true) => Role::Client,
        (false, false) => Role::Both,
    };
    if role != Role::Server && (once || parent_pid.is_some()) {
        return usage("--once and --parent-pid are internal options of --server");
    }
    let mode = if latency {
        Mode::Latency
    } else {
        Mode::Throughput
    };
    match role {
        Role::Server => {
            let client_only = [
                ("--latency", latency),
                ("-m/--size", size.is_some()),
                ("-n/--count", count.is_some()),
                ("-w/--window", window.is_some()),
                ("--json", json),
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
        Role::Client if addrs.is_empty() => return usage("--client needs at least one ADDR"),
        Role::Client => {}
        Role::Both if addrs.is_empty() => addrs = default_addrs(),
        Role::Both => {}
    }
    for addr in &addrs {
        if let Err(e) = shmlink::Address::parse(addr) {
            return usage(e.to_string());
        }
    }
    if cert.is_some() != key.is_some() {
        return usage("--cert and --key go together");
    }
    if mode == Mode::Latency && window.is_some() {
        return usage("-w/--window applies to throughput mode, not --latency");
    }
    let pinning = match pinning {
        // A server started by `pong` inherited the client's pinning: its own mask says
        // nothing about the machine, the client checked the CPUs already.
        Some(p) if parent_pid.is_some() => p,
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
    let size = size.unwrap_or(64);
    let count = count.unwrap_or_else(|| default_count(mode, size));
    let window = match mode {
        Mode::Latency => 1,
        Mode::Throughput => window.unwrap_or(DEFAULT_WINDOW),
    };
    Ok(Command::Pong(PongArgs {
        role,
        mode,
        size,
        count,
        window,
        pinning,
        json,
        ring_size,
        spin_us,
        shared_dir,
        cert,
        key,
        ca,
        addrs,
        once,
        parent_pid,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pong(args: &str) -> Result<PongArgs, UsageError> {
        let argv = std::iter::once("pong")
            .chain(args.split_whitespace())
            .map(OsString::from)
            .collect();
        match parse(argv, &[0, 1, 2, 3])? {
            Command::Pong(p) => Ok(p),
            other => panic!("not a pong command: {other:?}"),
        }
    }

    fn err(args: &str) -> String {
        pong(args).unwrap_err().0
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        for (text, want) in [
            ("0", 0),
            ("64", 64),
            ("1k", 1024),
            ("1K", 1024),
            ("1KiB", 1024),
            ("4K", 4096),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("64M", 64 << 20),
            ("1G", 1 << 30),
            ("100B", 100),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for text in [
            "",
            "12Q",
            "k",
            "-1",
            "1.5M",
            "1 M",
            "1MiBs",
            "99999999999999999999",
        ] {
            assert!(parse_size(text).is_err(), "{text:?} accepted");
        }
        assert!(parse_size("99999999999G")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn format_size_round_trips() {
        for s in [0, 1, 64, 1000, 1024, 4096, 1 << 20, 3 << 20, 1 << 30] {
            assert_eq!(parse_size(&format_size(s)), Ok(s));
        }
        assert_eq!(format_size(1 << 20), "1MiB");
        assert_eq!(format_size(1536), "1536");
    }

    #[test]
    fn defaults() {
        let p = pong("").unwrap();
        assert_eq!(p.role, Role::Both);
        assert_eq!(p.mode, Mode::Throughput);
        assert_eq!((p.size, p.window, p.count), (64, 64, 500_000));
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
            "--client --latency --size=4k -n 10 --cpus 1,1 --json --ring-size 1M --spin-us 0 shm:a ux:b",
        )
        .unwrap();
        assert_eq!(p.role, Role::Client);
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
        assert_eq!(p.options().get_wait_policy(), shmlink::WaitPolicy::BLOCKING);
        assert_eq!(p.addrs, ["shm:a", "ux:b"]);
        let p = pong("--server --once --parent-pid 7 --cpus none shm:x").unwrap();
        assert_eq!(
            (p.role, p.once, p.parent_pid),
            (Role::Server, true, Some(7))
        );
        assert_eq!(p.pinning, Pinning::Off);
        assert_eq!(pong("-w 8 -- ux:-odd").unwrap().addrs, ["ux:-odd"]);
        let p = pong("--cert c.pem --key k.pem --ca=ca.pem tls:127.0.0.1:0").unwrap();
        let tls = p.options().get_tls().clone();
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
            ("--frobnicate", "unknown option \"--frobnicate\""),
            ("-m 12Q", "invalid size \"12Q\""),
            ("-m 2G", "at most 1GiB"),
            ("-n 0", "-n must be at least 1"),
            ("-n many", "invalid value \"many\" for -n"),
            ("-w 0", "-w must be at least 1"),
            (
                "--cpus 9,99",
                "CPU 9 is not available (nproc: 4; CPUs: 0-3)",
            ),
            ("--cpus 1,4", "CPU 4 is not available"),
            ("--cpus 0", "invalid value \"0\" for --cpus"),
            ("--cpus a,b", "invalid value"),
            ("--ring-size 5000", "power of two"),
            ("--spin-us -1", "--spin-us"),
            ("-m", "-m needs a value"),
            ("--json=yes", "--json takes no value"),
            ("--server --client x", "exclude each other"),
            ("--server", "exactly one ADDR"),
            ("--server shm:a shm:b", "exactly one ADDR"),
            ("--server -m 64 a", "-m/--size is a client option"),
            ("--client", "at least one ADDR"),
            ("--latency -w 4", "throughput mode"),
            ("--once", "internal"),
            ("--cert c.pem tls:h:1", "--cert and --key go together"),
            ("--ca", "--ca needs a value"),
            ("foo:bar", "unknown transport \"foo\""),
            ("shm:ok tcp:nohost", "invalid address \"tcp:nohost\""),
        ] {
            let e = err(args);
            assert!(e.contains(needle), "{args:?}: {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn top_level() {
        let parse = |args: &[&str]| parse(args.iter().map(OsString::from).collect(), &[0]);
        assert_eq!(parse(&["--help"]), Ok(Command::Help(TOP_HELP)));
        assert_eq!(parse(&["help", "pong"]), Ok(Command::Help(PONG_HELP)));
        assert_eq!(parse(&["help", "ls"]), Ok(Command::Help(LS_HELP)));
        assert_eq!(parse(&["ls", "--help"]), Ok(Command::Help(LS_HELP)));
        assert_eq!(parse(&["pong", "-h"]), Ok(Command::Help(PONG_HELP)));
        assert_eq!(parse(&["-V"]), Ok(Command::Version));
        assert!(parse(&[]).unwrap_err().0.contains("missing command"));
        assert!(parse(&["bong"]).unwrap_err().0.contains("unknown command"));
        let e = parse(&["pong", "--cpus", "0,1"]).unwrap_err();
        assert!(e.0.contains("CPU 1 is not available"), "{e}");
        let Ok(Command::Pong(p)) = parse(&["pong"]) else {
            panic!()
        };
        assert_eq!(p.pinning, Pinning::Off, "one CPU: no default pinning");
        let Ok(Command::Pong(p)) = parse(&[
            "pong",
            "--server",
            "--parent-pid",
            "1",
            "--cpus",
            "0,5",
            "shm:x",
        ]) else {
            panic!()
        };
        assert_eq!(
            p.pinning,
            Pinning::Cpus {
                client: 0,
                server: 5
            },
            "a child trusts its parent"
        );
    }
}
