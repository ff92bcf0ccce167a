//! A publisher that sends its topic off the host itself: each message goes into the
//! local shared-memory ring first, for the host's own subscribers, then to Zenoh under
//! `<prefix><topic>` with the bridge's attachment ([`Header`]), from the publishing
//! thread. Remote hosts import it with their bridge as if a bridge had exported it.
//! While the topic has no local subscriber and keeps no history for late joiners, the
//! local copy is skipped: the message only goes to Zenoh (a subscriber that joins
//! starts with the next message, as it would have had it joined a moment later).
//!
//! What it saves against a plain publisher and an exporting bridge: the bridge's hop,
//! a local subscription that has to be woken for every message (on a machine where a
//! wake-up costs tens of microseconds, the largest part of the bridged path's latency
//! above Zenoh's own; docs/zenoh.md). What it costs: the publishing thread does Zenoh's
//! put (a copy into Zenoh's buffers and its send), so a publish takes about as long as
//! a Zenoh put, and the process carries a Zenoh session.
//!
//! The local topic is marked exported ([`PubSubOptions::exported`]): bridges on the host
//! leave it alone, so each message leaves the host once.

use std::sync::Arc;

use shmlink::{PubSubOptions, Publisher};
use zenoh::bytes::ZBytes;
use zenoh::{Session, Wait};

use crate::bridge::{declare_export, open_session, random_id, Counters, Error};
use crate::config::BridgeConfig;
use crate::header::Header;
use crate::status::StatusFile;

/// A local publisher whose messages also go to Zenoh (see the module docs).
///
/// ```no_run
/// use shmlink::PubSubOptions;
/// use shmlink_zenoh::{BridgeConfig, ExportingPublisher};
/// let config = BridgeConfig {
///     listen: vec!["tcp/0.0.0.0:7447".into()],
///     ..BridgeConfig::default()
/// };
/// let mut p = ExportingPublisher::open(&config, "sensors.temp", &PubSubOptions::default())?;
/// p.publish(b"21.5")?;
/// p.close()?;
/// # Ok::<(), shmlink_zenoh::Error>(())
/// ```
pub struct ExportingPublisher {
    local: Publisher,
    remote: zenoh::pubsub::Publisher<'static>,
    key: String,
    head: Header,
    counters: Arc<Counters>,
    /// The local topic keeps history for late joiners: every message goes into its
    /// ring, read or not.
    keeps_history: bool,
    /// The session it opened itself ([`open`](Self::open)), closed with it.
    own_session: Option<Session>,
    status: StatusFile,
}

impl ExportingPublisher {
    /// Binds `shm:<topic>` (with `opts`, marked exported) and declares the Zenoh
    /// publisher of `<prefix><topic>` on `session`, an open Zenoh session of the caller's.
    /// `Block` topics are put with [`CongestionControl::Block`](zenoh::qos::CongestionControl::Block) (a slow network holds
    /// the publisher, as a slow local subscriber does), `Overwrite` topics with
    /// [`CongestionControl::Drop`](zenoh::qos::CongestionControl::Drop).
    pub fn new(
        session: &Session,
        topic: &str,
        opts: &PubSubOptions,
        prefix: &str,
    ) -> Result<ExportingPublisher, Error> {
        let addr = format!("shm:{topic}");
        let local = Publisher::bind(&addr, &opts.clone().exported(true))
            .map_err(|e| Error(format!("publish {addr}: {e}")))?;
        let policy = local.policy();
        let key = format!("{prefix}{topic}");
        let remote = declare_export(session, &key, policy)?;
        let head = Header {
            origin: random_id(),
            seq: 0,
            policy,
            max_msg: u32::try_from(local.max_msg_size()).unwrap_or(u32::MAX),
            slots: u32::try_from(local.slots()).unwrap_or(0),
        };
        let counters = Arc::new(Counters::default());
        counters.set_state("exported by its publisher");
        let status = {
            let (c, topic, key) = (Arc::clone(&counters), topic.to_owned(), key.clone());
            StatusFile::start(head.origin, move || vec![c.bridged(true, &topic, &key)])
        };
        tracing::info!(topic, key, ?policy, "publishing and exporting");
        Ok(ExportingPublisher {
            local,
            remote,
            key,
            head,
            counters,
            keeps_history: opts.configured_history().is_some_and(|h| h > 0),
            own_session: None,
            status,
        })
    }

    /// Like [`new`](Self::new) on a Zenoh session of its own, made from `config`'s
    /// session settings (mode, endpoints, scouting, TLS, access control) and key prefix;
    /// its export and import lists are not used.
    pub fn open(
        config: &BridgeConfig,
        topic: &str,
        opts: &PubSubOptions,
    ) -> Result<ExportingPublisher, Error> {
        let session = open_session(config)?;
        let mut p = ExportingPublisher::new(&session, topic, opts, &config.prefix)?;
        p.own_session = Some(session);
        Ok(p)
    }

    /// Publishes `msg` to the local subscribers, then puts it to Zenoh (a copy into a
    /// buffer of Zenoh's; [`publish_vec`](Self::publish_vec) hands over one instead). A
    /// local failure (a `Block` subscriber stalled past the stall timeout is detached, not
    /// a failure) sends nothing; a failed put is reported after the local subscribers have
    /// the message.
    pub fn publish(&mut self, msg: &[u8]) -> Result<(), Error> {
        self.publish_with(msg, ZBytes::from)
    }

    /// Like [`publish`](Self::publish), and Zenoh sends `msg` itself: one copy fewer for
    /// a caller that has the message in a `Vec` it no longer needs.
    pub fn publish_vec(&mut self, msg: Vec<u8>) -> Result<(), Error> {
        self.publish_with(msg, ZBytes::from)
    }

    fn publish_with<M: AsRef<[u8]>>(
        &mut self,
        msg: M,
        payload: impl FnOnce(M) -> ZBytes,
    ) -> Result<(), Error> {
        let len = msg.as_ref().len();
        if self.keeps_history || self.local.subscriber_count() > 0 {
            self.local
                .publish(msg.as_ref())
                .map_err(|e| Error(format!("publish locally: {e}")))?;
        }
        let head = self.head.encode();
        self.head.seq += 1;
        self.remote
            .put(payload(msg))
            .attachment(head)
            .wait()
            .map_err(|e| Error(format!("put {}: {e}", self.key)))?;
        self.counters.count(1, len);
        Ok(())
    }

    /// The local publisher (its subscribers, statistics, geometry). Its `published`
    /// count leaves out the messages sent while nobody on the host subscribed (module
    /// docs); [`ExportingPublisher`]'s own count, in `shmlink ls`, has them all.
    pub fn local(&self) -> &Publisher {
        &self.local
    }

    /// The Zenoh key its messages are put to.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The id its attachments carry as their origin.
    pub fn id(&self) -> u128 {
        self.head.origin
    }

    /// Closes the local topic (its subscribers see the end), the Zenoh publisher and, if
    /// it opened it, the session.
    pub fn close(mut self) -> Result<(), Error> {
        self.status.stop();
        let ExportingPublisher {
            local,
            remote,
            own_session,
            ..
        } = self;
        let closed = local
            .close()
            .map_err(|e| Error(format!("close the local topic: {e}")));
        let _ = remote.undeclare().wait();
        if let Some(s) = own_session {
            let _ = s.close().wait();
        }
        closed
    }
}
