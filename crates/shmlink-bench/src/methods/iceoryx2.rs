//! `iceoryx2`, `iceoryx2-zc`: the iceoryx2 crate's inter-process shared memory
//! (`ipc::Service`), publish/subscribe with `[u8]` slice payloads and one service per
//! direction. `iceoryx2` copies like every other method (the sender copies the message
//! into a loaned sample, the receiver copies it out); `iceoryx2-zc` is the zero-copy row
//! (messages are generated into the loaned sample and checked where they arrived).
//!
//! Publish/subscribe rather than request/response: the drivers send one-way messages
//! (data one way, answers or cumulative acks the other), and a throughput window of
//! messages has no one-to-one response to wait for.
//!
//! The driver creates its node, both services, its publisher and its subscriber; the
//! peer opens the services by name (the run's tag) and creates its own ports; the
//! driver's end is complete once the peer's ports are registered, so no message is sent
//! before its subscriber exists. Every buffer is sized for the most messages the drivers
//! can have in flight (see [`Layout`]) and overflow is off: a full subscriber buffer
//! would make the publisher retry (`RetryUntilDelivered`), never drop, and with these
//! sizes it does not fill.
//!
//! Driven as iceoryx2's own benchmark drives it
//! (`benchmarks/publish-subscribe/src/main.rs` in eclipse-iceoryx/iceoryx2): each end
//! loans its next sample right after it sent one ([`Loan`]), so the loan (reclaiming the
//! returned samples, allocating, writing the chunk header) lies off the timed path,
//! while the receiver waits, not inside the next send.
//!
//! Receiving polls `receive()`: iceoryx2 publish/subscribe has no blocking receive of
//! its own. A waiting end polls the way shmlink's own wait does (32 polls with the CPU's
//! pause hint per clock read, ~20 µs, then yields; shmlink's default wait policy without
//! the sleep); on a shared CPU it yields from the start.
//!
//! Cleanup: the ports, services and nodes remove their shared memory and files when
//! dropped, which both processes do at the end of a run. A run whose processes die
//! without their destructors leaves "dead nodes"; the orchestrator then removes them
//! ([`Method::clean_up_after_failure`]) with iceoryx2's own stale-resource cleanup.

use std::fmt::Display;
use std::io;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use iceoryx2::node::{NodeDetails, NodeView};
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;
use iceoryx2::sample::Sample;
use iceoryx2::sample_mut_uninit::SampleMutUninit;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSub;

use crate::method::{arg, Ctx, Endpoint, InPlace, Method, Mode, Prepared};
use crate::sys::err;

/// How long a waiting end busy-polls before it yields.
const SPIN: Duration = Duration::from_micros(20);
/// How long the driver waits for the peer's ports.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the orchestrator waits for a failed run's processes to be dead.
const DEATH_TIMEOUT: Duration = Duration::from_secs(5);
/// Buffer entries beyond the bounds in [`Layout`].
const SLACK: usize = 2;

pub struct Iceoryx2 {
    zero_copy: bool,
}

pub const COPY: Iceoryx2 = Iceoryx2 { zero_copy: false };
pub const ZERO_COPY: Iceoryx2 = Iceoryx2 { zero_copy: true };

type Payload = [u8];

/// An iceoryx2 error with the operation that failed.
pub(crate) fn iox(what: impl Display, e: impl Display) -> io::Error {
    err(format!("iceoryx2: {what}: {e}"))
}

/// A sample loaned from a publisher ahead of its use, as iceoryx2's own benchmarks hold
/// their next sample, and its length.
pub(crate) struct Loan {
    sample: SampleMutUninit<ipc::Service, [MaybeUninit<u8>], ()>,
    len: usize,
}

impl Loan {
    /// Loans a `len`-byte sample from `publisher`.
    pub(crate) fn new(
        publisher: &Publisher<ipc::Service, Payload, ()>,
        len: usize,
    ) -> io::Result<Loan> {
        let sample = publisher
            .loan_slice_uninit(len)
            .map_err(|e| iox(format!("loan a {len}-byte sample"), e))?;
        Ok(Loan { sample, len })
    }

    /// The sample for a `len`-byte message: `next`, loaned earlier, if it has that
    /// length, else one loaned now (after `next` is returned).
    pub(crate) fn take(
        next: &mut Option<Loan>,
        publisher: &Publisher<ipc::Service, Payload, ()>,
        len: usize,
    ) -> io::Result<Loan> {
        match next.take() {
            Some(loan) if loan.len == len => Ok(loan),
            other => {
                drop(other);
                Loan::new(publisher, len)
            }
        }
    }
}

/// Sends a copy of `msg` in `loan`, which must have `msg.len()` bytes; returns how many
/// subscribers it reached.
pub(crate) fn send_copy(loan: Loan, msg: &[u8]) -> io::Result<usize> {
    if loan.len != msg.len() {
        return Err(err(format!(
            "iceoryx2: a {}-byte message in a {}-byte sample",
            msg.len(),
            loan.len
        )));
    }
    loan.sample
        .write_from_slice(msg)
        .send()
        .map_err(|e| iox("send", e))
}

/// Lets `fill` write `loan` in place and sends it; returns how many subscribers it
/// reached.
///
/// # Safety
///
/// `loan` must come from the only publisher of its service, which allocates fixed-size
/// samples (`AllocationStrategy::Static`), and `fill` must write every byte of the
/// buffer it is given.
pub(crate) unsafe fn send_in_place(
    loan: Loan,
    fill: &mut dyn FnMut(&mut [u8]),
) -> io::Result<usize> {
    let sample = loan.sample;
    // SAFETY: `[u8]` has no invalid values, so `assume_init` only asks that no byte
    // of the payload is uninitialised memory. The sample lies in this publisher's data
    // segment, a fresh POSIX shared-memory object (shm_open O_EXCL, ftruncate, mmap)
    // that the kernel hands out zero-filled. Its samples are fixed-size chunks
    // (`AllocationStrategy::Static`, the caller's promise), so payload bytes never
    // overlap a chunk's header, and this publisher, the only one, stores only whole
    // bytes into payloads (through `fill` or `write_from_slice`). `fill` then writes
    // all the sample's bytes (the caller's promise).
    let mut sample = unsafe { sample.assume_init() };
    fill(sample.payload_mut());
    sample.send().map_err(|e| iox("send", e))
}

/// The sizes of one direction's service and ports.
#[derive(Clone, Copy, Debug)]
struct Direction {
    /// Longest message (bytes): the publisher's `initial_max_slice_len`, allocated as
    /// fixed-size samples.
    max_len: usize,
    /// Subscriber buffer: the most messages sent but not yet received.
    buffer: usize,
}

/// Both directions' sizes for a run. In latency mode each direction has one message in
/// flight (the next is sent once the answer arrived), and answers have the run's size.
/// In throughput mode the driver sends only while `sent - acked < window`, so at most
/// `window` data messages are unreceived; the peer sends 8-byte acks, one per
/// `ceil(window/2)` messages, and the unread ones are for counts in `(acked, sent]`, an
/// interval of at most `window`, so at most 2. MARK and STOP are sent with nothing else
/// in flight.
#[derive(Clone, Copy, Debug)]
struct Layout {
    to_peer: Direction,
    to_driver: Direction,
}

impl Layout {
    fn of(c: &Ctx) -> Layout {
        let window = usize::try_from(c.window).unwrap_or(usize::MAX).max(1);
        let (data, answers, answer_len) = match c.mode {
            Mode::Latency => (1, 1, c.size),
            Mode::Throughput => (window, 2, 8),
        };
        Layout {
            to_peer: Direction {
                max_len: c.size,
                buffer: data.saturating_add(SLACK),
            },
            to_driver: Direction {
                max_len: answer_len,
                buffer: answers + SLACK,
            },
        }
    }
}

pub(crate) fn config() -> Config {
    // The defaults, not a config file of this machine's: the same setup on every machine.
    Config::default()
}

pub(crate) fn node(name: &str) -> io::Result<Node<ipc::Service>> {
    let name = NodeName::new(name).map_err(|e| iox(format!("node name {name:?}"), e))?;
    NodeBuilder::new()
        .name(&name)
        .config(&config())
        // Leave SIGINT/SIGTERM to the bench.
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<ipc::Service>()
        .map_err(|e| iox(format!("create node {name}"), e))
}

fn driver_node(tag: &str) -> String {
    format!("{tag}-driver")
}

fn peer_node(tag: &str) -> String {
    format!("{tag}-peer")
}

fn service_name(base: &str, dir: &str) -> String {
    format!("{base}/{dir}")
}

/// Creates (driver) or opens (peer) one direction's service: one publisher, one
/// subscriber, two nodes, no history, no overflow.
fn service(
    node: &Node<ipc::Service>,
    name: &str,
    d: Direction,
    create: bool,
) -> io::Result<PubSub<ipc::Service, Payload, ()>> {
    let sname = ServiceName::new(name).map_err(|e| iox(format!("service name {name:?}"), e))?;
    let builder = node
        .service_builder(&sname)
        .publish_subscribe::<Payload>()
        .max_publishers(1)
        .max_subscribers(1)
        .max_nodes(2)
        .history_size(0)
        .subscriber_max_buffer_size(d.buffer)
        .subscriber_max_borrowed_samples(1)
        .enable_safe_overflow(false);
    if create {
        builder
            .create()
            .map_err(|e| iox(format!("create service {name}"), e))
    } else {
        builder
            .open()
            .map_err(|e| iox(format!("open service {name}"), e))
    }
}

fn publisher(
    svc: &PubSub<ipc::Service, Payload, ()>,
    d: Direction,
) -> io::Result<Publisher<ipc::Service, Payload, ()>> {
    svc.publisher_builder()
        .initial_max_slice_len(d.max_len)
        .allocation_strategy(AllocationStrategy::Static)
        .max_loaned_samples(1)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()
        .map_err(|e| iox(format!("create publisher on {}", svc.name()), e))
}

fn subscriber(
    svc: &PubSub<ipc::Service, Payload, ()>,
    d: Direction,
) -> io::Result<Subscriber<ipc::Service, Payload, ()>> {
    svc.subscriber_builder()
        .buffer_size(d.buffer)
        .create()
        .map_err(|e| iox(format!("create subscriber on {}", svc.name()), e))
}

/// One end. Fields drop in order: the loaned sample before its publisher, ports before
/// their services, services before the node.
struct IoxEnd {
    /// The next sample to send, loaned right after the last send (see the module doc).
    next: Option<Loan>,
    /// The length of the messages this end sends (one length per direction and run).
    send_len: usize,
    tx: Publisher<ipc::Service, Payload, ()>,
    rx: Subscriber<ipc::Service, Payload, ()>,
    _services: [PubSub<ipc::Service, Payload, ()>; 2],
    _node: Node<ipc::Service>,
    /// Yield from the first empty poll (both ends on one CPU).
    yield_at_once: bool,
    zero_copy: bool,
}

impl IoxEnd {
    fn new(
        tx: Publisher<ipc::Service, Payload, ()>,
        rx: Subscriber<ipc::Service, Payload, ()>,
        send_len: usize,
        (services, node): ([PubSub<ipc::Service, Payload, ()>; 2], Node<ipc::Service>),
        yield_at_once: bool,
        zero_copy: bool,
    ) -> io::Result<IoxEnd> {
        Ok(IoxEnd {
            next: Some(Loan::new(&tx, send_len)?),
            send_len,
            tx,
            rx,
            _services: services,
            _node: node,
            yield_at_once,
            zero_copy,
        })
    }

    /// The sample for a `len`-byte message (normally the one loaned after the last send).
    fn loan(&mut self, len: usize) -> io::Result<Loan> {
        Loan::take(&mut self.next, &self.tx, len)
    }

    /// After a send: loans the next sample while the answer is on its way.
    fn sent(&mut self, reached: usize) -> io::Result<()> {
        delivered(reached)?;
        self.next = Some(Loan::new(&self.tx, self.send_len)?);
        Ok(())
    }

    /// Polls until a sample arrives, the way `shmlink::notify::spin_then_yield` does: 32
    /// polls with the pause hint per clock read, yielding once the spin budget is spent
    /// (at once on a shared CPU).
    fn receive(&self) -> io::Result<Sample<ipc::Service, Payload, ()>> {
        let poll = || self.rx.receive().map_err(|e| iox("receive", e));
        if let Some(s) = poll()? {
            return Ok(s);
        }
        let spin = if self.yield_at_once {
            Duration::ZERO
        } else {
            SPIN
        };
        let spin_end = Instant::now() + spin;
        loop {
            for _ in 0..32 {
                if let Some(s) = poll()? {
                    return Ok(s);
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= spin_end {
                std::thread::yield_now();
            }
        }
    }
}

/// Checks that a sent sample reached the subscriber (0 recipients: the peer's subscriber
/// is gone, and the run would wait forever for an answer).
fn delivered(n: usize) -> io::Result<()> {
    match n {
        0 => Err(err("iceoryx2: the message reached no subscriber")),
        _ => Ok(()),
    }
}

impl Endpoint for IoxEnd {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        let loan = self.loan(msg.len())?;
        let reached = send_copy(loan, msg)?;
        self.sent(reached)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let sample = self.receive()?;
        let msg = sample.payload();
        if msg.len() != buf.len() {
            return Err(err(format!(
                "received a {}-byte message, expected {} bytes",
                msg.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(msg);
        Ok(())
    }

    fn in_place(&mut self) -> Option<&mut dyn InPlace> {
        if self.zero_copy {
            Some(self)
        } else {
            None
        }
    }
}

impl InPlace for IoxEnd {
    fn send_in_place(&mut self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<()> {
        let loan = self.loan(len)?;
        // SAFETY: `loan` comes from `tx`, the only publisher of its service
        // (`max_publishers(1)`), which allocates fixed-size samples
        // (`AllocationStrategy::Static`, see `publisher`); `fill` writes all `len` bytes
        // (`payload::write` covers its whole buffer).
        let reached = unsafe { send_in_place(loan, fill)? };
        self.sent(reached)
    }

    fn recv_in_place(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        let sample = self.receive()?;
        read(sample.payload())
    }
}

impl Method for Iceoryx2 {
    fn name(&self) -> &'static str {
        if self.zero_copy {
            "iceoryx2-zc"
        } else {
            "iceoryx2"
        }
    }

    fn about(&self) -> &'static str {
        if self.zero_copy {
            "iceoryx2 0.10 publish/subscribe, zero-copy: samples loaned ahead, written and read in place"
        } else {
            "iceoryx2 0.10 publish/subscribe, one service per direction, samples loaned ahead, copy in and out"
        }
    }

    fn busy_polls(&self) -> bool {
        true
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let layout = Layout::of(c);
        let base = format!("shmlink-bench/{}", c.tag);
        let node = node(&driver_node(&c.tag))?;
        let to_peer = service(&node, &service_name(&base, "to-peer"), layout.to_peer, true)?;
        let to_driver = service(
            &node,
            &service_name(&base, "to-driver"),
            layout.to_driver,
            true,
        )?;
        let tx = publisher(&to_peer, layout.to_peer)?;
        let rx = subscriber(&to_driver, layout.to_driver)?;
        let (yield_at_once, zero_copy) = (c.same_core, self.zero_copy);
        Ok(Prepared {
            args: vec![base],
            inherit: Vec::new(),
            finish: Box::new(move || {
                // Wait for the peer's ports: a sample sent before its subscriber exists
                // reaches nobody. (A peer that dies first ends the driver.)
                let deadline = Instant::now() + CONNECT_TIMEOUT;
                while to_peer.dynamic_config().number_of_subscribers() == 0
                    || to_driver.dynamic_config().number_of_publishers() == 0
                {
                    if Instant::now() >= deadline {
                        return Err(err(format!(
                            "iceoryx2: the peer's ports did not appear on {} within {CONNECT_TIMEOUT:?}",
                            to_peer.name()
                        )));
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                let end = IoxEnd::new(
                    tx,
                    rx,
                    layout.to_peer.max_len,
                    ([to_peer, to_driver], node),
                    yield_at_once,
                    zero_copy,
                )?;
                Ok(Box::new(end) as Box<dyn Endpoint>)
            }),
        })
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let base = arg(args, 0, "service name prefix")?;
        let layout = Layout::of(c);
        let node = node(&peer_node(&c.tag))?;
        let to_peer = service(&node, &service_name(base, "to-peer"), layout.to_peer, false)?;
        let to_driver = service(
            &node,
            &service_name(base, "to-driver"),
            layout.to_driver,
            false,
        )?;
        let rx = subscriber(&to_peer, layout.to_peer)?;
        let tx = publisher(&to_driver, layout.to_driver)?;
        Ok(Box::new(IoxEnd::new(
            tx,
            rx,
            layout.to_driver.max_len,
            ([to_peer, to_driver], node),
            c.same_core,
            self.zero_copy,
        )?))
    }

    fn clean_up_after_failure(&self, tag: &str) {
        let names = [driver_node(tag), peer_node(tag)];
        clean_up_nodes(&|name| names.iter().any(|n| n == name));
    }
}

/// After a run whose processes failed or were killed: waits, with a deadline, until no
/// node for which `ours` holds is alive (the peers die with their parent, SIGKILL on the
/// parent's death, possibly just after it), removing the dead ones' resources as they
/// appear.
pub(crate) fn clean_up_nodes(ours: &dyn Fn(&str) -> bool) {
    let deadline = Instant::now() + DEATH_TIMEOUT;
    loop {
        let mut alive = false;
        let mut dead = Vec::new();
        let listed = Node::<ipc::Service>::list(&config(), |state| {
            let ours =
                |d: &Option<NodeDetails>| d.as_ref().is_some_and(|d| ours(d.name().as_str()));
            match state {
                NodeState::Alive(v) if ours(v.details()) => alive = true,
                NodeState::Dead(v) if ours(v.details()) => dead.push(v),
                _ => {}
            }
            CallbackProgression::Continue
        });
        if let Err(e) = listed {
            eprintln!("iceoryx2: list nodes for cleanup: {e}");
            return;
        }
        for node in dead {
            if let Err(e) = node.blocking_remove_stale_resources(DEATH_TIMEOUT) {
                eprintln!("iceoryx2: remove a dead node's resources: {e}");
            }
        }
        if !alive || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
