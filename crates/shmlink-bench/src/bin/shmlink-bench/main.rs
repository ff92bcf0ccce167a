//! `shmlink-bench`: compares IPC methods side by side (latency, throughput, CPU per
//! message) between two processes, or publish/subscribe between one publisher and N
//! subscribers (`--pattern pubsub`), or async Rust on tokio with tonic (`--pattern async`);
//! see `shmlink-bench --help`. Every run is this
//! program re-executed as its driver and peer (or publisher and subscribers).

mod appsbench;
mod asyncbench;
mod bench;
mod connectbench;
mod help;
mod inprocbench;
mod pubsub;

use std::process::ExitCode;

use shmlink_bench::cli::{Cli, UsageError};
use shmlink_bench::pubsub::run::{PUB_CMD, SUB_CMD};
use shmlink_bench::run::{DRIVER_CMD, PEER_CMD};

fn main() -> ExitCode {
    // The hidden subcommands that the suite starts its runs with.
    let argv: Vec<String> = std::env::args().skip(1).take(2).collect();
    match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [DRIVER_CMD, spec] => return shmlink_bench::run::driver_main(spec),
        [PEER_CMD, spec] => return shmlink_bench::run::peer_main(spec),
        [PUB_CMD, spec] => return shmlink_bench::pubsub::run::publisher_main(spec),
        [SUB_CMD, spec] => return shmlink_bench::pubsub::run::subscriber_main(spec),
        _ => {}
    }
    let argv3: Vec<String> = std::env::args().skip(1).take(3).collect();
    if let [cmd, method, addr] = &argv3[..] {
        if cmd == asyncbench::PEER_CMD {
            return asyncbench::peer_main(method, addr);
        }
        if cmd == connectbench::PEER_CMD {
            return connectbench::peer_main(method, addr);
        }
    }
    let cli = match Cli::parse_from(std::env::args_os(), help::PATTERNS_HELP.to_string()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // A fault for tests of failure handling is injected or refused, never ignored.
    if let Err(e) = shmlink_bench::fault::check(cli.pattern()) {
        eprintln!("shmlink-bench: {e}");
        return ExitCode::from(2);
    }
    match cli.pattern() {
        "apps" => appsbench::main(&cli),
        "async" => asyncbench::main(&cli),
        "inproc" => inprocbench::main(&cli),
        "connect" => connectbench::main(&cli),
        _ => match bench::config(&cli, &shmlink_measure::cpus::allowed_cpus()) {
            Ok(b) => bench::run(&b),
            Err(e) => usage_error(&e),
        },
    }
}

/// Bad arguments: the reason on stderr, exit status 2.
fn usage_error(e: &UsageError) -> ExitCode {
    eprintln!("shmlink-bench: {e}");
    ExitCode::from(2)
}
