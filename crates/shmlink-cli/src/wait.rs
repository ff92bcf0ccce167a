//! Waiting for a server that does not listen yet: `--wait SECONDS` and `--no-wait` of the
//! commands that connect (send, recv --connect, sub, pong --client), the notice on stderr
//! after a second, and the error that says how long was waited.

use std::time::{Duration, Instant};

use clap::Args;

/// When the notice comes: a server starting at the same time is usually up by then.
const NOTICE_AFTER: Duration = Duration::from_secs(1);

/// How long a client waits for its server to listen.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct WaitFlags {
    /// How long to retry connecting while nobody listens at the address yet, in seconds
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        conflicts_with = "no_wait"
    )]
    pub wait: u64,
    /// Fail at once when nobody listens at the address (the same as --wait 0)
    #[arg(long)]
    pub no_wait: bool,
}

impl Default for WaitFlags {
    fn default() -> WaitFlags {
        WaitFlags {
            wait: 10,
            no_wait: false,
        }
    }
}

impl WaitFlags {
    /// How long to keep retrying.
    pub fn budget(&self) -> Duration {
        if self.no_wait {
            Duration::ZERO
        } else {
            Duration::from_secs(self.wait)
        }
    }
}

/// One client's wait for `addr`: the deadline, and the notice printed once.
pub struct Waiting<'a> {
    cmd: &'a str,
    addr: &'a str,
    budget: Duration,
    start: Instant,
    said: bool,
}

impl<'a> Waiting<'a> {
    /// Starts waiting (the first attempt comes now).
    pub fn new(cmd: &'a str, addr: &'a str, budget: Duration) -> Waiting<'a> {
        Waiting {
            cmd,
            addr,
            budget,
            start: Instant::now(),
            said: false,
        }
    }

    /// After a refused attempt: whether to try again (the budget is not spent); says
    /// on stderr, once, after a second, that this client waits.
    pub fn again(&mut self) -> bool {
        let waited = self.start.elapsed();
        if waited >= self.budget {
            return false;
        }
        if !self.said && waited >= NOTICE_AFTER {
            self.said = true;
            eprintln!(
                "shmlink {}: waiting for {} to listen (up to {} s, --wait SECONDS or \
                 --no-wait to change), Ctrl-C to stop",
                self.cmd,
                self.addr,
                self.budget.as_secs()
            );
        }
        true
    }

    /// What to add to the final "nobody listens" error: how long was waited and how to
    /// wait longer.
    pub fn gave_up(&self) -> String {
        if self.budget.is_zero() {
            "(--no-wait: did not wait for a listener)".to_string()
        } else {
            format!(
                "(waited {} s for a listener; --wait SECONDS waits longer)",
                self.budget.as_secs()
            )
        }
    }
}
