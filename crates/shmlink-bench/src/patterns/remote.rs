//! `shmlink-bench --pattern remote`: topics across two "hosts", two network namespaces
//! joined by a veth pair, each with its own rendezvous directory (so no shared memory
//! crosses). Needs root (`ip netns`).
//!
//! Rows, all in the same run and interleaved over the rounds:
//! - **bridged**: a shmlink publisher on A, the `shmlink-zenoh` bridge on A exporting
//!   the topic, the bridge on B importing it, a shmlink subscriber on B;
//! - **exporting**: the publisher on A is a `shmlink_zenoh::ExportingPublisher`
//!   (`shmlink-zenoh-perf send --exporting`: the local ring, then Zenoh, from the
//!   publishing thread; no bridge on A, and no subscriber on A, so the local copy is
//!   skipped as for any such topic), the bridge on B imports, a shmlink subscriber on B;
//! - **importing**: the same publisher, and on B a `shmlink_zenoh::ImportingSubscriber`
//!   (`shmlink-zenoh-perf recv --importing`: Zenoh's thread hands each message over and
//!   fills the local topic for B's other subscribers); no bridge at all; with 8
//!   subscribers on B, it is the first and the other 7 read its topic;
//! - **zenoh**: pure Zenoh pub/sub between the same namespaces, `shmlink-zenoh-perf`
//!   (a peer-mode session with explicit endpoints, as Zenoh's `z_pub_thr`/`z_ping`
//!   examples drive it);
//! - **zenoh, attachment**: the same, each message put with an attachment as long as
//!   the bridge's (`--attachment`): what Zenoh itself charges for the attachment that
//!   every bridged message carries;
//! - **tcp**: shmlink's own fan-out: the publisher bound at `tcp:` on A, a remote
//!   subscriber on B;
//! - **redis**, **rabbitmq**: a private broker in B (`scripts/brokers.sh start` run in
//!   the namespace, bound to every address), the publisher on A.
//!
//! Measured for each: 64 B one-way p50 (paced, one message every `GAP_US`), 64 B,
//! 64 KiB and 1 MiB throughput (back to back), CPU per message of the processes on
//! each side (`/proc/PID/stat`, bridges and brokers included) and the bytes the veth
//! carried from A to B per message. Then three more tables: 8 subscribers on B (the
//! bytes crossing per message, B's CPU), and the local traffic of each host (a
//! publisher and a subscriber on A, the same on B) without bridges, with both bridges
//! running, the same with the subscribers joined after the bridges (a bridge then holds
//! the lower slot, which the publisher rings first unless the bridge is a background
//! subscriber), and with A's bridge SIGKILLed mid-stream. The ends are
//! [`ends`]' child processes and `shmlink-zenoh-perf`; the two Zenoh programs are found
//! next to this one (`cargo build --release -p shmlink-zenoh`) or in
//! `$SHMLINK_ZENOH_BIN_DIR`, and their rows are skipped without them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cli::{positive, Cli, UsageError};
use crate::pattern::{run_child, write_json, Pattern, ReportHead};
use shmlink_measure::stats::median_f64;

pub mod ends;
mod hosts;
mod transfer;

use ends::{Carrier, EndSpec, Role, END_CMD};
use hosts::*;
use transfer::*;

/// `--pattern remote`.
pub struct Remote;

impl Pattern for Remote {
    fn name(&self) -> &'static str {
        "remote"
    }

    fn help(&self) -> &'static str {
        "topics across two network namespaces joined by a veth pair (root; each with its
own rendezvous directory): shmlink -> shmlink-zenoh bridge -> Zenoh -> bridge ->
shmlink, an ExportingPublisher -> Zenoh -> bridge -> shmlink, the same publisher ->
Zenoh -> an ImportingSubscriber, pure Zenoh pub/sub (also with a 37-byte attachment)
(shmlink-zenoh-perf, peer mode), shmlink's tcp: remote subscriber, Redis and RabbitMQ
(a broker started in B by scripts/brokers.sh). 64 B one-way p50, 64 B / 64 KiB / 1 MiB
throughput, CPU per message on each side, veth bytes per message; 8 subscribers on B;
local p50 on each host without a bridge, with bridges (also with the local subscribers
joined after them), with a bridge SIGKILLed mid-stream. Needs cargo build --release -p shmlink-zenoh (or $SHMLINK_ZENOH_BIN_DIR) for
the Zenoh rows. Options: --rounds [default: 3; --quick: 1], --quick, --json, --cpus A,B
(host A's processes on CPU A, host B's on CPU B, as two machines each have their own;
default: both hosts on every CPU)."
    }

    fn flags(&self) -> &'static [&'static str] {
        &["rounds", "quick", "json", "cpus"]
    }

    fn child(&self, argv: &[String]) -> Option<ExitCode> {
        run_child(argv, &[(END_CMD, ends::main)])
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        let rounds: u32 = match &cli.rounds {
            Some(t) => positive(t, "--rounds")?,
            None if cli.quick => 1,
            None => 3,
        };
        // Unlike the point-to-point suites, no pinning unless asked: the two hosts share
        // the machine's CPUs.
        let cpus = match cli.cpus.as_deref() {
            None => None,
            Some(text) => {
                crate::cli::placement(Some(text), false, &shmlink_measure::cpus::allowed_cpus())?
                    .map(|(a, b)| [a, b])
            }
        };
        Ok(run(
            &Counts::new(cli.quick),
            cli.quick,
            rounds,
            cpus,
            cli.json.as_deref(),
        ))
    }
}

/// Pause between the paced (latency) messages.
const GAP_US: u64 = 500;

/// Measured messages per run.
struct Counts {
    latency: u64,
    /// 64 B back to back; the brokers' rows (tens of times slower) send `small_brokers`.
    small: u64,
    small_brokers: u64,
    medium: u64,
    large: u64,
    local: u64,
}

impl Counts {
    fn new(quick: bool) -> Counts {
        if quick {
            Counts {
                latency: 300,
                small: 30_000,
                small_brokers: 3000,
                medium: 300,
                large: 30,
                local: 400,
            }
        } else {
            Counts {
                latency: 2000,
                small: 200_000,
                small_brokers: 20_000,
                medium: 2000,
                large: 200,
                local: 3000,
            }
        }
    }
}

/// The pieces a run is made of.
struct Ctx<'a> {
    net: &'a Net,
    /// The brokers, once started (by a thread with `--quick`).
    brokers: std::cell::OnceCell<Brokers>,
    starting: std::cell::Cell<Option<std::thread::JoinHandle<Brokers>>>,
    exe: PathBuf,
    /// A fresh port per run.
    port: std::cell::Cell<u16>,
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // Brokers started but never used are stopped too.
        if let Some(h) = self.starting.take() {
            let _ = h.join();
        }
    }
}

impl Ctx<'_> {
    fn brokers(&self) -> &Brokers {
        self.brokers.get_or_init(|| {
            let h = self.starting.take().expect("started once");
            let b = h.join().expect("the brokers' thread does not panic");
            eprintln!("brokers started");
            b
        })
    }

    fn port(&self) -> u16 {
        let p = self.port.get();
        self.port.set(p + 1);
        p
    }

    fn bench_end(&self, host: usize, name: String, spec: EndSpec) -> End {
        End {
            host,
            name,
            program: self.exe.clone(),
            args: vec![
                END_CMD.to_string(),
                serde_json::to_string(&spec).expect("serializable"),
            ],
            role: spec.role,
        }
    }

    /// A transfer from A to `subs` receivers on B through `way`.
    fn transfer(
        &self,
        way: Way,
        size: usize,
        throughput: bool,
        count: u64,
        subs: usize,
    ) -> Result<Run, String> {
        let spec = |role, carrier, addr: &str| EndSpec {
            role,
            carrier,
            addr: addr.to_string(),
            channel: format!("shmlink-bench-remote-{}", std::process::id()),
            size,
            count,
            gap_us: GAP_US,
            throughput,
        };
        let topic = format!("bench-remote-{}", self.port.get());
        let a = &self.net.addr[0];
        let mut run = Run {
            ends: Vec::new(),
            bridges: [None, None],
            kill_bridge_a: None,
            late_subscribers: false,
            broker_pids: Vec::new(),
        };
        let (send_spec, recv_spec) = match way {
            Way::Bridged => {
                zenoh_program("shmlink-zenoh")?;
                let port = self.port();
                run.bridges = [
                    Some(vec![
                        "--export".into(),
                        topic.clone(),
                        "--listen".into(),
                        format!("tcp/{a}:{port}"),
                    ]),
                    Some(import_bridge(&topic, &format!("tcp/{a}:{port}"))),
                ];
                let addr = format!("shm:{topic}");
                (
                    spec(Role::Send, Carrier::Shmlink, &addr),
                    spec(Role::Recv, Carrier::Shmlink, &addr),
                )
            }
            Way::Tcp => {
                let addr = format!("tcp:{a}:{}", self.port());
                (
                    spec(Role::Send, Carrier::Shmlink, &addr),
                    spec(Role::Recv, Carrier::Shmlink, &addr),
                )
            }
            Way::Redis | Way::Rabbitmq => {
                let (carrier, addr) = match way {
                    Way::Redis => (Carrier::Redis, &self.brokers().redis),
                    _ => (Carrier::Rabbitmq, &self.brokers().rabbitmq),
                };
                let addr = addr.as_ref().map_err(Clone::clone)?;
                run.broker_pids = self.brokers().pids.clone();
                (
                    spec(Role::Send, carrier, addr),
                    spec(Role::Recv, carrier, addr),
                )
            }
            Way::Zenoh | Way::ZenohAttached | Way::Exporting | Way::Importing => {
                let exe = zenoh_program("shmlink-zenoh-perf")?;
                let endpoint = format!("tcp/{a}:{}", self.port());
                let common = |role: &str, ep: &str| {
                    let mut v: Vec<String> = [
                        role,
                        "--key",
                        &format!("shmlink-bench/{topic}"),
                        "--size",
                        &size.to_string(),
                        "--count",
                        &count.to_string(),
                        "--gap-us",
                        &GAP_US.to_string(),
                        ep,
                        &endpoint,
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    if throughput {
                        v.push("--throughput".into());
                    }
                    v
                };
                let mut send = common("send", "--listen");
                match way {
                    // What Zenoh charges for the bridge's attachment alone.
                    Way::ZenohAttached => send.push("--attachment".into()),
                    // The publisher's own session listens; B's bridge imports from it,
                    // or B's first receiver, an importing subscriber.
                    Way::Exporting | Way::Importing => {
                        send.extend(["--exporting".into(), topic.clone()])
                    }
                    _ => {}
                }
                if way == Way::Exporting {
                    run.bridges[1] = Some(import_bridge(&topic, &endpoint));
                }
                run.ends.push(End {
                    host: 0,
                    name: "zenoh-send".into(),
                    program: exe.clone(),
                    args: send,
                    role: Role::Send,
                });
                for i in 0..subs {
                    run.ends.push(match way {
                        Way::Importing if i == 0 => {
                            let mut args = common("recv", "--connect");
                            args.extend(["--importing".into(), topic.clone()]);
                            End {
                                host: 1,
                                name: "importing-recv-0".into(),
                                program: exe.clone(),
                                args,
                                role: Role::Recv,
                            }
                        }
                        // The host's other subscribers read the importing one's topic.
                        Way::Exporting | Way::Importing => self.bench_end(
                            1,
                            format!("recv-{i}"),
                            spec(Role::Recv, Carrier::Shmlink, &format!("shm:{topic}")),
                        ),
                        _ => End {
                            host: 1,
                            name: format!("zenoh-recv-{i}"),
                            program: exe.clone(),
                            args: common("recv", "--connect"),
                            role: Role::Recv,
                        },
                    });
                }
                return Ok(run);
            }
        };
        run.ends.push(self.bench_end(0, "send".into(), send_spec));
        for i in 0..subs {
            run.ends
                .push(self.bench_end(1, format!("recv-{i}"), recv_spec.clone()));
        }
        Ok(run)
    }

    /// Local traffic on each host (a publisher and a subscriber of topic `local-a` on
    /// A, of `local-b` on B), 64 B paced; with `bridges`, A's bridge exports `local-a`
    /// and imports `local-b`, B's the other way round; with `kill`, A's bridge is
    /// SIGKILLed halfway through.
    fn local(&self, count: u64, bridges: bool, kill: bool, late: bool) -> Run {
        let serial = self.port();
        let spec = |role, h: usize| EndSpec {
            role,
            carrier: Carrier::Shmlink,
            addr: format!("shm:local-{}-{serial}", ["a", "b"][h]),
            channel: String::new(),
            size: 64,
            count,
            gap_us: GAP_US,
            throughput: false,
        };
        let mut ends = Vec::new();
        for h in 0..2 {
            ends.push(self.bench_end(h, format!("local-send-{h}"), spec(Role::Send, h)));
            ends.push(self.bench_end(h, format!("local-recv-{h}"), spec(Role::Recv, h)));
        }
        let a = &self.net.addr[0];
        let port = self.port();
        let t = |h: usize| format!("local-{}-{serial}", ["a", "b"][h]);
        Run {
            ends,
            bridges: if bridges {
                [
                    Some(vec![
                        "--export".into(),
                        t(0),
                        "--import".into(),
                        t(1),
                        "--listen".into(),
                        format!("tcp/{a}:{port}"),
                    ]),
                    Some(vec![
                        "--export".into(),
                        t(1),
                        "--import".into(),
                        t(0),
                        "--connect".into(),
                        format!("tcp/{a}:{port}"),
                    ]),
                ]
            } else {
                [None, None]
            },
            kill_bridge_a: kill.then(|| Duration::from_micros(count * (GAP_US + 60) / 2)),
            late_subscribers: late,
            broker_pids: Vec::new(),
        }
    }
}

/// The arguments of B's bridge importing `topic` from the Zenoh peer at `endpoint`.
fn import_bridge(topic: &str, endpoint: &str) -> Vec<String> {
    ["--import", topic, "--connect", endpoint]
        .map(String::from)
        .to_vec()
}

// --------------------------------------------------------------------------- the suite

/// A measurement of the suite: its table, row and column.
#[derive(Clone, Debug, Serialize)]
struct Cell {
    table: &'static str,
    row: String,
    column: &'static str,
    /// `ok`, `skipped` or `failed`.
    status: &'static str,
    note: Option<String>,
    runs: Vec<Outcome>,
}

/// How a cell's run is made.
#[derive(Clone, Copy)]
enum Kind {
    Transfer {
        way: Way,
        size: usize,
        throughput: bool,
        subs: usize,
    },
    Local {
        bridges: bool,
        kill: bool,
        /// The local subscribers join after the bridges did.
        late: bool,
    },
}

const MAIN: &str = "main";
const FANOUT: &str = "fanout";
const LOCAL: &str = "local";

/// The local table's rows: name, bridges running, A's bridge killed halfway, the local
/// subscribers joined after the bridges (so a bridge holds the lower slot, the one the
/// publisher rings first unless the bridge subscribed as a background subscriber).
const LOCAL_ROWS: [(&str, bool, bool, bool); 4] = [
    ("no bridge", false, false, false),
    ("both bridges running", true, false, false),
    ("both bridges, subscribers joined after", true, false, true),
    ("A's bridge SIGKILLed mid-stream", true, true, false),
];
/// The rows of the table with 8 subscribers on B.
const FANOUT_WAYS: [Way; 4] = [Way::Bridged, Way::Importing, Way::Zenoh, Way::Tcp];

fn plan() -> Vec<(Cell, Kind)> {
    let cell = |table, row: String, column| Cell {
        table,
        row,
        column,
        status: "ok",
        note: None,
        runs: Vec::new(),
    };
    let mut v = Vec::new();
    for way in Way::ALL {
        for (column, size, throughput) in [
            ("64 B latency", 64, false),
            ("64 B throughput", 64, true),
            ("64 KiB throughput", 64 << 10, true),
            ("1 MiB throughput", 1 << 20, true),
        ] {
            v.push((
                cell(MAIN, way.label().into(), column),
                Kind::Transfer {
                    way,
                    size,
                    throughput,
                    subs: 1,
                },
            ));
        }
    }
    for way in FANOUT_WAYS {
        v.push((
            cell(
                FANOUT,
                way.label().into(),
                "64 KiB throughput, 8 subscribers on B",
            ),
            Kind::Transfer {
                way,
                size: 64 << 10,
                throughput: true,
                subs: 8,
            },
        ));
    }
    for (row, bridges, kill, late) in LOCAL_ROWS {
        v.push((
            cell(LOCAL, row.into(), "64 B latency"),
            Kind::Local {
                bridges,
                kill,
                late,
            },
        ));
    }
    v
}

/// How long a cell may take from `go` to its last end's result: a minute, plus per
/// message its gap, a millisecond, and its bytes at 10 MB/s, well above what the
/// slowest carrier here needs (every cell ends within seconds). A carrier that stalls
/// (a broker that stops delivering, an end left waiting for a message that was lost)
/// fails its cell within minutes, and the other cells still run.
fn budget(count: u64, size: usize, gap_us: u64) -> Duration {
    let per_msg = Duration::from_micros(gap_us + 1000) + Duration::from_nanos(size as u64 * 100);
    Duration::from_secs(60) + per_msg * u32::try_from(count).unwrap_or(u32::MAX)
}

fn run(
    counts: &Counts,
    quick: bool,
    rounds: u32,
    cpus: Option<[usize; 2]>,
    json: Option<&Path>,
) -> ExitCode {
    if !crate::sys::is_root() {
        eprintln!("shmlink-bench: --pattern remote needs root (ip netns); skipped");
        println!("# remote: skipped [root]: needs root for ip netns");
        return ExitCode::SUCCESS;
    }
    let t0 = Instant::now();
    let net = match Net::new(cpus) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("shmlink-bench: remote: {e}");
            return ExitCode::from(1);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("shmlink-bench: find this program: {e}");
            return ExitCode::from(1);
        }
    };
    let logs = net.root.join("logs");
    let _ = std::fs::create_dir_all(&logs);
    // scripts/brokers.sh start takes ~25 s here (RabbitMQ); --quick starts them while the
    // other rows run (their first round shares the CPUs with it), a full run first.
    eprintln!("starting the brokers in B (scripts/brokers.sh start)");
    let (ns, dir, b) = (
        net.ns[1].clone(),
        net.root.join("brokers"),
        net.addr[1].clone(),
    );
    let cpu_b = cpus.map(|c| c[1]);
    let starting = std::thread::spawn(move || Brokers::start(ns, dir, b, cpu_b));
    let ctx = Ctx {
        net: &net,
        brokers: std::cell::OnceCell::new(),
        starting: std::cell::Cell::new(Some(starting)),
        exe,
        port: std::cell::Cell::new(17000),
    };
    if !quick {
        ctx.brokers();
    }
    let placement = match cpus {
        Some([a, b]) => format!("host A's processes on CPU {a}, host B's on CPU {b}"),
        None => "both hosts' processes on every CPU".into(),
    };
    println!(
        "# shmlink-bench --pattern remote: hosts A ({}) and B ({}), network namespaces joined \
         by a veth pair, each with its own rendezvous directory; {placement}; {rounds} \
         round(s), medians",
        net.addr[0], net.addr[1]
    );
    let mut cells = plan();
    let total = cells.len() * rounds as usize;
    let mut done = 0;
    for round in 0..rounds {
        for (cell, kind) in cells.iter_mut() {
            done += 1;
            if cell.status != "ok" {
                continue;
            }
            let (run, budget) = match *kind {
                Kind::Transfer {
                    way,
                    size,
                    throughput,
                    subs,
                } => {
                    let count = match (size, throughput) {
                        (_, false) => counts.latency,
                        (64, true) if matches!(way, Way::Redis | Way::Rabbitmq) => {
                            counts.small_brokers
                        }
                        (64, true) => counts.small,
                        (s, true) if s <= 64 << 10 => counts.medium,
                        _ => counts.large,
                    };
                    let gap = if throughput { 0 } else { GAP_US };
                    (
                        ctx.transfer(way, size, throughput, count, subs),
                        budget(count, size, gap),
                    )
                }
                Kind::Local {
                    bridges,
                    kill,
                    late,
                } => {
                    let run = match bridges {
                        true => zenoh_program("shmlink-zenoh").map(|_| ()),
                        false => Ok(()),
                    };
                    (
                        run.map(|()| ctx.local(counts.local, bridges, kill, late)),
                        budget(counts.local, 64, GAP_US),
                    )
                }
            };
            let run = match run {
                Ok(r) => r,
                Err(why) => {
                    cell.status = "skipped";
                    cell.note = Some(why);
                    continue;
                }
            };
            let t = Instant::now();
            let dir = logs.join(format!("{done}"));
            let _ = std::fs::create_dir_all(&dir);
            match measure(&net, &run, &dir, budget) {
                Ok(o) => cell.runs.push(o),
                Err(e) => {
                    eprintln!("shmlink-bench: remote: {} / {}: {e}", cell.row, cell.column);
                    cell.status = "failed";
                    cell.note = Some(format!("round {}: {e}", round + 1));
                }
            }
            eprintln!(
                "[{done}/{total}] round {}: {} / {}: {:.1} s",
                round + 1,
                cell.row,
                cell.column,
                t.elapsed().as_secs_f64()
            );
        }
    }
    let cells: Vec<Cell> = cells.into_iter().map(|(c, _)| c).collect();
    print!("{}", table(&cells));
    println!("\n# {:.1} s", t0.elapsed().as_secs_f64());
    let failed = cells.iter().filter(|c| c.status == "failed").count();
    #[derive(Serialize)]
    struct Report<'a> {
        #[serde(flatten)]
        head: ReportHead,
        rounds: u32,
        /// `--cpus`: host A's CPU and host B's, or null (both hosts on every CPU).
        cpus: Option<[usize; 2]>,
        cells: &'a [Cell],
    }
    let written = write_json(
        json,
        &Report {
            head: ReportHead::new("shmlink-bench/remote/1", "remote"),
            rounds,
            cpus,
            cells: &cells,
        },
    );
    drop(ctx);
    drop(net);
    if failed > 0 || !written {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

// ---------------------------------------------------------------------------- the table

/// The median over a cell's runs of `f`.
fn med(c: &Cell, f: impl Fn(&Outcome) -> f64) -> Option<f64> {
    median_f64(&c.runs.iter().map(f).collect::<Vec<_>>())
}

/// The worst receiver's latency on `host`, in µs, at the percentile `pick` reads.
fn worst_us(o: &Outcome, host: usize, pick: impl Fn(&Received) -> u64) -> f64 {
    o.received
        .iter()
        .filter(|r| r.host == host)
        .map(|r| pick(r) as f64 / 1e3)
        .fold(0.0, f64::max)
}

fn p50_us(o: &Outcome, host: usize) -> f64 {
    worst_us(o, host, |r| r.p50_ns)
}

fn p99_us(o: &Outcome, host: usize) -> f64 {
    worst_us(o, host, |r| r.p99_ns)
}

fn per_msg(o: &Outcome, total: f64) -> f64 {
    total / o.sent.max(1) as f64
}

/// A figure, or the cell's status.
fn fig(c: Option<&Cell>, f: impl Fn(&Cell) -> Option<f64>, prec: usize) -> String {
    match c {
        None => "-".into(),
        Some(c) if c.status != "ok" || c.runs.is_empty() => c.status.into(),
        Some(c) => f(c).map_or("-".into(), |x| format!("{x:.prec$}")),
    }
}

/// The suite's tables, and the notes of the cells not measured.
fn table(cells: &[Cell]) -> String {
    let find = |t: &str, row: &str, col: &str| {
        cells
            .iter()
            .find(|c| c.table == t && c.row == row && c.column == col)
    };
    let mut s = String::new();
    s += &format!(
        "\n{:<44} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8} {:>9}\n",
        "A -> B, 1 subscriber on B",
        "64B p50us",
        "64B msg/s",
        "64KiB MB/s",
        "1MiB MB/s",
        "cpuA us",
        "cpuB us",
        "B/msg"
    );
    for way in Way::ALL {
        let row = way.label();
        let lat = find(MAIN, row, "64 B latency");
        let small = find(MAIN, row, "64 B throughput");
        let mb = |col| {
            fig(
                find(MAIN, row, col),
                |c| {
                    let size = if col == "1 MiB throughput" {
                        1 << 20
                    } else {
                        64 << 10
                    };
                    med(c, |o| o.msgs_per_s() * size as f64 / 1e6)
                },
                1,
            )
        };
        s += &format!(
            "{:<44} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8} {:>9}\n",
            row,
            fig(lat, |c| med(c, |o| p50_us(o, 1)), 1),
            fig(small, |c| med(c, Outcome::msgs_per_s), 0),
            mb("64 KiB throughput"),
            mb("1 MiB throughput"),
            fig(small, |c| med(c, |o| per_msg(o, o.cpu_us[0])), 2),
            fig(small, |c| med(c, |o| per_msg(o, o.cpu_us[1])), 2),
            fig(small, |c| med(c, |o| per_msg(o, o.bytes_a_to_b as f64)), 0),
        );
    }
    s += "  (p50: one-way, paced; cpu: us per message of every process on that side, bridges \
          and brokers included, 64 B throughput run; B/msg: bytes A's veth sent per 64 B message)\n";
    let col = "64 KiB throughput, 8 subscribers on B";
    s += &format!(
        "\n{:<44} {:>10} {:>12} {:>9} {:>9}\n",
        "A -> B, 8 subscribers on B, 64 KiB", "msg/s", "veth B/msg", "cpuA us", "cpuB us"
    );
    for way in FANOUT_WAYS {
        let c = find(FANOUT, way.label(), col);
        s += &format!(
            "{:<44} {:>10} {:>12} {:>9} {:>9}\n",
            way.label(),
            fig(c, |c| med(c, Outcome::msgs_per_s), 0),
            fig(c, |c| med(c, |o| per_msg(o, o.bytes_a_to_b as f64)), 0),
            fig(c, |c| med(c, |o| per_msg(o, o.cpu_us[0])), 1),
            fig(c, |c| med(c, |o| per_msg(o, o.cpu_us[1])), 1),
        );
    }
    s += "  (veth B/msg: bytes A's veth sent per message; cpuB: B's subscribers + bridge, \
          per message)\n";
    s += &format!(
        "\n{:<44} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n",
        "local 64 B, publisher + subscriber per host",
        "A p50 us",
        "A p99 us",
        "B p50 us",
        "B p99 us",
        "A x",
        "B x"
    );
    let base = find(LOCAL, "no bridge", "64 B latency");
    for (row, ..) in LOCAL_ROWS {
        let c = find(LOCAL, row, "64 B latency");
        let ratio = |h: usize| {
            fig(
                c,
                |c| {
                    let b = base
                        .filter(|b| b.status == "ok")
                        .and_then(|b| med(b, |o| p50_us(o, h)))?;
                    Some(med(c, |o| p50_us(o, h))? / b)
                },
                2,
            )
        };
        s += &format!(
            "{:<44} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n",
            row,
            fig(c, |c| med(c, |o| p50_us(o, 0)), 1),
            fig(c, |c| med(c, |o| p99_us(o, 0)), 1),
            fig(c, |c| med(c, |o| p50_us(o, 1)), 1),
            fig(c, |c| med(c, |o| p99_us(o, 1)), 1),
            ratio(0),
            ratio(1),
        );
    }
    s += "  (x: p50 over the no-bridge run's)\n";
    for c in cells.iter().filter(|c| c.status != "ok") {
        s += &format!(
            "# {} / {}: {}: {}\n",
            c.row,
            c.column,
            c.status,
            c.note.as_deref().unwrap_or("")
        );
    }
    s
}
