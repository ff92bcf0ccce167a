//! What a pub/sub method provides ([`Method`]): a publisher that reaches N subscriber
//! processes ([`Publish`], [`PublishInPlace`]), those subscribers ([`Receive`]), and the
//! parameters of a run its setup may depend on ([`Ctx`], [`Prepared`]).

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

pub use crate::method::SizeLimit;

/// The parameters of a run that a method's setup may depend on.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// Bytes per message.
    pub size: usize,
    /// Subscriber processes.
    pub subscribers: usize,
    /// Every process on one CPU (waiting ends must not spin for long).
    pub same_core: bool,
    /// A name unique to this run, for methods that rendezvous by name.
    pub tag: String,
    /// How long a waiting subscriber busy-polls before it blocks in the kernel:
    /// [`super::methods::OWN_CPU_SPIN`] when it has a CPU to itself (one subscriber, not
    /// `same_core`), else [`super::methods::SPIN`]. Every method's subscriber uses it.
    pub spin: Duration,
}

/// The publisher's side of a run, as [`Method::prepare`] set it up.
pub struct Prepared {
    /// Per subscriber (index `0..n`): the arguments of [`Method::subscribe`].
    pub args: Vec<Vec<String>>,
    /// Per subscriber: fds it inherits (at the same numbers); closed here once it runs.
    pub inherit: Vec<Vec<OwnedFd>>,
    /// Completes the publisher once the subscriber processes have subscribed: waits, for
    /// at most the given time, until the method itself delivers to all of them.
    pub finish: Box<dyn FnOnce(Duration) -> io::Result<Box<dyn Publish>>>,
}

impl Prepared {
    /// Every subscriber gets `args` and no fds.
    pub fn same_args(
        n: usize,
        args: Vec<String>,
        finish: impl FnOnce(Duration) -> io::Result<Box<dyn Publish>> + 'static,
    ) -> Prepared {
        Prepared {
            args: vec![args; n],
            inherit: (0..n).map(|_| Vec::new()).collect(),
            finish: Box::new(finish),
        }
    }
}

/// The publishing end.
pub trait Publish {
    /// Publishes `msg` to every subscriber (the copying interface).
    fn publish(&mut self, msg: &[u8]) -> io::Result<()>;
    /// The zero-copy interface, for the methods measured in place (`-zc`).
    fn in_place(&mut self) -> Option<&mut dyn PublishInPlace> {
        None
    }
}

/// Publishing a message written in the method's own buffer.
pub trait PublishInPlace {
    /// Loans a buffer of `len` bytes, lets `fill` write all of it, and publishes it.
    fn publish_in_place(&mut self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<()>;
}

/// A subscribing end.
pub trait Receive {
    /// Waits for the next message — busy-polling briefly, then blocking in the kernel —
    /// and hands it to `read`, where it lies (zero-copy methods) or from a copy; `read`'s
    /// error is returned after the message is released.
    fn recv(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()>;
}

/// A publish/subscribe method: a stable name, and how one publisher process reaches N
/// subscriber processes with it.
pub trait Method: Sync {
    /// The stable name used on the command line and in output.
    fn name(&self) -> &'static str;
    /// One line on what is measured.
    fn about(&self) -> &'static str;
    /// `Some(reason)` if the method cannot run here.
    fn unavailable(&self) -> Option<String> {
        None
    }
    /// The largest message, if the method has a limit below the suite's 16 MiB.
    fn size_limit(&self) -> Option<SizeLimit> {
        None
    }
    /// Publisher side: creates the topic and the subscribers' arguments.
    fn prepare(&self, ctx: &Ctx) -> io::Result<Prepared>;
    /// Subscriber side: subscribes with the arguments `prepare` made for it. The
    /// subscription must be in place (or be detectable by the publisher's `finish`)
    /// when this returns.
    fn subscribe(&self, ctx: &Ctx, args: &[String]) -> io::Result<Box<dyn Receive>>;
    /// Orchestrator side, after a run whose processes failed or were killed: removes
    /// what they left behind (named by the run's tag).
    fn clean_up_after_failure(&self, _tag: &str) {}
}
