//! `shmlink`, `shmlink-zc`: this library's publish/subscribe ([`shmlink::Publisher`],
//! [`shmlink::Subscriber`]) over `shm:`. One broadcast ring in shared memory: the
//! publisher writes each message once, whatever the number of subscribers, and wakes
//! only those that announced sleep. `shmlink` copies (`publish`, `recv`); `shmlink-zc`
//! is zero-copy (`loan` → fill → `publish`; `recv_ref` read in place). Subscribers wait
//! with the library's default policy: 20 µs of polling, 30 µs of yielding, then asleep
//! on their socket until the publisher's doorbell; a subscriber with a CPU to itself
//! polls for [`Ctx::spin`] instead of 20 µs, like every other method's.

use std::io;
use std::time::Duration;

use shmlink::{Policy, PubSubOptions, Publisher, Subscriber, WaitPolicy};

use super::super::{Ctx, Method, Prepared, Publish, PublishInPlace, Receive};
use crate::method::arg;
use crate::sys::err;

/// Ring slots: the run has one message in flight, so a small ring suffices.
const SLOTS: usize = 64;
/// Fewer slots where 64 would take more than this (messages over 1 MiB).
const MAX_RING: usize = 64 << 20;

pub struct Shmlink {
    zero_copy: bool,
}

pub const COPY: Shmlink = Shmlink { zero_copy: false };
pub const ZERO_COPY: Shmlink = Shmlink { zero_copy: true };

fn io_err(e: shmlink::Error) -> io::Error {
    err(e.to_string())
}

fn options(size: usize) -> PubSubOptions {
    let opts = PubSubOptions::default()
        .max_msg_size(size)
        .policy(Policy::Block)
        .stall_timeout(Duration::from_secs(5))
        .capacity(MAX_RING);
    if opts.configured_slots() > SLOTS {
        opts.slots(SLOTS)
    } else {
        opts
    }
}

struct Pub {
    publisher: Publisher,
    zero_copy: bool,
}

impl Publish for Pub {
    fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        self.publisher.publish(msg).map_err(io_err)
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
        let mut loan = self.publisher.loan(len).map_err(io_err)?;
        fill(&mut loan);
        loan.publish().map_err(io_err)
    }
}

struct Sub {
    subscriber: Subscriber,
    buf: Vec<u8>,
    zero_copy: bool,
}

impl Receive for Sub {
    fn recv(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        if self.zero_copy {
            let sample = self.subscriber.recv_ref().map_err(io_err)?;
            // SAFETY: the bench trusts its publisher (this same program) and runs the
            // zero-copy rows under `Policy::Block`, where the slot is left alone until
            // the sample drops unless we are detached — which `intact` reports below.
            read(unsafe { sample.as_slice() })?;
            return if sample.intact() {
                Ok(())
            } else {
                Err(io::Error::other(
                    "sample overwritten while it was read (detached)",
                ))
            };
        }
        let n = self.subscriber.recv(&mut self.buf).map_err(io_err)?;
        read(&self.buf[..n])
    }
}

impl Method for Shmlink {
    fn name(&self) -> &'static str {
        if self.zero_copy {
            "shmlink-zc"
        } else {
            "shmlink"
        }
    }

    fn about(&self) -> &'static str {
        if self.zero_copy {
            "shmlink::pubsub over shm:, zero-copy (loan, fill, publish; recv_ref in place)"
        } else {
            "shmlink::pubsub over shm:, copying publish and recv"
        }
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let addr = format!("shm:{}", c.tag);
        let publisher = Publisher::bind(&addr, &options(c.size)).map_err(io_err)?;
        let (n, zero_copy) = (c.subscribers, self.zero_copy);
        Ok(Prepared::same_args(n, vec![addr], move |timeout| {
            publisher.wait_for_subscribers(n, timeout).map_err(io_err)?;
            Ok(Box::new(Pub {
                publisher,
                zero_copy,
            }) as Box<dyn Publish>)
        }))
    }

    fn subscribe(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Receive>> {
        let addr = arg(args, 0, "address")?;
        let wait = WaitPolicy {
            spin: c.spin,
            ..WaitPolicy::default()
        };
        let subscriber =
            Subscriber::connect(addr, &options(c.size).wait_policy(wait)).map_err(io_err)?;
        Ok(Box::new(Sub {
            subscriber,
            buf: vec![0u8; c.size],
            zero_copy: self.zero_copy,
        }))
    }
}
