//! What every IPC method provides: a way to set up a connected pair between this process
//! (the driver) and a peer process, and [`Endpoint`]s (the measurement core's) that send
//! and receive messages.

use std::io;
use std::os::fd::OwnedFd;

pub use shmlink_measure::endpoint::{Endpoint, InPlace};
pub use shmlink_measure::Mode;

/// What the driver set up for a run: the peer's arguments, the fds the peer inherits (at
/// the same numbers), and the step that completes the driver's end once the peer runs.
pub struct Prepared {
    /// Method-specific arguments for [`Method::connect`] in the peer.
    pub args: Vec<String>,
    /// Fds the peer inherits; the driver closes its copies after the peer started.
    pub inherit: Vec<OwnedFd>,
    /// Completes the driver's end (for example accepts the peer's connection).
    pub finish: Box<dyn FnOnce() -> io::Result<Box<dyn Endpoint>>>,
}

impl Prepared {
    /// A driver end that is complete before the peer starts.
    pub fn ready(
        args: Vec<String>,
        inherit: Vec<OwnedFd>,
        end: impl Endpoint + 'static,
    ) -> Prepared {
        Prepared {
            args,
            inherit,
            finish: Box::new(move || Ok(Box::new(end) as Box<dyn Endpoint>)),
        }
    }
}

/// The parameters of a run that a method's setup may depend on.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// Bytes per data message.
    pub size: usize,
    pub mode: Mode,
    /// Messages in flight in throughput mode.
    pub window: u64,
    /// Both ends pinned to the same CPU (busy-polling methods then yield).
    pub same_core: bool,
    /// A name unique to this run, for methods that rendezvous by name.
    pub tag: String,
}

/// Why a method cannot run a message size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeLimit {
    /// The largest message the method carries here.
    pub max: usize,
    /// Where the limit comes from.
    pub why: &'static str,
}

/// An IPC method: a stable name and how to connect two processes with it.
pub trait Method: Sync {
    /// The stable name used on the command line and in output.
    fn name(&self) -> &'static str;
    /// One line on what is measured.
    fn about(&self) -> &'static str;
    /// `Some(reason)` if this machine cannot run the method (the kernel's answer).
    fn unavailable(&self) -> Option<String> {
        None
    }
    /// The largest message, if the method has a limit below the suite's 16 MiB.
    fn size_limit(&self) -> Option<SizeLimit> {
        None
    }
    /// Most messages in flight that the method carries without losing any (UDP drops
    /// what does not fit in the receive buffer); `None`: any window.
    fn max_window(&self, _size: usize) -> Option<u64> {
        None
    }
    /// Whether waiting busy-polls (such methods yield when both ends share a CPU).
    fn busy_polls(&self) -> bool {
        false
    }
    /// Driver side: creates the resources and the peer's arguments.
    fn prepare(&self, ctx: &Ctx) -> io::Result<Prepared>;
    /// Peer side: connects with the arguments [`Method::prepare`] produced.
    fn connect(&self, ctx: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>>;
    /// Orchestrator side, after a run whose driver failed or was killed: removes what the
    /// run's processes (named by the run's `tag`) left behind because their destructors
    /// did not run. For methods whose resources outlive a dead process and cannot be
    /// reclaimed by the driver alone.
    fn clean_up_after_failure(&self, _tag: &str) {}
}

/// The argument at `i`, or an error naming what is missing.
pub fn arg<'a>(args: &'a [String], i: usize, what: &str) -> io::Result<&'a str> {
    args.get(i)
        .map(String::as_str)
        .ok_or_else(|| crate::sys::err(format!("missing peer argument {i} ({what})")))
}

/// Names joined by ", " (the methods of a suite, for error messages).
pub fn comma_list(names: impl Iterator<Item = &'static str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}
