//! `shmlink ls`: the listeners under a rendezvous directory and their live connections,
//! as a table or as JSON ([`shmlink::inspect`] does the asking).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use shmlink::inspect::{BridgeReport, ConnectionStatus, ListenerStatus, SocketReport, SocketState};

/// Longest `--timeout` accepted (one minute).
const MAX_TIMEOUT_MS: u64 = 60_000;

const LS_LONG: &str = "\
List the listeners under a rendezvous directory and their live connections, with
message and byte counters (like XCM's xcmctl), and the publish/subscribe topics with
their subscribers.";

const LS_AFTER: &str = "\
Every socket (*.sock) in DIR is asked over the socket itself; nothing else of a
connection can be found by name. The kernel tells the listening process's PID and UID
(SO_PEERCRED) even when it does not answer; a process in a PID namespace the
asking one cannot see (another container's) has no number there: its PID shows as \"-\"
(null in JSON), its UID as usual. The table has a line per listener: its
address, transport (shm, or auto/tcp and auto/tls for auto: listeners, found through
their upgrade sockets), PID, UID, age and number of connections, or its state. A
registration of transparent mode (`shmlink run`) is named by its program, PID and the
TCP address it listens on, e.g. \"redis-server (pid 123) 127.0.0.1:6379\", transport
\"preload\"; its connections are the TCP connections moved to shared memory. States:

  not answering  a process listens but did not answer within the timeout: a listener
                 answers only while its process is in accept() or polls the listener
                 (an event loop); a process busy with one client does not
  stale          nobody listens: the socket file of a listener that died
  permission denied
                 the socket or the listener does not admit this user (a query passes
                 the same credential check as a connection)

Under each listener, a line per connection it accepted that its process still holds:
the peer's PID (shm:, in the listener's PID namespace) or address (auto: connections
that stayed on TCP), UID, age, and the listener side's counters: MSGS IN are the
messages the peer sent. ux:, tcp: and tls: listeners have no socket in DIR and are not
listed.

Topics (shm: and auto: publishers; the publisher answers at any time): a line per topic
with its policy (block or overwrite), ring slots, publisher PID and UID, messages
published and subscribers; under it a line per subscriber: PID, UID, LAG (messages
published that it has not read yet) and DROPPED (messages it lost to overwriting, as it
reports them), and its network address if it subscribed over tcp:/tls:/auto:.

Bridges (shmlink-zenoh, docs/zenoh.md) keep a status file in DIR, rewritten every
second: a line per bridge (its PID, when it last wrote, live or stale: not rewritten for
5 s, a bridge that died), and under it a line per topic it carries: WAY (out: a local
topic sent to Zenoh; in: brought in), the local topic, the remote key, messages, bytes
and messages dropped on the way, and its state.

With --vm [REGION]: instead of DIR, the listeners and connection slots of a vm: region
(docs/vms.md), read from the region itself: REGION is the host's backing file or a
guest's .../resource2 (default: $SHMLINK_VM_REGION, else the guest's ivshmem device).
A line per live listener entry (name, PID in its own guest, live or stale: whether its
heartbeat moved while ls looked, about 0.1 s), and under it a line per slot in use
(state, client and server PIDs, each side live or stale, and the bytes written into each
direction's ring: messages with their record headers). Slots whose listener is gone are
listed under \"(no listener)\". With --json: {\"region\", \"size\", \"ring\", \"id\",
\"listeners\": [{index, name, pid, alive}], \"connections\": [{slot, state, listener,
client_pid, server_pid, client_alive, server_alive, c2s_bytes, s2c_bytes}]}.

With --json: one JSON object {\"dir\", \"listeners\": [...], \"topics\": [...], \"bridges\": [...]}; each
listener with path, transparent (the TCP address of a transparent-mode registration,
else null), program (its process's name, else null), state (answered, not_answering, stale, permission_denied, error),
reason, pid, uid, gid, address, transport, over, started_unix_ms, age_ms, truncated and
connections [{transport, peer_pid, peer_uid, peer_gid, peer_addr, accepted_unix_ms,
age_ms, msgs_in, msgs_out, bytes_in, bytes_out}] (null where unknown); each topic with
path, address, pid, uid, gid, policy, slots, max_msg, published, joined, left, detached,
truncated, exported (its publisher sends it off the host itself) and subscribers
[{slot, pid, uid, gid, lag, dropped, remote}]; \"bridges\": [{path, pid, age_ms, live,
problem, topics [{direction, topic, key, messages, bytes, dropped, state}]}].

Exit status: 0 when DIR could be read (even if some listeners do not answer), 1 if it
cannot be read, 2 on bad arguments.";

/// `shmlink ls`'s arguments as given.
#[derive(clap::Args, Debug)]
#[command(
    args_override_self = true,
    about = "List the listeners and topics under a rendezvous directory",
    long_about = LS_LONG,
    after_long_help = LS_AFTER
)]
pub struct LsCli {
    /// The directory to scan [default: the rendezvous directory: $SHMLINK_DIR, else
    /// $XDG_RUNTIME_DIR/shmlink, else /tmp/shmlink-$UID]
    #[arg(value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,
    /// How long to wait for the listeners' answers, all asked at once, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = shmlink::inspect::DEFAULT_INSPECT_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_MS))]
    timeout: u64,
    /// List a vm: region's listeners and connections instead [REGION default:
    /// $SHMLINK_VM_REGION, else the guest's ivshmem device]
    #[arg(long, value_name = "REGION", num_args = 0..=1, default_missing_value = "")]
    vm: Option<String>,
}

/// `shmlink ls`'s arguments, with defaults applied.
#[derive(Debug, PartialEq, Eq)]
pub struct LsArgs {
    /// The directory to scan: DIR, else the rendezvous directory.
    pub dir: PathBuf,
    /// DIR was given (a missing one is an error); else the default rendezvous directory,
    /// which does not exist before the first listener: no listeners.
    pub explicit_dir: bool,
    pub json: bool,
    /// How long to wait for the listeners' answers.
    pub timeout: Duration,
    /// `--vm`: list this region (`Some(None)`: the default one) instead of `dir`.
    pub vm: Option<Option<PathBuf>>,
}

impl LsCli {
    /// The arguments with defaults applied.
    pub fn into_args(self) -> LsArgs {
        LsArgs {
            explicit_dir: self.dir.is_some(),
            dir: self.dir.unwrap_or_else(shmlink::rendezvous_dir),
            json: self.json,
            timeout: Duration::from_millis(self.timeout),
            vm: self
                .vm
                .map(|p| Some(PathBuf::from(p)).filter(|p| !p.as_os_str().is_empty())),
        }
    }
}

/// Runs the command: 0 when the directory could be read, whatever the listeners said.
pub fn run(args: &LsArgs) -> ExitCode {
    if let Some(region) = &args.vm {
        return run_vm(region.as_deref(), args.json);
    }
    let reports = match shmlink::inspect(&args.dir, args.timeout) {
        Ok(r) => r,
        // No listener has made the rendezvous directory yet: nothing listens.
        Err(_) if !args.explicit_dir && missing(&args.dir) => Vec::new(),
        Err(e) => {
            eprintln!("shmlink ls: {e}");
            return ExitCode::from(1);
        }
    };
    // Bridges keep status files beside the sockets; one that cannot be read is left out.
    let bridges = shmlink::inspect::bridges(&args.dir).unwrap_or_default();
    let now = SystemTime::now();
    let text = if args.json {
        let mut json = to_json(args, &reports, now);
        json["bridges"] = bridges.iter().map(bridge_json).collect();
        let mut text = json.to_string();
        text.push('\n');
        text
    } else {
        let mut text = table(&reports, now);
        bridge_table(&bridges, &mut text);
        text
    };
    use std::io::Write;
    // A closed stdout (`| head`) is not worth an error.
    let _ = std::io::stdout().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

/// Whether `dir` does not exist (and nothing else went wrong looking).
fn missing(dir: &std::path::Path) -> bool {
    std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

/// `--vm`: the region's listeners and connections.
fn run_vm(region: Option<&std::path::Path>, json: bool) -> ExitCode {
    let report = match shmlink::inspect::inspect_vm(region) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("shmlink ls: {e}");
            return ExitCode::from(1);
        }
    };
    let text = if json {
        let mut t = vm_json(&report).to_string();
        t.push('\n');
        t
    } else {
        vm_table(&report)
    };
    use std::io::Write;
    let _ = std::io::stdout().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

fn live(alive: bool) -> &'static str {
    if alive {
        "live"
    } else {
        "stale"
    }
}

fn pid_text(pid: u32) -> String {
    if pid == 0 {
        "-".into()
    } else {
        pid.to_string()
    }
}

/// The `--vm` table: a line per listener, its connections below it.
pub fn vm_table(r: &shmlink::inspect::VmRegionReport) -> String {
    let mut out = format!(
        "vm: region {}: {}, rings {}, id {}\n",
        r.path.display(),
        format_bytes(r.size),
        format_bytes(r.ring as u64),
        r.id.as_deref().unwrap_or("none")
    );
    if r.listeners.is_empty() && r.connections.is_empty() {
        out.push_str("no listeners, no connections\n");
        return out;
    }
    let conn_rows = |name: Option<&str>| -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        for c in r
            .connections
            .iter()
            .filter(|c| c.listener.as_deref() == name)
        {
            rows.push(vec![
                c.slot.to_string(),
                c.state.to_string(),
                pid_text(c.client_pid),
                live(c.client_alive).into(),
                pid_text(c.server_pid),
                live(c.server_alive).into(),
                format_bytes(c.c2s_bytes),
                format_bytes(c.s2c_bytes),
            ]);
        }
        rows
    };
    let header = |rows: &mut Vec<Vec<String>>| {
        rows.insert(
            0,
            ["SLOT", "STATE", "CLIENT", "", "SERVER", "", "C->S", "S->C"]
                .map(String::from)
                .to_vec(),
        )
    };
    let mut rows = vec![["LISTENER", "PID", "STATE", "CONNS"]
        .map(String::from)
        .to_vec()];
    let mut blocks = Vec::new();
    for l in &r.listeners {
        let mut c = conn_rows(Some(&l.name));
        rows.push(vec![
            format!("vm:{}", l.name),
            pid_text(l.pid),
            live(l.alive).into(),
            c.len().to_string(),
        ]);
        if !c.is_empty() {
            header(&mut c);
        }
        blocks.push(c);
    }
    // One table for the listeners' column widths, then each one's connections below it.
    let mut listeners = String::new();
    columns(&rows, &[1, 3], "", &mut listeners);
    let mut lines = listeners.lines();
    out.push_str(lines.next().unwrap_or_default());
    out.push('\n');
    for (line, c) in lines.zip(blocks) {
        out.push_str(line);
        out.push('\n');
        columns(&c, &[0, 2, 4, 6, 7], "    ", &mut out);
    }
    let mut orphans = conn_rows(None);
    if !orphans.is_empty() {
        header(&mut orphans);
        out.push_str("(no listener)\n");
        columns(&orphans, &[0, 2, 4, 6, 7], "    ", &mut out);
    }
    out
}

/// The `--vm --json` object.
pub fn vm_json(r: &shmlink::inspect::VmRegionReport) -> Value {
    json!({
        "region": r.path.display().to_string(),
        "size": r.size,
        "ring": r.ring,
        "id": r.id,
        "listeners": r.listeners.iter().map(|l| json!({
            "index": l.index,
            "name": l.name,
            "pid": l.pid,
            "alive": l.alive,
        })).collect::<Vec<_>>(),
        "connections": r.connections.iter().map(|c| json!({
            "slot": c.slot,
            "state": c.state,
            "listener": c.listener,
            "client_pid": c.client_pid,
            "server_pid": c.server_pid,
            "client_alive": c.client_alive,
            "server_alive": c.server_alive,
            "c2s_bytes": c.c2s_bytes,
            "s2c_bytes": c.s2c_bytes,
        })).collect::<Vec<_>>(),
    })
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
        (Some(p), _) => pid_cell(p.pid),
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
                line.extend(std::iter::repeat(' ').take(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                if !last {
                    line.extend(std::iter::repeat(' ').take(pad));
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
pub fn table(all: &[SocketReport], now: SystemTime) -> String {
    let mut out = String::new();
    let (topics, reports): (Vec<&SocketReport>, Vec<&SocketReport>) = all
        .iter()
        .partition(|r| matches!(r.state, SocketState::Topic(_)));
    if reports.is_empty() && topics.is_empty() {
        return "no listeners\n".into();
    }
    if !reports.is_empty() {
        listener_table(&reports, now, &mut out);
    }
    if !topics.is_empty() {
        if !reports.is_empty() {
            out.push('\n');
        }
        topic_table(&topics, &mut out);
    }
    out
}

/// The bridges (`shmlink-zenoh`): a line per bridge, its topics indented below it.
fn bridge_table(bridges: &[BridgeReport], out: &mut String) {
    if bridges.is_empty() {
        return;
    }
    out.push('\n');
    let mut rows = vec![vec![
        "BRIDGE".to_string(),
        "PID".into(),
        "UPDATED".into(),
        "STATE".into(),
    ]];
    for b in bridges {
        let name = b.path.file_name().map(|n| n.to_string_lossy().into_owned());
        let state = match (&b.problem, b.live) {
            (Some(p), _) => p.clone(),
            (None, true) => "live".into(),
            (None, false) => "stale: not rewritten, the bridge is gone".into(),
        };
        rows.push(vec![
            name.unwrap_or_default(),
            b.pid.map_or("-".into(), pid_text),
            format!("{} ago", format_age(b.age)),
            state,
        ]);
        let mut topics = vec![vec![
            "WAY".to_string(),
            "TOPIC".into(),
            "REMOTE KEY".into(),
            "MSGS".into(),
            "BYTES".into(),
            "DROPPED".into(),
            "STATE".into(),
        ]];
        topics.extend(b.topics.iter().map(|t| {
            vec![
                if t.export { "out" } else { "in" }.to_string(),
                t.topic.clone(),
                t.key.clone(),
                t.messages.to_string(),
                format_bytes(t.bytes),
                t.dropped.to_string(),
                t.state.clone(),
            ]
        }));
        columns(&rows, &[1], "", out);
        rows.clear();
        if b.topics.is_empty() {
            out.push_str("  (no topics yet)\n");
        } else {
            columns(&topics, &[3, 4, 5], "  ", out);
        }
    }
}

/// A bridge's JSON object.
fn bridge_json(b: &BridgeReport) -> Value {
    json!({
        "path": b.path.display().to_string(),
        "pid": b.pid,
        "age_ms": b.age.as_millis() as u64,
        "live": b.live,
        "problem": b.problem,
        "topics": b.topics.iter().map(|t| json!({
            "direction": if t.export { "export" } else { "import" },
            "topic": t.topic,
            "key": t.key,
            "messages": t.messages,
            "bytes": t.bytes,
            "dropped": t.dropped,
            "state": t.state,
        })).collect::<Vec<_>>(),
    })
}

/// The topics: a line per publisher, its subscribers indented below it.
fn topic_table(reports: &[&SocketReport], out: &mut String) {
    let header = [
        "TOPIC",
        "POLICY",
        "SLOTS",
        "PID",
        "UID",
        "PUBLISHED",
        "SUBS",
    ];
    let mut rows = vec![header.map(String::from).to_vec()];
    let mut topics = Vec::new();
    for r in reports {
        let SocketState::Topic(t) = &r.state else {
            continue;
        };
        let (pid, uid) = match r.listener {
            Some(c) => (pid_cell(c.pid), c.uid.to_string()),
            None => ("-".into(), "-".into()),
        };
        rows.push(vec![
            if t.exported {
                format!("{} (exported by its publisher)", t.address)
            } else {
                t.address.clone()
            },
            policy_text(t.policy).into(),
            t.slots.to_string(),
            pid,
            uid,
            t.published.to_string(),
            format!(
                "{}{}",
                t.subscribers.len(),
                if t.truncated { "+ (truncated)" } else { "" }
            ),
        ]);
        topics.push(t);
    }
    let mut lines = String::new();
    columns(&rows, &[2, 3, 4, 5, 6], "", &mut lines);
    let mut lines = lines.lines();
    out.push_str(lines.next().unwrap_or_default());
    out.push('\n');
    for (t, line) in topics.into_iter().zip(lines) {
        out.push_str(line);
        out.push('\n');
        if t.subscribers.is_empty() {
            continue;
        }
        let header = ["SLOT", "PID", "UID", "LAG", "DROPPED", "REMOTE"];
        let mut rows = vec![header.map(String::from).to_vec()];
        for s in &t.subscribers {
            rows.push(vec![
                s.slot.to_string(),
                pid_cell(s.cred.pid),
                s.cred.uid.to_string(),
                s.lag.to_string(),
                s.missed.to_string(),
                s.remote.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        columns(&rows, &[0, 1, 2, 3, 4], "  ", out);
    }
}

fn policy_text(p: shmlink::Policy) -> &'static str {
    match p {
        shmlink::Policy::Block => "block",
        shmlink::Policy::Overwrite => "overwrite",
    }
}

/// A pid the kernel reported (`SO_PEERCRED`), `None` for 0: the process lives in a PID
/// namespace this one cannot see (another container's), where the kernel has no number
/// for it.
fn seen_pid(pid: u32) -> Option<u32> {
    (pid != 0).then_some(pid)
}

/// A pid for the table: `-` where [`seen_pid`] has none.
fn pid_cell(pid: u32) -> String {
    seen_pid(pid).map_or_else(|| "-".into(), |p| p.to_string())
}

/// The name of process `pid` (`/proc/PID/comm`), if it is visible.
fn program_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let comm = comm.trim_end_matches('\n');
    // Another user's process may name itself anything: no control characters.
    (!comm.is_empty()).then(|| {
        comm.chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect()
    })
}

/// How the table names a transparent-mode registration: `redis-server (pid 123)
/// 127.0.0.1:6379` (the program and the address it listens on) instead of its file.
fn transparent_label(r: &SocketReport) -> Option<String> {
    let reg = shmlink::inspect::transparent_registration(&r.path)?;
    Some(match r.listener {
        Some(c) => match seen_pid(c.pid).map(|pid| (pid, program_name(pid))) {
            Some((pid, Some(p))) => format!("{p} (pid {pid}) {reg}"),
            Some((pid, None)) => format!("pid {pid} {reg}"),
            None => reg.to_string(),
        },
        None => reg.to_string(),
    })
}

/// The listeners: a line per listener, its connections indented below it.
fn listener_table(reports: &[&SocketReport], now: SystemTime, out: &mut String) {
    let header = ["ADDRESS", "TRANSPORT", "PID", "UID", "AGE", "CONNS"];
    let mut listeners = vec![header.map(String::from).to_vec()];
    for r in reports {
        let (pid, uid) = match r.listener {
            Some(c) => (pid_cell(c.pid), c.uid.to_string()),
            None => ("-".into(), "-".into()),
        };
        let label = transparent_label(r);
        listeners.push(match &r.state {
            SocketState::Answered(s) => vec![
                label.unwrap_or_else(|| s.address.clone()),
                if shmlink::inspect::transparent_registration(&r.path).is_some() {
                    "preload".into()
                } else {
                    transport_text(s)
                },
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
                label.unwrap_or_else(|| r.path.display().to_string()),
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
        columns(&rows, &[1, 3, 4, 5, 6], "  ", out);
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The same as the table, as one JSON object.
pub fn to_json(args: &LsArgs, reports: &[SocketReport], now: SystemTime) -> Value {
    let topics: Vec<Value> = reports.iter().filter_map(topic_json).collect();
    let listeners: Vec<Value> = reports
        .iter()
        .filter(|r| !matches!(r.state, SocketState::Topic(_)))
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
                        "peer_pid": c.peer.and_then(|p| seen_pid(p.pid)),
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
            let transparent = shmlink::inspect::transparent_registration(&r.path);
            json!({
                "path": r.path.display().to_string(),
                "transparent": transparent.map(|t| t.to_string()),
                "program": transparent.and(r.listener).and_then(|c| program_name(seen_pid(c.pid)?)),
                "state": state,
                "reason": reason,
                "pid": r.listener.and_then(|c| seen_pid(c.pid)),
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
        "topics": topics,
    })
}

/// A topic's JSON object, if `r` is a topic.
fn topic_json(r: &SocketReport) -> Option<Value> {
    let SocketState::Topic(t) = &r.state else {
        return None;
    };
    let subscribers: Vec<Value> = t
        .subscribers
        .iter()
        .map(|s| {
            json!({
                "slot": s.slot,
                "pid": seen_pid(s.cred.pid),
                "uid": s.cred.uid,
                "gid": s.cred.gid,
                "lag": s.lag,
                "dropped": s.missed,
                "remote": s.remote,
            })
        })
        .collect();
    Some(json!({
        "path": r.path.display().to_string(),
        "address": t.address,
        "pid": r.listener.and_then(|c| seen_pid(c.pid)),
        "uid": r.listener.map(|c| c.uid),
        "gid": r.listener.map(|c| c.gid),
        "policy": policy_text(t.policy),
        "slots": t.slots,
        "max_msg": t.max_msg,
        "published": t.published,
        "joined": t.joined,
        "left": t.left,
        "detached": t.detached,
        "truncated": t.truncated,
        "exported": t.exported,
        "subscribers": subscribers,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `shmlink ls ARGS`, or clap's message.
    fn ls(args: &str) -> Result<LsArgs, String> {
        let argv = ["shmlink", "ls"].into_iter().chain(args.split_whitespace());
        match crate::cli::parse(argv).map_err(|e| e.to_string())?.command {
            crate::cli::Command::Ls(l) => Ok(l.into_args()),
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
        assert_eq!(ls("").unwrap().vm, None);
        assert_eq!(ls("--vm").unwrap().vm, Some(None));
        assert_eq!(
            ls("--vm /dev/shm/r --json").unwrap().vm,
            Some(Some("/dev/shm/r".into()))
        );
        assert!(ls("-h").unwrap_err().contains("Usage: shmlink ls"));
        for (args, needle) in [
            ("a b", "unexpected argument 'b'"),
            ("--timeout", "a value is required for '--timeout <MS>'"),
            ("--timeout 0", "invalid value '0' for '--timeout <MS>'"),
            ("--timeout 5s", "invalid value '5s'"),
            ("--timeout 60001", "1..=60000"),
            ("--json=1", "unexpected value '1' for '--json'"),
            ("--frob", "unexpected argument '--frob'"),
        ] {
            let e = ls(args).unwrap_err();
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
