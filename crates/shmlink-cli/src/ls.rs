//! `shmlink ls`: the listeners under a rendezvous directory and their live connections,
//! as a table or as JSON ([`shmlink::inspect`] does the asking).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use shmlink::{ConnectionStatus, ListenerStatus, SocketReport, SocketState};

use crate::args::{flag_value, split_flag, Command, UsageError};
use crate::help::LS_HELP;

/// Longest `--timeout` accepted (one minute).
const MAX_TIMEOUT_MS: u64 = 60_000;

/// `shmlink ls`'s arguments, with defaults applied.
#[derive(Debug, PartialEq, Eq)]
pub struct LsArgs {
    /// The directory to scan: DIR, else the rendezvous directory.
    pub dir: PathBuf,
    pub json: bool,
    /// How long to wait for the listeners' answers.
    pub timeout: Duration,
}

fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Parses `shmlink ls`'s arguments.
pub fn parse_ls(argv: Vec<String>) -> Result<Command, UsageError> {
    let mut dir = None;
    let mut json = false;
    let mut timeout = shmlink::DEFAULT_INSPECT_TIMEOUT;
    let mut args = argv.into_iter();
    while let Some(arg) = args.next() {
        let positional = if arg == "--" {
            args.next()
        } else if !arg.starts_with('-') || arg == "-" {
            Some(arg)
        } else {
            let (flag, inline) = split_flag(&arg);
            if inline.is_some() && flag != "--timeout" {
                return usage(format!("{flag} takes no value"));
            }
            match flag.as_str() {
                "-h" | "--help" => return Ok(Command::Help(LS_HELP)),
                "--json" => json = true,
                "--timeout" => {
                    let v = flag_value(&flag, &inline, &mut args, "milliseconds")?;
                    match v.parse::<u64>() {
                        Ok(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => {
                            timeout = Duration::from_millis(ms)
                        }
                        _ => {
                            return usage(format!(
                                "invalid value {v:?} for --timeout (expected milliseconds, 1..={MAX_TIMEOUT_MS})"
                            ))
                        }
                    }
                }
                _ => return usage(format!("unknown option {flag:?} (try 'shmlink ls --help')")),
            }
            None
        };
        if let Some(p) = positional {
            if dir.is_some() {
                return usage(format!("ls takes at most one DIR (also got {p:?})"));
            }
            dir = Some(PathBuf::from(p));
        }
    }
    Ok(Command::Ls(LsArgs {
        dir: dir.unwrap_or_else(shmlink::rendezvous_dir),
        json,
        timeout,
    }))
}

/// Runs the command: 0 when the directory could be read, whatever the listeners said.
pub fn run(args: &LsArgs) -> ExitCode {
    let reports = match shmlink::inspect(&args.dir, args.timeout) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("shmlink ls: {e}");
            return ExitCode::from(1);
        }
    };
    let now = SystemTime::now();
    let text = if args.json {
        let mut text = to_json(args, &reports, now).to_string();
        text.push('\n');
        text
    } else {
        table(&reports, now)
    };
    use std::io::Write;
    // A closed stdout (`| head`) is not worth an error.
    let _ = std::io::stdout().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

/// Whole seconds since `t` (0 for times in the future: clocks of other hosts or changes).
fn age(now: SystemTime, t: SystemTime) -> Duration {
    now.duration_since(t).unwrap_or_default()
}

/// `42s`, `5m03s`, `2h05m`, `3d04h`.
pub fn format_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `640B`, `1.5KiB`, `12.0MiB`.
pub fn format_bytes(n: u64) -> String {
    let units = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1}{}", units[unit])
}

/// What the state column says for a socket that did not answer.
fn state_text(state: &SocketState) -> String {
    match state {
        SocketState::Answered(_) => String::new(),
        SocketState::NotAnswering => "not answering".into(),
        SocketState::Stale => "stale (nobody listens)".into(),
        SocketState::PermissionDenied(why) => format!("permission denied: {why}"),
        SocketState::Failed(why) => format!("error: {why}"),
        _ => "unknown state".into(),
    }
}

fn transport_text(s: &ListenerStatus) -> String {
    match s.over.as_deref().and_then(|o| o.split_once(':')) {
        Some((outer, _)) => format!("{}/{outer}", s.transport),
        None => s.transport.clone(),
    }
}

fn peer_text(c: &ConnectionStatus) -> String {
    match (&c.peer, &c.peer_addr) {
        (Some(p), _) => p.pid.to_string(),
        (None, Some(addr)) => addr.clone(),
        (None, None) => "?".into(),
    }
}

/// Lays out rows of cells in columns; the cells of `right` columns are right-aligned.
fn columns(rows: &[Vec<String>], right: &[usize], indent: &str, out: &mut String) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = indent.to_string();
        for (i, cell) in row.iter().enumerate() {
            let last = i + 1 == row.len();
            let pad = widths[i].saturating_sub(cell.chars().count());
            if right.contains(&i) {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if !last {
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            if !last {
                line.push_str("  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// The plain table: a line per listener, its connections indented below it.
pub fn table(reports: &[SocketReport], now: SystemTime) -> String {
    let mut out = String::new();
    if reports.is_empty() {
        return "no listeners\n".into();
    }
    let header = ["ADDRESS", "TRANSPORT", "PID", "UID", "AGE", "CONNS"];
    let mut listeners = vec![header.map(String::from).to_vec()];
    for r in reports {
        let (pid, uid) = match r.listener {
            Some(c) => (c.pid.to_string(), c.uid.to_string()),
            None => ("-".into(), "-".into()),
        };
        listeners.push(match &r.state {
            SocketState::Answered(s) => vec![
                s.address.clone(),
                transport_text(s),
                pid,
                uid,
                format_age(age(now, s.started)),
                format!(
                    "{}{}",
                    s.connections.len(),
                    if s.truncated { "+ (truncated)" } else { "" }
                ),
            ],
            other => vec![
                r.path.display().to_string(),
                "-".into(),
                pid,
                uid,
                "-".into(),
                state_text(other),
            ],
        });
    }
    // Lay the listeners out together, then put each one's connections under its line.
    let mut lines = String::new();
    columns(&listeners, &[2, 3], "", &mut lines);
    let mut lines = lines.lines();
    out.push_str(lines.next().unwrap_or_default());
    out.push('\n');
    for (r, line) in reports.iter().zip(lines) {
        out.push_str(line);
        out.push('\n');
        let SocketState::Answered(s) = &r.state else {
            continue;
        };
        if s.connections.is_empty() {
            continue;
        }
        let header = [
            "PEER",
            "UID",
            "AGE",
            "MSGS IN",
            "MSGS OUT",
            "BYTES IN",
            "BYTES OUT",
        ];
        let mut rows = vec![header.map(String::from).to_vec()];
        for c in &s.connections {
            rows.push(vec![
                peer_text(c),
                c.peer.map_or("-".into(), |p| p.uid.to_string()),
                format_age(age(now, c.accepted)),
                c.counters.msgs_in.to_string(),
                c.counters.msgs_out.to_string(),
                format_bytes(c.counters.bytes_in),
                format_bytes(c.counters.bytes_out),
            ]);
        }
        columns(&rows, &[1, 3, 4, 5, 6], "  ", &mut out);
    }
    out
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The same as the table, as one JSON object.
pub fn to_json(args: &LsArgs, reports: &[SocketReport], now: SystemTime) -> Value {
    let listeners: Vec<Value> = reports
        .iter()
        .map(|r| {
            let (state, reason) = match &r.state {
                SocketState::Answered(_) => ("answered", None),
                SocketState::NotAnswering => ("not_answering", None),
                SocketState::Stale => ("stale", None),
                SocketState::PermissionDenied(why) => ("permission_denied", Some(why.clone())),
                SocketState::Failed(why) => ("error", Some(why.clone())),
                _ => ("unknown", None),
            };
            let status = match &r.state {
                SocketState::Answered(s) => Some(s),
                _ => None,
            };
            let connections: Vec<Value> = status
                .iter()
                .flat_map(|s| &s.connections)
                .map(|c| {
                    json!({
                        "transport": c.transport,
                        "peer_pid": c.peer.map(|p| p.pid),
                        "peer_uid": c.peer.map(|p| p.uid),
                        "peer_gid": c.peer.map(|p| p.gid),
                        "peer_addr": c.peer_addr,
                        "accepted_unix_ms": unix_ms(c.accepted),
                        "age_ms": age(now, c.accepted).as_millis() as u64,
                        "msgs_in": c.counters.msgs_in,
                        "msgs_out": c.counters.msgs_out,
                        "bytes_in": c.counters.bytes_in,
                        "bytes_out": c.counters.bytes_out,
                    })
                })
                .collect();
            json!({
                "path": r.path.display().to_string(),
                "state": state,
                "reason": reason,
                "pid": r.listener.map(|c| c.pid),
                "uid": r.listener.map(|c| c.uid),
                "gid": r.listener.map(|c| c.gid),
                "address": status.map(|s| s.address.clone()),
                "transport": status.map(|s| s.transport.clone()),
                "over": status.and_then(|s| s.over.clone()),
                "started_unix_ms": status.map(|s| unix_ms(s.started)),
                "age_ms": status.map(|s| age(now, s.started).as_millis() as u64),
                "truncated": status.map(|s| s.truncated),
                "connections": status.map(|_| connections),
            })
        })
        .collect();
    json!({
        "dir": args.dir.display().to_string(),
        "listeners": listeners,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ls(args: &str) -> Result<LsArgs, UsageError> {
        let argv = args.split_whitespace().map(String::from).collect();
        match parse_ls(argv)? {
            Command::Ls(a) => Ok(a),
            other => panic!("not an ls command: {other:?}"),
        }
    }

    #[test]
    fn arguments() {
        let a = ls("").unwrap();
        assert_eq!(a.dir, shmlink::rendezvous_dir());
        assert!(!a.json);
        assert_eq!(a.timeout, Duration::from_millis(500));
        let a = ls("/some/dir --json --timeout 20").unwrap();
        assert_eq!(
            (a.dir, a.json, a.timeout),
            ("/some/dir".into(), true, Duration::from_millis(20))
        );
        assert_eq!(
            ls("--timeout=7 d").unwrap().timeout,
            Duration::from_millis(7)
        );
        assert_eq!(ls("-- -odd").unwrap().dir, PathBuf::from("-odd"));
        assert_eq!(parse_ls(vec!["-h".into()]), Ok(Command::Help(LS_HELP)));
        for (args, needle) in [
            ("a b", "at most one DIR"),
            ("--timeout", "--timeout needs a value"),
            ("--timeout 0", "invalid value \"0\" for --timeout"),
            ("--timeout 5s", "invalid value \"5s\""),
            ("--timeout 60001", "1..=60000"),
            ("--json=1", "--json takes no value"),
            ("--frob", "unknown option \"--frob\""),
        ] {
            let e = ls(args).unwrap_err().0;
            assert!(e.contains(needle), "{args:?}: {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn ages_and_sizes() {
        for (s, want) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m00s"),
            (303, "5m03s"),
            (7500, "2h05m"),
            (273_600, "3d04h"),
        ] {
            assert_eq!(format_age(Duration::from_secs(s)), want);
        }
        for (n, want) in [
            (0, "0B"),
            (1023, "1023B"),
            (1536, "1.5KiB"),
            (12 << 20, "12.0MiB"),
            (u64::MAX, "16.0EiB"),
        ] {
            assert_eq!(format_bytes(n), want);
        }
    }
}
