//! Options of a topic: its ring, its policy, and the transport options around it.

use std::time::Duration;

use super::ring::{Geometry, MAX_SUBSCRIBERS, PAYLOAD_OFFSET};
pub use super::ring::{MAX_SLOTS, MAX_TOPIC_BYTES};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Options, WaitPolicy, MAX_MSG_SIZE_LIMIT};

/// What the publisher does when the ring is full, i.e. when the oldest message in it
/// has not been read by every subscriber yet.
///
/// `Send`, `Sync`, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The publisher waits for the slowest live subscriber (lossless). A subscriber the
    /// publisher waits for must read, within [`PubSubOptions::stall_timeout`], every
    /// message that was published when the wait began; otherwise it is detached: its
    /// next `recv` fails with [`ErrorKind::Detached`], and it may subscribe again.
    Block,
    /// The publisher never waits: it overwrites the oldest message. A subscriber that
    /// fell behind gets [`ErrorKind::Lagged`] once, with the exact number of messages it
    /// lost ([`Error::missed`]), and then continues with the oldest message still in the
    /// ring.
    Overwrite,
}

/// Slots a topic has unless told otherwise.
pub const DEFAULT_SLOTS: usize = 1024;
/// Largest message unless told otherwise: a slot of 4 KiB with its 16-byte header.
pub const DEFAULT_MAX_MSG: usize = 4096 - PAYLOAD_OFFSET;

/// Options for [`Publisher::bind`](crate::Publisher::bind) and
/// [`Subscriber::connect`](crate::Subscriber::connect).
///
/// The ring is `slots` fixed-size slots, each large enough for the largest message
/// (`max_msg_size`, rounded up with a 16-byte header to a multiple of 64 bytes). Set
/// the number of slots directly or through a byte budget ([`capacity`](Self::capacity)).
/// The options about the ring, the policy and the stall timeout are the publisher's;
/// a subscriber learns them from the publisher. [`history`](Self::history) and
/// [`max_msg_size`](Self::max_msg_size) are meaningful on both sides. Access control,
/// timeouts and the wait policy come from the [`Options`] set with
/// [`options`](Self::options).
///
/// Like [`Options`], a by-value builder whose setters have the plain names; values read
/// back through `configured_NAME` (defaults and [`capacity`](Self::capacity) applied).
/// `Send`, `Sync`, `Clone`.
///
/// ```
/// use std::time::Duration;
/// use shmlink::{Policy, PubSubOptions};
/// let opts = PubSubOptions::default()
///     .slots(4096)
///     .max_msg_size(256)
///     .policy(Policy::Block)
///     .stall_timeout(Duration::from_millis(500))
///     .history(100);
/// assert_eq!(opts.configured_slots(), 4096);
/// assert_eq!(opts.slot_size(), 320); // 16-byte header + 256, rounded up to 64
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubSubOptions {
    pub(crate) base: Options,
    pub(crate) slots: usize,
    pub(crate) capacity: Option<usize>,
    pub(crate) max_msg_size: Option<usize>,
    pub(crate) policy: Policy,
    pub(crate) stall_timeout: Duration,
    pub(crate) history: Option<u64>,
    pub(crate) max_subscribers: usize,
    pub(crate) max_remote_subscribers: Option<usize>,
    pub(crate) allow_writable_topic: bool,
    pub(crate) resubscribe: bool,
    pub(crate) recv_timeout: Option<Duration>,
    pub(crate) exported: bool,
    pub(crate) background: bool,
}

impl Default for PubSubOptions {
    fn default() -> Self {
        PubSubOptions {
            base: Options::default(),
            slots: DEFAULT_SLOTS,
            capacity: None,
            max_msg_size: None,
            policy: Policy::Block,
            stall_timeout: Duration::from_secs(1),
            history: None,
            max_subscribers: MAX_SUBSCRIBERS,
            max_remote_subscribers: None,
            allow_writable_topic: false,
            resubscribe: false,
            recv_timeout: None,
            exported: false,
            background: false,
        }
    }
}

impl PubSubOptions {
    /// Publisher: the number of slots (messages the ring holds), a power of two in
    /// `2..=2^24` (default 1024). Overrides an earlier [`capacity`](Self::capacity).
    pub fn slots(mut self, n: usize) -> Self {
        self.slots = n;
        self.capacity = None;
        self
    }

    /// Publisher: a byte budget for the ring instead of a slot count: the largest
    /// power-of-two number of slots whose slots fit in `bytes` (at least 2).
    pub fn capacity(mut self, bytes: usize) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// Publisher: the largest message (default 4080 bytes: 4 KiB slots). Subscriber:
    /// the largest message it accepts; it refuses to subscribe to a topic whose maximum
    /// is larger (default: any).
    pub fn max_msg_size(mut self, bytes: usize) -> Self {
        self.max_msg_size = Some(bytes);
        self
    }

    /// Publisher: what happens when the ring is full (default [`Policy::Block`]).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Publisher, [`Policy::Block`]: how long a subscriber that holds the publisher up
    /// has to catch up (default 1 s). When the publisher finds the ring full because of
    /// a subscriber, that subscriber must read, within this time, every message that was
    /// published at that moment (at most `slots`) — moving its cursor a little does not
    /// restart the clock — or it is detached the next time it holds the publisher up. So
    /// a subscriber the publisher waits for must sustain `slots` messages per
    /// `stall_timeout` (a remote one: its network too), and no subscriber, hostile or
    /// slow, holds the publisher below that rate; raise it for slow consumers. A window
    /// whose subscriber got out of the way and held nobody up for a whole timeout is
    /// forgotten. A subscriber that dies is dropped at once, without waiting for this.
    pub fn stall_timeout(mut self, t: Duration) -> Self {
        self.stall_timeout = t;
        self
    }

    /// Publisher: how many past messages a late joiner may replay (default 0: it starts
    /// with the next message published); at most `slots - 1`, and never more than the
    /// ring still holds. Subscriber: how many it wants (default: all the publisher
    /// offers; 0: start with the next message).
    pub fn history(mut self, messages: u64) -> Self {
        self.history = Some(messages);
        self
    }

    /// Publisher: most subscribers at once (`1..=128`, default 128); more are refused
    /// with [`ErrorKind::ConnectionRefused`] until one leaves.
    pub fn max_subscribers(mut self, n: usize) -> Self {
        self.max_subscribers = n;
        self
    }

    /// Publisher of a topic bound at `tcp:`, `tls:` or `auto:`: most subscribers at once
    /// that are served over the network (`0..=max_subscribers`; default half of
    /// [`max_subscribers`](Self::max_subscribers), rounded down: 64 of 128). Each remote
    /// subscriber takes one of the topic's slots, and any host that reaches the port can
    /// subscribe unless TLS client certificates are required; the bound keeps the other
    /// slots for local subscribers, so a flood of network subscriptions cannot lock them
    /// out. A remote beyond it is refused with
    /// [`ErrorKind::ConnectionRefused`] and a reason naming this option, until one leaves.
    /// `auto:` subscribers on the publisher's kernel attach over shared memory and count
    /// as local. Setting it to `max_subscribers` lets remotes take every slot.
    pub fn max_remote_subscribers(mut self, n: usize) -> Self {
        self.max_remote_subscribers = Some(n);
        self
    }

    /// Publisher: on a kernel without `F_SEAL_FUTURE_WRITE` (Linux before 5.1), create the
    /// topic anyway (default `false`). Without the seal the kernel cannot stop a
    /// subscriber from mapping the topic writable: **any subscriber can then write the
    /// topic**, changing the messages every other subscriber reads and the slot a
    /// [`Loan`](crate::Loan) is filling. By default [`Publisher::bind`](crate::Publisher::bind)
    /// refuses such a kernel with [`ErrorKind::Other`] and a message naming this option;
    /// set it only when every subscriber is trusted. On kernels with the seal it changes
    /// nothing.
    pub fn allow_writable_topic(mut self, allow: bool) -> Self {
        self.allow_writable_topic = allow;
        self
    }

    /// Subscriber: when the publisher closes the topic, dies or detaches this subscriber,
    /// subscribe again to whichever publisher binds the same address next, as a ZeroMQ
    /// `SUB` socket reconnects (default `false`: the subscription ends with
    /// [`ErrorKind::EndOfStream`], [`ErrorKind::ConnectionReset`] or
    /// [`ErrorKind::Detached`]).
    ///
    /// The blocking receives ([`Subscriber::recv`](crate::Subscriber::recv),
    /// [`recv_vec`](crate::Subscriber::recv_vec) and the iterator) wait for the next
    /// publisher, retrying every 10–250 ms, then report
    /// [`ErrorKind::Resubscribed`] once, so the gap is visible, and go on with the new
    /// publisher's messages. In non-blocking mode, and for
    /// [`recv_ref`](crate::Subscriber::recv_ref), the end is reported as usual and
    /// [`Subscriber::resubscribe`](crate::Subscriber::resubscribe) makes one attempt; the
    /// subscriber's fd changes with the subscription, so an event loop registers the new
    /// one (the tokio subscriber reports the end too: make a new one).
    pub fn resubscribe(mut self, resubscribe: bool) -> Self {
        self.resubscribe = resubscribe;
        self
    }

    /// Subscriber: the longest a blocking receive waits for a message (default: no
    /// limit). Past it the receive fails with [`ErrorKind::TimedOut`] and the
    /// subscription stays as it was, so a thread that also watches something else (a
    /// stop flag) needs neither non-blocking mode nor its own `poll`, and keeps the wait
    /// policy's spin (non-blocking receives announce sleep at every empty look). The wait
    /// for a new publisher under [`resubscribe`](Self::resubscribe) is not bounded by it.
    pub fn recv_timeout(mut self, t: Duration) -> Self {
        self.recv_timeout = Some(t);
        self
    }

    /// Publisher: says that the publishing process itself sends every message of the topic
    /// off the host (as `shmlink_zenoh::ExportingPublisher` does; default `false`). The
    /// topic's status carries the mark ([`TopicStatus::exported`](crate::inspect::TopicStatus::exported)):
    /// bridges leave such a topic alone, so its messages leave the host once, and
    /// `shmlink ls` shows it. Nothing else changes locally.
    pub fn exported(mut self, exported: bool) -> Self {
        self.exported = exported;
        self
    }

    /// Subscriber: a subscriber that can wait (default `false`): a forwarder, a recorder,
    /// a bridge such as `shmlink-zenoh`. When a message finds several subscribers asleep,
    /// the publisher rings the others' doorbells first and this one's last, so its
    /// doorbell (a system call on the publishing thread) does not delay theirs. Nothing
    /// else changes: it gets every message as any subscriber does, and under
    /// [`Policy::Block`] it holds the publisher up like any other. A publisher of an
    /// earlier version ignores the request, and so does a subscription over the network
    /// (the publisher's fan-out thread reads the ring for it).
    pub fn background(mut self, background: bool) -> Self {
        self.background = background;
        self
    }

    /// Whether a subscriber subscribes again when its publisher goes away (see
    /// [`resubscribe`](Self::resubscribe)).
    pub fn configured_resubscribe(&self) -> bool {
        self.resubscribe
    }

    /// The history these options set (see [`history`](Self::history)): `None` if not
    /// set (a publisher keeps none; a subscriber takes all the publisher offers).
    pub fn configured_history(&self) -> Option<u64> {
        self.history
    }

    /// The most remote subscribers these options allow (see
    /// [`max_remote_subscribers`](Self::max_remote_subscribers)).
    pub fn configured_max_remote_subscribers(&self) -> usize {
        self.max_remote_subscribers
            .unwrap_or(self.max_subscribers / 2)
    }

    /// The transport options: access control (`allow_uids`, `allow_gids`, the
    /// rendezvous directory's mode), connect and handshake timeouts, and the wait policy
    /// of blocking calls. Their ring and message sizes do not apply to a topic.
    pub fn options(mut self, options: Options) -> Self {
        self.base = options;
        self
    }

    /// Shorthand for the wait policy in [`options`](Self::options).
    pub fn wait_policy(mut self, policy: WaitPolicy) -> Self {
        self.base = self.base.wait_policy(policy);
        self
    }

    /// The slot count the options give: [`slots`](Self::slots), or what
    /// [`capacity`](Self::capacity) makes of its byte budget.
    pub fn configured_slots(&self) -> usize {
        match self.capacity {
            None => self.slots,
            Some(bytes) => {
                let fit = (bytes / self.slot_size()).clamp(2, MAX_SLOTS);
                1 << fit.ilog2()
            }
        }
    }

    /// The largest message [`max_msg_size`](Self::max_msg_size) set (the publisher's
    /// default if unset).
    pub fn configured_max_msg_size(&self) -> usize {
        self.max_msg_size.unwrap_or(DEFAULT_MAX_MSG)
    }

    /// Bytes per slot: the 16-byte header and the largest message, rounded up to 64.
    pub fn slot_size(&self) -> usize {
        (PAYLOAD_OFFSET + self.configured_max_msg_size()).next_multiple_of(64)
    }

    /// The policy [`policy`](Self::policy) set (or the default).
    pub fn configured_policy(&self) -> Policy {
        self.policy
    }

    /// The transport options [`options`](Self::options) set.
    pub fn configured_options(&self) -> &Options {
        &self.base
    }

    /// The ring these options describe.
    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            slots: self.configured_slots() as u64,
            slot_size: self.slot_size(),
            max_msg: self.configured_max_msg_size(),
        }
    }

    /// Checks every option; the error names the option and the allowed range.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::new(ErrorKind::InvalidInput, msg));
        self.base.validate()?;
        let max_msg = self.configured_max_msg_size();
        if max_msg > MAX_MSG_SIZE_LIMIT {
            return bad(format!(
                "option max_msg_size = {max_msg}: must be at most {MAX_MSG_SIZE_LIMIT}"
            ));
        }
        let slots = self.configured_slots();
        if !slots.is_power_of_two() || !(2..=MAX_SLOTS).contains(&slots) {
            return bad(format!(
                "option slots = {slots}: must be a power of two in 2..={MAX_SLOTS}"
            ));
        }
        if slots.saturating_mul(self.slot_size()) > MAX_TOPIC_BYTES {
            return bad(format!(
                "options slots = {slots} and max_msg_size = {max_msg} make a ring of more than {MAX_TOPIC_BYTES} bytes"
            ));
        }
        if !(1..=MAX_SUBSCRIBERS).contains(&self.max_subscribers) {
            return bad(format!(
                "option max_subscribers = {}: must be in 1..={MAX_SUBSCRIBERS}",
                self.max_subscribers
            ));
        }
        if let Some(n) = self.max_remote_subscribers {
            if n > self.max_subscribers {
                return bad(format!(
                    "option max_remote_subscribers = {n}: must be at most max_subscribers = {}",
                    self.max_subscribers
                ));
            }
        }
        if self.stall_timeout.is_zero() {
            return bad("option stall_timeout must be non-zero".into());
        }
        if self.recv_timeout.is_some_and(|t| t.is_zero()) {
            return bad("option recv_timeout must be non-zero".into());
        }
        Ok(())
    }

    /// Checks the options a publisher uses beyond [`validate`](Self::validate).
    pub(crate) fn validate_publisher(&self) -> Result<()> {
        self.validate()?;
        let slots = self.configured_slots() as u64;
        let history = self.publisher_history();
        if history >= slots {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("option history = {history}: must be below the slot count {slots}"),
            ));
        }
        Ok(())
    }
}

impl PubSubOptions {
    /// Past messages a publisher keeps for late joiners.
    pub(crate) fn publisher_history(&self) -> u64 {
        self.history.unwrap_or(0)
    }

    /// Past messages a subscriber asks for (`u64::MAX`: all the publisher offers).
    pub(crate) fn subscriber_history(&self) -> u64 {
        self.history.unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_name_the_option() {
        for (opts, name) in [
            (PubSubOptions::default().slots(3), "slots"),
            (PubSubOptions::default().slots(1), "slots"),
            (
                PubSubOptions::default().max_subscribers(0),
                "max_subscribers",
            ),
            (
                PubSubOptions::default().max_subscribers(129),
                "max_subscribers",
            ),
            (
                PubSubOptions::default()
                    .max_subscribers(4)
                    .max_remote_subscribers(5),
                "max_remote_subscribers",
            ),
            (
                PubSubOptions::default().stall_timeout(Duration::ZERO),
                "stall_timeout",
            ),
            (
                PubSubOptions::default().max_msg_size(usize::MAX),
                "max_msg_size",
            ),
            (
                PubSubOptions::default()
                    .slots(1 << 20)
                    .max_msg_size(1 << 20),
                "slots",
            ),
        ] {
            let e = opts.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.to_string().contains(name), "{e}");
        }
        let e = PubSubOptions::default()
            .slots(8)
            .history(8)
            .validate_publisher()
            .unwrap_err();
        assert!(e.to_string().contains("history"), "{e}");
        PubSubOptions::default().validate_publisher().unwrap();
    }

    #[test]
    fn remote_subscribers_leave_local_slots_by_default() {
        let o = PubSubOptions::default();
        assert_eq!(o.configured_max_remote_subscribers(), MAX_SUBSCRIBERS / 2);
        let o = o.max_subscribers(4);
        assert_eq!(o.configured_max_remote_subscribers(), 2);
        assert_eq!(
            o.max_remote_subscribers(4)
                .configured_max_remote_subscribers(),
            4
        );
    }

    #[test]
    fn capacity_picks_a_power_of_two_of_slots() {
        let o = PubSubOptions::default().max_msg_size(48).capacity(1000);
        assert_eq!(o.slot_size(), 64);
        assert_eq!(o.configured_slots(), 8); // 15 fit, 8 is the power of two below
        assert_eq!(o.clone().capacity(10).configured_slots(), 2);
        assert_eq!(o.slots(64).configured_slots(), 64);
    }
}
