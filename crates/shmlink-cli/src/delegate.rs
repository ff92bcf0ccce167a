//! `shmlink bench ARGS…`: runs the `shmlink-bench` program with the same arguments. The
//! benchmark suite is its own crate and binary, so that this one stays small.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The benchmark program's name.
pub const BENCH_PROGRAM: &str = "shmlink-bench";

/// `shmlink-bench` next to this program (where `cargo build` and `cargo install` put
/// both), else the name alone, for `PATH`.
fn bench_program() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(BENCH_PROGRAM)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(BENCH_PROGRAM))
}

/// What to do when the benchmark program is missing.
fn how_to_get_it() -> String {
    format!(
        "{BENCH_PROGRAM} is not installed here. Get it with `scripts/install.sh --bench PREFIX` \
         (from the source tree: installs it next to shmlink), or run it from the source tree \
         with `cargo run --release -p shmlink-bench -- ARGS`, or build it with \
         `cargo build --release -p shmlink-bench` (Rust 1.89 or newer)."
    )
}

/// Runs `shmlink-bench ARGS`; its exit code is this one's (1 if it cannot run, or died
/// of a signal).
pub fn bench(args: &[OsString]) -> ExitCode {
    let program = bench_program();
    match Command::new(&program).args(args).status() {
        Ok(status) => match status.code() {
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => {
                eprintln!("shmlink bench: {} was killed ({status})", program.display());
                ExitCode::from(1)
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // `--help` is answered here (status 0): what the command is and how to get it.
            if args.iter().any(|a| a == "--help" || a == "-h") {
                println!(
                    "Compare IPC methods side by side: latency, throughput and CPU per message.\n\n\
                     Usage: shmlink bench [ARGS]...\n\n\
                     Runs the separate benchmark program {BENCH_PROGRAM} with ARGS; its own \
                     --help lists them.\n{}",
                    how_to_get_it()
                );
                return ExitCode::SUCCESS;
            }
            eprintln!(
                "shmlink bench: the benchmark program {BENCH_PROGRAM} is not installed (not next to \
                 this program, not on PATH).\n{}",
                how_to_get_it()
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("shmlink bench: run {}: {e}", program.display());
            ExitCode::from(1)
        }
    }
}
