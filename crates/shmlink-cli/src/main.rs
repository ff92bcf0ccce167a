//! The `shmlink` command. `shmlink pong` measures latency and throughput between two
//! processes over any transport, verifying every message; see `shmlink pong --help`.
//! `shmlink bench` compares IPC methods; `shmlink ls` lists the listeners of a
//! rendezvous directory and their connections.

mod args;
mod bench;
mod bench_pubsub;
mod client;
mod conn_io;
mod error;
mod help;
mod ls;
mod pong;
mod pong_args;
mod report;
mod server;
mod spawn;
mod stop;
mod wire;

use std::io::Write;
use std::process::ExitCode;

use args::Command;

fn main() -> ExitCode {
    // The hidden subcommands that `shmlink bench` starts its runs with.
    let argv: Vec<String> = std::env::args().skip(1).take(2).collect();
    match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [shmlink_bench::run::DRIVER_CMD, spec] => return shmlink_bench::run::driver_main(spec),
        [shmlink_bench::run::PEER_CMD, spec] => return shmlink_bench::run::peer_main(spec),
        [shmlink_bench::pubsub::run::PUB_CMD, spec] => {
            return shmlink_bench::pubsub::run::publisher_main(spec)
        }
        [shmlink_bench::pubsub::run::SUB_CMD, spec] => {
            return shmlink_bench::pubsub::run::subscriber_main(spec)
        }
        _ => {}
    }
    match args::parse(
        std::env::args_os().skip(1).collect(),
        &shmlink_bench::cpus::allowed_cpus(),
    ) {
        Ok(Command::Help(text)) => {
            // A closed stdout (`| head`) is not worth an error.
            let _ = std::io::stdout().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("shmlink {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Ok(Command::Pong(p)) => match pong::run(&p) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("shmlink pong: {e}");
                ExitCode::from(1)
            }
        },
        Ok(Command::Bench(b)) => bench::run(&b),
        Ok(Command::Ls(l)) => ls::run(&l),
        Err(e) => {
            eprintln!("shmlink: {e}");
            ExitCode::from(2)
        }
    }
}
