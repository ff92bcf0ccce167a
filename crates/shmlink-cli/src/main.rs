//! The `shmlink` command. `shmlink pong` measures latency and throughput between two
//! processes over any transport, verifying every message; see `shmlink pong --help`.
//! `shmlink ls` lists the listeners of a rendezvous directory and their connections.
//! (The benchmark is its own binary, `shmlink-bench`.)

mod args;
mod client;
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
    match args::parse(
        std::env::args_os().skip(1).collect(),
        &shmlink_measure::cpus::allowed_cpus(),
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
        Ok(Command::Ls(l)) => ls::run(&l),
        Err(e) => {
            eprintln!("shmlink: {e}");
            ExitCode::from(2)
        }
    }
}
