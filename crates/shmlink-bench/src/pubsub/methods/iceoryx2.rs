//! `iceoryx2`, `iceoryx2-zc`: the iceoryx2 crate's inter-process publish/subscribe
//! (`ipc::Service`, `[u8]` slice payloads), one service per run, plus an event service
//! (one notifier, a listener per subscriber) for blocking wake-ups: iceoryx2's
//! publish/subscribe has no blocking receive of its own, so the publisher notifies after
//! each send, and a subscriber polls `receive()` for a moment, then sleeps in its
//! listener's wait. `iceoryx2` copies (into the loaned sample, and out of the received
//! one); `iceoryx2-zc` writes into the loaned sample and reads the received one in place.
//! As in iceoryx2's own benchmarks, the publisher loans its next sample right after each
//! publish (`Loan`), off the path of the next message.
//!
//! The notification costs the publisher one datagram per subscriber per message (the
//! `ipc` event service), also when a subscriber is busy-polling and would not need it:
//! iceoryx2's own busy-polling benchmark has no event service, so it does not pay this.
//! The bench keeps it because a subscriber that stopped polling must be woken; the
//! "pub us" and "pub cpu" columns include it.
//!
//! The publisher process creates its node, both services and its ports, and starts once
//! every subscriber and listener is registered. Buffers hold the one message in flight
//! plus slack; overflow is off (`RetryUntilDelivered`), so nothing is ever dropped. The
//! ports, services and nodes remove their resources when dropped; after a failed run the
//! orchestrator removes the dead nodes' (iceoryx2's stale-resource cleanup).

use std::io;
use std::time::{Duration, Instant};

use iceoryx2::port::listener::Listener;
use iceoryx2::port::notifier::Notifier;
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;
use iceoryx2::sample::Sample;
use iceoryx2::service::port_factory::event::PortFactory as EventService;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory as PubSubService;

use super::super::{Ctx, Method, Prepared, Publish, PublishInPlace, Receive};
use super::spin_then_block;
use crate::method::arg;
use crate::methods::iceoryx2::{clean_up_nodes, iox, node, send_copy, send_in_place, Loan};
use crate::sys::err;

/// Subscriber buffer: one message in flight, and slack.
const BUFFER: usize = 4;
/// A sleeping subscriber looks at its buffer again after this long even without a
/// notification.
const RECHECK: Duration = Duration::from_millis(100);

pub struct Iceoryx2 {
    zero_copy: bool,
}

pub const COPY: Iceoryx2 = Iceoryx2 { zero_copy: false };
pub const ZERO_COPY: Iceoryx2 = Iceoryx2 { zero_copy: true };

type Payload = [u8];

fn topic_name(base: &str) -> String {
    format!("{base}/topic")
}

fn wake_name(base: &str) -> String {
    format!("{base}/wake")
}

fn node_prefix(tag: &str) -> String {
    format!("{tag}-")
}

fn services(
    node: &Node<ipc::Service>,
    base: &str,
    n: usize,
    create: bool,
) -> io::Result<(
    PubSubService<ipc::Service, Payload, ()>,
    EventService<ipc::Service>,
)> {
    let name = |s: String| ServiceName::new(&s).map_err(|e| iox(format!("service name {s:?}"), e));
    let topic = node
        .service_builder(&name(topic_name(base))?)
        .publish_subscribe::<Payload>()
        .max_publishers(1)
        .max_subscribers(n)
        .max_nodes(n + 1)
        .history_size(0)
        .subscriber_max_buffer_size(BUFFER)
        .subscriber_max_borrowed_samples(1)
        .enable_safe_overflow(false);
    let wake = node
        .service_builder(&name(wake_name(base))?)
        .event()
        .max_notifiers(1)
        .max_listeners(n)
        .max_nodes(n + 1);
    if create {
        Ok((
            topic.create().map_err(|e| iox("create the topic", e))?,
            wake.create()
                .map_err(|e| iox("create the event service", e))?,
        ))
    } else {
        Ok((
            topic.open().map_err(|e| iox("open the topic", e))?,
            wake.open().map_err(|e| iox("open the event service", e))?,
        ))
    }
}

/// The publisher. Fields drop in order: the loaned sample, ports, services, node.
struct Pub {
    /// The next sample, loaned right after the last publish.
    next: Option<Loan>,
    /// The run's message size (every message has it).
    size: usize,
    publisher: Publisher<ipc::Service, Payload, ()>,
    notifier: Notifier<ipc::Service>,
    _services: (
        PubSubService<ipc::Service, Payload, ()>,
        EventService<ipc::Service>,
    ),
    _node: Node<ipc::Service>,
    n: usize,
    zero_copy: bool,
}

impl Pub {
    fn delivered(&mut self, reached: usize) -> io::Result<()> {
        if reached != self.n {
            return Err(err(format!(
                "iceoryx2: the message reached {reached} of {} subscribers",
                self.n
            )));
        }
        self.notifier
            .notify()
            .map_err(|e| iox("notify the subscribers", e))?;
        self.next = Some(Loan::new(&self.publisher, self.size)?);
        Ok(())
    }
}

impl Publish for Pub {
    fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        let loan = Loan::take(&mut self.next, &self.publisher, msg.len())?;
        let reached = send_copy(loan, msg)?;
        self.delivered(reached)
    }

    fn in_place(&mut self) -> Option<&mut dyn PublishInPlace> {
        if self.zero_copy {
            Some(self)
        } else {
            None
        }
    }
}

impl PublishInPlace for Pub {
    fn publish_in_place(&mut self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<()> {
        let loan = Loan::take(&mut self.next, &self.publisher, len)?;
        // SAFETY: `loan` comes from `publisher`, the only one of its topic
        // (`max_publishers(1)`), which allocates fixed-size samples
        // (`AllocationStrategy::Static`, see `prepare`); `fill` writes all `len` bytes
        // (`message::fill` and `message::stamp` cover the whole buffer between them).
        let reached = unsafe { send_in_place(loan, fill)? };
        self.delivered(reached)
    }
}

/// A subscriber. Fields drop in order: ports, services, node.
struct Sub {
    subscriber: Subscriber<ipc::Service, Payload, ()>,
    listener: Listener<ipc::Service>,
    _services: (
        PubSubService<ipc::Service, Payload, ()>,
        EventService<ipc::Service>,
    ),
    _node: Node<ipc::Service>,
    buf: Vec<u8>,
    zero_copy: bool,
    spin: Duration,
}

impl Sub {
    fn try_receive(&self) -> io::Result<Option<Sample<ipc::Service, Payload, ()>>> {
        self.subscriber.receive().map_err(|e| iox("receive", e))
    }

    fn next(&self) -> io::Result<Sample<ipc::Service, Payload, ()>> {
        spin_then_block(
            self.spin,
            &mut (),
            |_| self.try_receive(),
            |_| loop {
                // A notification that came while we polled is still pending: the wait
                // returns at once, and the sample is there.
                self.listener
                    .timed_wait(|_| {}, RECHECK)
                    .map_err(|e| iox("wait on the listener", e))?;
                if let Some(s) = self.try_receive()? {
                    return Ok(s);
                }
            },
        )
    }
}

impl Receive for Sub {
    fn recv(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        let sample = self.next()?;
        if self.zero_copy {
            return read(sample.payload());
        }
        let msg = sample.payload();
        let n = msg.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&msg[..n]);
        let len = msg.len();
        drop(sample);
        if len != n {
            return Err(err(format!("a {len}-byte message, more than expected")));
        }
        read(&self.buf[..n])
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
            "iceoryx2 0.10 publish/subscribe + event wake-ups, zero-copy (sample loaned ahead, read in place)"
        } else {
            "iceoryx2 0.10 publish/subscribe + event wake-ups, sample loaned ahead, copy in and out"
        }
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let base = format!("shmlink-bench/{}", c.tag);
        let node = node(&format!("{}pub", node_prefix(&c.tag)))?;
        let (topic, wake) = services(&node, &base, c.subscribers, true)?;
        let publisher = topic
            .publisher_builder()
            .initial_max_slice_len(c.size)
            .allocation_strategy(AllocationStrategy::Static)
            .max_loaned_samples(1)
            .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
            .create()
            .map_err(|e| iox("create the publisher", e))?;
        let notifier = wake
            .notifier_builder()
            .create()
            .map_err(|e| iox("create the notifier", e))?;
        let (n, zero_copy, size) = (c.subscribers, self.zero_copy, c.size);
        Ok(Prepared::same_args(n, vec![base], move |timeout| {
            let deadline = Instant::now() + timeout;
            while topic.dynamic_config().number_of_subscribers() < n
                || wake.dynamic_config().number_of_listeners() < n
            {
                if Instant::now() >= deadline {
                    return Err(err(format!(
                        "iceoryx2: {} of {n} subscribers appeared on {} within {timeout:?}",
                        topic.dynamic_config().number_of_subscribers(),
                        topic.name()
                    )));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(Box::new(Pub {
                next: Some(Loan::new(&publisher, size)?),
                size,
                publisher,
                notifier,
                _services: (topic, wake),
                _node: node,
                n,
                zero_copy,
            }) as Box<dyn Publish>)
        }))
    }

    fn subscribe(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Receive>> {
        let base = arg(args, 0, "service name prefix")?;
        let node = node(&format!(
            "{}sub-{}",
            node_prefix(&c.tag),
            std::process::id()
        ))?;
        let (topic, wake) = services(&node, base, c.subscribers, false)?;
        let subscriber = topic
            .subscriber_builder()
            .buffer_size(BUFFER)
            .create()
            .map_err(|e| iox("create a subscriber", e))?;
        let listener = wake
            .listener_builder()
            .create()
            .map_err(|e| iox("create a listener", e))?;
        Ok(Box::new(Sub {
            subscriber,
            listener,
            _services: (topic, wake),
            _node: node,
            buf: vec![0u8; c.size],
            zero_copy: self.zero_copy,
            spin: c.spin,
        }))
    }

    fn clean_up_after_failure(&self, tag: &str) {
        let prefix = node_prefix(tag);
        clean_up_nodes(&|name| name.starts_with(&prefix));
    }
}
