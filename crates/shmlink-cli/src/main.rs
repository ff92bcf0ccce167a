//! The `shmlink` command, the operator's tool: `shmlink pong` measures latency and
//! throughput between two processes over any transport, verifying every message;
//! `shmlink ls` lists the listeners and topics of a rendezvous directory, and
//! `shmlink metrics` serves the same counters to Prometheus;
//! `shmlink send`/`recv` move stdin lines or files as messages (netcat for messages);
//! `shmlink pub`/`sub` publish and print a topic; `shmlink bench` runs the separate
//! `shmlink-bench` program. `shmlink completions SHELL` and `shmlink man` generate the
//! shell completions and the manual page.

mod args;
mod cli;
mod conform;
mod delegate;
mod error;
mod listen;
mod ls;
mod manual;
mod metrics;
mod netcat;
mod pong;
mod probe;
mod run;
mod stop;
mod topic;
mod vm_host;
mod wait;

use std::process::ExitCode;

use cli::Command;

fn main() -> ExitCode {
    let cli = match cli::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => return cli::report(&e),
    };
    shmlink::trace::log_to_stderr(cli.log_default());
    match cli.command {
        Command::Pong(p) => {
            let p = match p.into_args(&shmlink_measure::cpus::allowed_cpus()) {
                Ok(p) => p,
                Err(msg) => return cli::report(&cli::usage_error("pong", msg)),
            };
            match pong::run(&p) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("shmlink pong: {}", error::in_cli_terms(&e.to_string()));
                    ExitCode::from(1)
                }
            }
        }
        Command::Ls(l) => ls::run(&l.into_args()),
        Command::Metrics(m) => metrics::run(&m),
        Command::Send(s) => netcat::send(&s),
        Command::Recv(r) => netcat::recv(&r),
        Command::Pub(p) => topic::publish(&p),
        Command::Sub(s) => topic::subscribe_and_print(&s),
        Command::Bench(b) => delegate::bench(&b.args),
        Command::Completions(c) => manual::run_completions(&c),
        Command::Man(m) => manual::run_man(&m),
        Command::Run(r) => run::run(&r),
        Command::VmHost(v) => vm_host::run(&v),
        Command::Conform(c) => conform::run(&c),
        Command::Probe(p) => match probe::run(&p) {
            Ok(code) => code,
            Err(msg) => cli::report(&cli::usage_error("probe", msg)),
        },
    }
}
