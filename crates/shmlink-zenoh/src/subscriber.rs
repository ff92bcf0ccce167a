//! A subscriber that brings its topic onto the host itself: Zenoh's receive thread hands
//! each message of `<prefix><topic>` to the caller's handler, and publishes it into the
//! local shared-memory topic `shm:<topic>` for the host's other subscribers, as an
//! importing bridge would. The mirror of [`ExportingPublisher`](crate::ExportingPublisher).
//!
//! What it saves against an importing bridge and a plain [`shmlink::Subscriber`]: the
//! bridge's hop, and the wake-up of a subscriber asleep in its receive (on a machine where
//! a wake-up costs tens of microseconds, the largest part of the bridged path's latency
//! above Zenoh's own; docs/zenoh.md), and at large sizes the copy through the ring. The
//! handler runs on Zenoh's thread: what it does holds up the topic (and, for `Block`
//! topics, the remote publisher), as a slow subscriber would.
//!
//! It is the host's importer of the topic: it binds `shm:<topic>` (marked exported, so
//! bridges on the host neither export it back nor import it again), and fails if the
//! topic already has a publisher on the host (subscribe to that one instead). Other
//! processes of the host subscribe to `shm:<topic>` as to any topic, so one copy of each
//! message crosses the network per host, however many subscribers. While the local topic
//! has no subscriber and keeps no history, the local copy is skipped.
//!
//! Every message is checked as the bridge checks it: its attachment's origin and sequence
//! number count what was lost on the way (from each origin), and a message larger than
//! the local topic's maximum is refused (counted, not handed over).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use shmlink::{PubSubOptions, Publisher};
use zenoh::sample::{Locality, Sample};
use zenoh::{Session, Wait};

use crate::bridge::{open_session, publish_payload, random_id, Counters, Error, Origins};
use crate::config::BridgeConfig;
use crate::header::Header;
use crate::status::StatusFile;
use crate::{Direction, TopicStats};

/// A handler of the messages an [`ImportingSubscriber`] receives.
type Handler = Box<dyn FnMut(&[u8]) + Send>;

/// A Zenoh subscriber that also imports its topic for the host (see the module docs).
///
/// ```no_run
/// use shmlink::PubSubOptions;
/// use shmlink_zenoh::{BridgeConfig, ImportingSubscriber};
/// let config = BridgeConfig {
///     connect: vec!["tcp/10.0.0.1:7447".into()],
///     ..BridgeConfig::default()
/// };
/// let opts = PubSubOptions::default().max_msg_size(4096);
/// let s = ImportingSubscriber::open(&config, "sensors.temp", &opts, |msg: &[u8]| {
///     println!("{} bytes", msg.len());
/// })?;
/// // ... later
/// s.close()?;
/// # Ok::<(), shmlink_zenoh::Error>(())
/// ```
pub struct ImportingSubscriber {
    remote: Option<zenoh::pubsub::Subscriber<()>>,
    inner: Arc<Inner>,
    topic: String,
    key: String,
    /// The session it opened itself ([`open`](Self::open)), closed with it.
    own_session: Option<Session>,
    status: StatusFile,
}

struct Inner {
    counters: Arc<Counters>,
    /// The local topic keeps history for late joiners: every message goes into its ring.
    keeps_history: bool,
    /// The local topic (gone once closed), the origins' sequence numbers and the
    /// handler, behind the lock Zenoh's callbacks take: one message at a time, in the
    /// same order for the handler and the local subscribers.
    state: Mutex<State>,
}

struct State {
    local: Option<Publisher>,
    origins: Origins,
    handler: Handler,
}

impl ImportingSubscriber {
    /// Binds `shm:<topic>` (with `opts`, marked exported) and subscribes to
    /// `<prefix><topic>` on `session`, an open Zenoh session of the caller's, with
    /// `handler` called on Zenoh's receive thread for each message.
    pub fn new(
        session: &Session,
        topic: &str,
        opts: &PubSubOptions,
        prefix: &str,
        handler: impl FnMut(&[u8]) + Send + 'static,
    ) -> Result<ImportingSubscriber, Error> {
        let addr = format!("shm:{topic}");
        let local = Publisher::bind(&addr, &opts.clone().exported(true))
            .map_err(|e| Error(format!("import into {addr}: {e}")))?;
        let key = format!("{prefix}{topic}");
        let counters = Arc::new(Counters::default());
        counters.set_state("imported by its subscriber");
        let inner = Arc::new(Inner {
            counters: Arc::clone(&counters),
            keeps_history: opts.configured_history().is_some_and(|h| h > 0),
            state: Mutex::new(State {
                local: Some(local),
                origins: Origins::default(),
                handler: Box::new(handler),
            }),
        });
        let i = Arc::clone(&inner);
        let remote = session
            .declare_subscriber(key.clone())
            .allowed_origin(Locality::Remote)
            .callback(move |sample| i.deliver(sample))
            .wait()
            .map_err(|e| Error(format!("subscribe to {key}: {e}")))?;
        let status = {
            let (c, topic, key) = (counters, topic.to_owned(), key.clone());
            StatusFile::start(random_id(), move || vec![c.bridged(false, &topic, &key)])
        };
        tracing::info!(topic, key, "subscribing and importing");
        Ok(ImportingSubscriber {
            remote: Some(remote),
            inner,
            topic: topic.to_owned(),
            key,
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
        handler: impl FnMut(&[u8]) + Send + 'static,
    ) -> Result<ImportingSubscriber, Error> {
        let session = open_session(config)?;
        let mut s = ImportingSubscriber::new(&session, topic, opts, &config.prefix, handler)?;
        s.own_session = Some(session);
        Ok(s)
    }

    /// The Zenoh key it subscribes to.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Its counters: messages handed over, their bytes, and what was lost on the way or
    /// refused (as a bridge's import counts them).
    pub fn stats(&self) -> TopicStats {
        let t = self.inner.counters.bridged(false, &self.topic, &self.key);
        TopicStats {
            topic: t.topic,
            direction: Direction::Import,
            key: t.key,
            messages: t.messages,
            bytes: t.bytes,
            dropped: t.dropped,
            state: t.state,
        }
    }

    /// Undeclares the Zenoh subscriber, closes the local topic (its subscribers see the
    /// end) and, if it opened it, the session.
    pub fn close(mut self) -> Result<(), Error> {
        self.status.stop();
        if let Some(r) = self.remote.take() {
            let _ = r.undeclare().wait();
        }
        // Waits for a callback still running; a later one finds no topic and returns.
        let local = self.inner.lock().local.take();
        let closed = local.map_or(Ok(()), |p| {
            p.close()
                .map_err(|e| Error(format!("close the local topic: {e}")))
        });
        if let Some(s) = self.own_session.take() {
            let _ = s.close().wait();
        }
        closed
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Zenoh's callback: counts the origin's gap, publishes locally if anyone reads the
    /// topic, then hands the message to the handler.
    fn deliver(&self, sample: Sample) {
        let head = sample
            .attachment()
            .and_then(|a| Header::decode(&a.to_bytes()));
        let payload = sample.payload();
        let c = &self.counters;
        let mut state = self.lock();
        let State {
            local: Some(local),
            origins,
            handler,
        } = &mut *state
        else {
            return;
        };
        // The counters are written only here, under the lock: no read-modify-write.
        // Saturating: a hostile sequence number may claim almost 2^64 lost messages.
        let lose = |k: u64| {
            let n = c.dropped.load(Ordering::Relaxed).saturating_add(k);
            c.dropped.store(n, Ordering::Relaxed)
        };
        if let Some(h) = head {
            lose(origins.see(h.origin, h.seq));
        }
        let len = payload.len();
        if len > local.max_msg_size() {
            lose(1);
            tracing::debug!(key = %sample.key_expr(), len, "refused: larger than the topic's maximum");
            return;
        }
        if self.keeps_history || local.subscriber_count() > 0 {
            if let Err(e) = publish_payload(local, payload) {
                lose(1);
                tracing::warn!(key = %sample.key_expr(), error = %e, "local publish failed");
            }
        }
        // Counted first: what the handler has is in the counters it may read.
        c.count(1, len);
        handler(&payload.to_bytes());
    }
}
