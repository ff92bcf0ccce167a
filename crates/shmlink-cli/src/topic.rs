//! `shmlink pub` and `shmlink sub`: publish stdin lines on a topic, print a topic's
//! messages.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use shmlink::{ErrorKind, Policy, PubSubOptions, Publisher, Subscriber};

use crate::args::{parse_addr, parse_msg_size, parse_positive, ConnFlags};
use crate::error::in_cli_terms;
use crate::netcat::{for_each_record, print_record};
use crate::wait::{WaitFlags, Waiting};

const PUB_LONG: &str = "\
Publish each line of stdin (its newline stripped; with -0, each NUL-terminated record) as
one message on TOPIC, then close the topic: every subscriber receives what was published,
then the end of the stream. Messages published while nobody subscribes are lost, except
the last --history ones, which a late subscriber may replay; --subscribers N waits for N
subscribers before the first message.";

const SUB_LONG: &str = "\
Subscribe to TOPIC and print each message on stdout followed by a newline (with -0, by a
NUL byte). Exits 0 at the end of the stream (the publisher closed the topic) or after -n
messages. Under the overwrite policy, messages lost because this subscriber fell behind
are reported on stderr (`lagged: N messages lost`) and the subscription goes on. With
--reconnect the end of a publisher is not the end: `sub` waits for the next publisher at
TOPIC, says so on stderr (what was published in between is not received) and goes on.";

const TOPIC_AFTER: &str = "\
TOPIC: shm:NAME (a bare NAME means shm:NAME), shm:/path.sock, tcp:HOST:PORT,
tls:HOST:PORT (with --cert/--key on the publisher, --ca on the subscriber) or
auto:HOST:PORT (network subscribers on other hosts, shared memory on the same kernel).
`shmlink ls` lists the shm: and auto: topics of the rendezvous directory with each
subscriber's lag.

Exit status: 0 on success, 1 if the topic failed, 2 on bad arguments.";

/// What a full ring does (`--policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Wait for the slowest subscriber (lossless; one that stalls is detached)
    Block,
    /// Never wait: overwrite the oldest message; a subscriber that falls behind loses
    /// messages and is told how many
    Overwrite,
}

/// `shmlink pub`'s arguments.
#[derive(Args, Debug)]
#[command(
    args_override_self = true,
    about = "Publish stdin lines as messages on a topic",
    long_about = PUB_LONG,
    after_long_help = TOPIC_AFTER
)]
pub struct PubCli {
    /// What a full ring does
    #[arg(long, value_enum, default_value_t = PolicyArg::Block)]
    policy: PolicyArg,
    /// Messages the ring holds (a power of two) [default: the library's, 1024]
    #[arg(long, value_name = "N")]
    slots: Option<usize>,
    /// Past messages a late subscriber may replay (at most SLOTS - 1) [default: 0]
    #[arg(long, value_name = "N")]
    history: Option<u64>,
    /// Largest message (suffixes k, M, G) [default: the library's, 4080 bytes]
    #[arg(short = 'm', long = "max-size", value_name = "SIZE", value_parser = parse_msg_size)]
    max_size: Option<usize>,
    /// Wait for N subscribers before publishing the first message
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    subscribers: Option<u64>,
    /// How long --subscribers waits, in seconds
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    wait: u64,
    /// Split stdin at NUL bytes instead of newlines
    #[arg(short = '0', long = "null")]
    null: bool,
    #[command(flatten)]
    conn: ConnFlags,
    /// The topic's address
    #[arg(value_name = "TOPIC", value_parser = parse_addr)]
    topic: String,
}

/// `shmlink sub`'s arguments.
#[derive(Args, Debug)]
#[command(
    args_override_self = true,
    about = "Print the messages of a topic",
    long_about = SUB_LONG,
    after_long_help = TOPIC_AFTER
)]
pub struct SubCli {
    /// Stop after N messages
    #[arg(short = 'n', long = "count", value_name = "N", value_parser = parse_positive)]
    count: Option<u64>,
    /// Past messages to replay, of those the publisher keeps [default: all it offers]
    #[arg(long, value_name = "N")]
    history: Option<u64>,
    /// End each message with a NUL byte instead of a newline
    #[arg(short = '0', long = "null")]
    null: bool,
    /// When the publisher closes the topic, dies or detaches this subscriber, wait for the
    /// next publisher at TOPIC and go on (stderr tells of the gap)
    #[arg(long)]
    reconnect: bool,
    #[command(flatten)]
    wait: WaitFlags,
    #[command(flatten)]
    conn: ConnFlags,
    /// The topic's address
    #[arg(value_name = "TOPIC", value_parser = parse_addr)]
    topic: String,
}

fn fail(cmd: &str, what: impl std::fmt::Display) -> ExitCode {
    eprintln!("shmlink {cmd}: {}", in_cli_terms(&what.to_string()));
    ExitCode::from(1)
}

/// Runs `shmlink pub`.
pub fn publish(args: &PubCli) -> ExitCode {
    let mut opts = PubSubOptions::default()
        .options(args.conn.options())
        .policy(match args.policy {
            PolicyArg::Block => Policy::Block,
            PolicyArg::Overwrite => Policy::Overwrite,
        });
    if let Some(n) = args.slots {
        opts = opts.slots(n);
    }
    if let Some(n) = args.history {
        opts = opts.history(n);
    }
    if let Some(m) = args.max_size {
        opts = opts.max_msg_size(m);
    }
    let mut publisher = match Publisher::bind(&args.topic, &opts) {
        Ok(p) => p,
        Err(e) => return fail("pub", format_args!("{}: {e}", args.topic)),
    };
    eprintln!("shmlink pub: publishing on {}", publisher.local_addr());
    if let Some(n) = args.subscribers {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if let Err(e) = publisher.wait_for_subscribers(n, Duration::from_secs(args.wait)) {
            return fail("pub", e);
        }
    }
    let sep = if args.null { 0 } else { b'\n' };
    let topic = &args.topic;
    let result = for_each_record(io::stdin().lock(), sep, |n, msg| {
        publisher
            .publish(msg)
            .map_err(|e| format!("publish message #{n} ({} bytes) on {topic}: {e}", msg.len()))
    });
    if let Err(e) = result {
        return fail("pub", e);
    }
    match publisher.close() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("pub", format_args!("close {topic}: {e}")),
    }
}

/// Subscribes, retrying while no publisher listens yet (as `wait` says); the error names
/// the topic, and how long was waited when nobody listened.
fn subscribe(addr: &str, opts: &PubSubOptions, wait: &WaitFlags) -> Result<Subscriber, String> {
    let mut waiting = Waiting::new("sub", addr, wait.budget());
    loop {
        match Subscriber::connect(addr, opts) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                if !waiting.again() {
                    return Err(format!("{addr}: {e} {}", waiting.gave_up()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("{addr}: {e}")),
        }
    }
}

/// Runs `shmlink sub`.
pub fn subscribe_and_print(args: &SubCli) -> ExitCode {
    let mut opts = PubSubOptions::default()
        .options(args.conn.options())
        .resubscribe(args.reconnect);
    if let Some(n) = args.history {
        opts = opts.history(n);
    }
    let topic = &args.topic;
    let mut sub = match subscribe(topic, &opts, &args.wait) {
        Ok(s) => s,
        Err(e) => return fail("sub", e),
    };
    let sep = if args.null { 0 } else { b'\n' };
    let mut out = io::stdout().lock();
    let mut received = 0u64;
    while !matches!(args.count, Some(n) if received >= n) {
        let msg = match sub.recv_vec() {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::EndOfStream => break,
            Err(e) if e.kind() == ErrorKind::Lagged => {
                let lost = e.missed().unwrap_or(0);
                eprintln!("shmlink sub: {topic}: lagged: {lost} messages lost");
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Resubscribed => {
                eprintln!("shmlink sub: {e}");
                continue;
            }
            Err(e) => {
                return fail(
                    "sub",
                    format_args!("{topic} after {received} messages: {e}"),
                )
            }
        };
        received += 1;
        match print_record(&mut out, &msg, sep) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return fail("sub", format_args!("write stdout: {e}")),
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse, Command};

    #[test]
    fn arguments() {
        let p = |args: &str| {
            let argv = ["shmlink"].into_iter().chain(args.split_whitespace());
            parse(argv).map(|c| c.command).map_err(|e| e.to_string())
        };
        let Ok(Command::Pub(a)) =
            p("pub --policy overwrite --slots 8 --history 3 -m1k --subscribers 2 prices")
        else {
            panic!()
        };
        assert_eq!(a.policy, PolicyArg::Overwrite);
        assert_eq!(
            (a.slots, a.history, a.max_size),
            (Some(8), Some(3), Some(1024))
        );
        assert_eq!((a.subscribers, a.topic.as_str()), (Some(2), "shm:prices"));
        let Ok(Command::Sub(s)) = p("sub -n5 -0 tcp:127.0.0.1:7000") else {
            panic!()
        };
        assert_eq!((s.count, s.null), (Some(5), true));
        assert_eq!(s.topic, "tcp:127.0.0.1:7000");
        assert!(p("pub --policy lossy t")
            .unwrap_err()
            .contains("possible values: block, overwrite"));
        assert!(p("sub -n 0 t").unwrap_err().contains("at least 1"));
        assert!(p("sub tcp:nohost").unwrap_err().contains("invalid address"));
    }
}
