//! `shmlink-zenoh`: the bridge as a command. A program of its own, not a `shmlink
//! bridge` subcommand, so the ops CLI does not carry Zenoh's dependency tree (tokio,
//! rustls, ~200 crates). Runs until SIGINT or SIGTERM, then prints each bridged topic's
//! counters; prints `ready` once the Zenoh session is open, and with `--stats-every`
//! the counters periodically, one `stats` line per topic and a `links` line (the Zenoh
//! peers and routers connected).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shmlink::Policy;
use shmlink_zenoh::{Bridge, BridgeConfig, Direction, Grant, Mode, Pattern, Tls, DEFAULT_PREFIX};
use zenoh::Wait;

/// Bridge shmlink topics to and from Zenoh (docs/zenoh.md). Nothing is exported or
/// imported unless named with --export / --import.
#[derive(Parser, Debug)]
#[command(name = "shmlink-zenoh", version)]
struct Args {
    /// Export local topics matching PATTERN (a topic name; `*` matches any run of
    /// characters). Repeatable.
    #[arg(long, value_name = "PATTERN")]
    export: Vec<String>,
    /// Import Zenoh keys <prefix>PATTERN into local topics. Repeatable.
    #[arg(long, value_name = "PATTERN")]
    import: Vec<String>,
    /// The Zenoh key prefix.
    #[arg(long, default_value = DEFAULT_PREFIX)]
    prefix: String,
    /// The Zenoh session's mode: peer, client or router.
    #[arg(long, default_value = "peer")]
    mode: Mode,
    /// Listen on a Zenoh endpoint (tcp/ADDR:PORT, quic/ADDR:PORT, tls/ADDR:PORT; for
    /// encrypted links prefer quic/, see docs/zenoh.md "Limits"). Repeatable.
    #[arg(long, value_name = "ENDPOINT")]
    listen: Vec<String>,
    /// Connect to a Zenoh endpoint. Repeatable.
    #[arg(long, value_name = "ENDPOINT")]
    connect: Vec<String>,
    /// Find peers with multicast scouting (off by default).
    #[arg(long)]
    scouting: bool,
    /// CA certificate (PEM) for quic/ and tls/ endpoints.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// This bridge's certificate (PEM).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// This bridge's private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Require a certificate signed by --tls-ca from every peer.
    #[arg(long)]
    mtls: bool,
    /// For messages from other Zenoh applications (no bridge attachment): the local
    /// topic's largest message.
    #[arg(long, default_value_t = 64 * 1024)]
    foreign_max_msg: usize,
    /// ... and its policy: block or overwrite.
    #[arg(long, default_value = "overwrite")]
    foreign_policy: String,
    /// The stall timeout of the local topics the bridge publishes (imported topics), in
    /// milliseconds: how long a slow local subscriber of a `Block` topic may hold the
    /// bridge (and so the remote publisher) up before it is detached.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    stall_timeout: u64,
    /// The largest message of a topic the bridge imports, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    max_import_msg: usize,
    /// Access control: the peer whose certificate's common name is CN may receive the
    /// exported topics matching PATTERN (CN:PATTERN, repeatable). With any --allow-out or
    /// --allow-in, everything not granted is denied to every peer; needs --mtls.
    #[arg(long, value_name = "CN:PATTERN")]
    allow_out: Vec<String>,
    /// Access control: the peer CN may publish into the imported topics matching PATTERN
    /// (CN:PATTERN, repeatable).
    #[arg(long, value_name = "CN:PATTERN")]
    allow_in: Vec<String>,
    /// Print the counters every MS milliseconds.
    #[arg(long, value_name = "MS")]
    stats_every: Option<u64>,
}

fn print_stats(bridge: &Bridge) {
    for s in bridge.stats() {
        let dir = match s.direction {
            Direction::Export => "out",
            Direction::Import => "in",
        };
        println!(
            "stats {} {dir} {} messages={} bytes={} dropped={} state={:?}",
            s.topic, s.key, s.messages, s.bytes, s.dropped, s.state
        );
    }
    // The Zenoh links up now (peers and routers this session is connected to).
    let info = bridge.session().info();
    println!(
        "links peers={} routers={}",
        info.peers_zid().wait().count(),
        info.routers_zid().wait().count()
    );
}

fn run(args: Args) -> Result<(), String> {
    let patterns = |v: &[String]| {
        v.iter()
            .map(|p| Pattern::new(p))
            .collect::<Result<Vec<_>, _>>()
    };
    let grants = |v: &[String]| {
        v.iter()
            .map(|g| Grant::parse(g))
            .collect::<Result<Vec<_>, _>>()
    };
    let config = BridgeConfig {
        export: patterns(&args.export)?,
        import: patterns(&args.import)?,
        prefix: args.prefix,
        mode: args.mode,
        listen: args.listen,
        connect: args.connect,
        scouting: args.scouting,
        tls: Tls {
            ca: args.tls_ca,
            cert: args.tls_cert,
            key: args.tls_key,
            mtls: args.mtls,
        },
        foreign_max_msg: args.foreign_max_msg,
        foreign_policy: match args.foreign_policy.as_str() {
            "block" => Policy::Block,
            "overwrite" => Policy::Overwrite,
            p => return Err(format!("unknown policy {p:?} (block or overwrite)")),
        },
        stall_timeout: Duration::from_millis(args.stall_timeout),
        max_import_msg: args.max_import_msg,
        allow_out: grants(&args.allow_out)?,
        allow_in: grants(&args.allow_in)?,
        ..BridgeConfig::default()
    };
    // Before any thread starts: every thread inherits the blocked mask, so the signal
    // waits here for `wait`.
    let signals =
        shmlink_sys::process::Signals::block_stop().map_err(|e| format!("block signals: {e}"))?;
    let bridge = std::sync::Arc::new(Bridge::open(config).map_err(|e| e.0)?);
    println!("ready zid={}", bridge.session().zid());
    if let Some(ms) = args.stats_every {
        let b = std::sync::Arc::downgrade(&bridge);
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(ms.max(10)));
            match b.upgrade() {
                Some(b) => print_stats(&b),
                None => return,
            }
        });
    }
    let sig = signals.wait();
    tracing::info!(signal = shmlink_sys::process::signal_name(sig), "stopping");
    print_stats(&bridge);
    match std::sync::Arc::try_unwrap(bridge) {
        Ok(b) => b.close(),
        Err(b) => drop(b),
    }
    println!("closed");
    Ok(())
}

fn main() -> ExitCode {
    zenoh::init_log_from_env_or("warn");
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmlink-zenoh: {e}");
            ExitCode::FAILURE
        }
    }
}
