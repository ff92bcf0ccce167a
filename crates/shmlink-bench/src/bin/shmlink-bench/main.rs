//! `shmlink-bench`: compares IPC methods side by side (latency, throughput, CPU per
//! message) in one of several patterns (`--pattern`, see `shmlink-bench --help`); the
//! patterns live in `shmlink_bench::patterns`.

use std::process::ExitCode;

fn main() -> ExitCode {
    shmlink_bench::patterns::main()
}
