//! `shmlink-bench`: compares IPC methods side by side (latency, throughput, CPU per
//! message) between two processes, or publish/subscribe between one publisher and N
//! subscribers (`--pattern pubsub`), or async Rust on tokio with tonic (`--pattern async`);
//! see `shmlink-bench --help`. Every run is this
//! program re-executed as its driver and peer (or publisher and subscribers).

mod appsbench;
mod asyncbench;
mod bench;
mod connectbench;
mod flags;
mod help;
mod inprocbench;
mod pubsub;

use std::process::ExitCode;

use bench::Parsed;
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
    let args = match std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string()
                .map_err(|a| flags::UsageError(format!("argument {a:?} is not UTF-8")))
        })
        .collect::<Result<Vec<String>, _>>()
    {
        Ok(args) => args,
        Err(e) => return usage_error(&e),
    };
    // A fault for tests of failure handling is injected or refused, never ignored.
    if let Err(e) = shmlink_bench::fault::check(pattern_of(&args)) {
        eprintln!("shmlink-bench: {e}");
        return ExitCode::from(2);
    }
    if appsbench::wanted(&args) {
        return appsbench::main(args);
    }
    if asyncbench::wanted(&args) {
        return asyncbench::main(args);
    }
    if inprocbench::wanted(&args) {
        return inprocbench::main(args);
    }
    if connectbench::wanted(&args) {
        return connectbench::main(args);
    }
    match bench::parse(args, &shmlink_measure::cpus::allowed_cpus()) {
        Ok(Parsed::Help) => {
            // A closed stdout (`| head`) is not worth an error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), help::BENCH_HELP.as_bytes());
            ExitCode::SUCCESS
        }
        Ok(Parsed::Version) => {
            println!("shmlink-bench {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Ok(Parsed::Bench(b)) => bench::run(&b),
        Err(e) => usage_error(&e),
    }
}

/// Bad arguments: the reason on stderr, exit status 2.
fn usage_error(e: &flags::UsageError) -> ExitCode {
    eprintln!("shmlink-bench: {e}");
    ExitCode::from(2)
}

/// The pattern the command line asks for (`p2p` if none).
fn pattern_of(args: &[String]) -> &'static str {
    ["apps", "async", "inproc", "connect", "pubsub"]
        .into_iter()
        .find(|p| connectbench::pattern_is(args, p))
        .unwrap_or("p2p")
}
