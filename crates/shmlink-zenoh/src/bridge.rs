//! The bridge: exports local topics to Zenoh and imports Zenoh keys into local topics.
//!
//! - **Out** (local → Zenoh): a scanner looks at the rendezvous directory every
//!   [`BridgeConfig::scan_interval`] (with [`shmlink::inspect()`]) for topics on the
//!   export list whose publisher is not this bridge, and starts one exporter thread per
//!   topic (not those whose publisher exports them itself, [`PubSubOptions::exported`]):
//!   a shared-memory [`Subscriber`] that puts each message to `<prefix><topic>`
//!   with a [`Header`] attachment. `Block` topics are sent with
//!   [`CongestionControl::Block`], `Overwrite` topics with [`CongestionControl::Drop`].
//!   One copy per message leaves the host, however many local subscribers the topic has.
//! - **In** (Zenoh → local): one Zenoh subscriber per import pattern (remote origins
//!   only); its callback publishes each message straight into the key's local topic,
//!   whose [`Publisher`] it creates at the first message (with the origin's policy,
//!   slots and largest message). No queue and no thread in between: a `Block` topic
//!   whose local subscribers are behind makes Zenoh's receive path wait (back-pressure,
//!   bounded by the stall timeout).
//! - **No loops**: a bridge never exports a topic it publishes locally (it imported it),
//!   never receives its own puts (Zenoh `Locality::Remote`), and drops messages whose
//!   attachment names it as the origin. So with bridges on any number of hosts, in a
//!   line or a triangle, a message crosses from its origin host to each other host once
//!   and is never sent on again by a bridge.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shmlink::inspect::{BridgedTopic, SocketState, DEFAULT_INSPECT_TIMEOUT};
use shmlink::{ErrorKind, Policy, PubSubOptions, Publisher, Subscriber};
use zenoh::bytes::ZBytes;
use zenoh::qos::CongestionControl;
use zenoh::sample::{Locality, Sample};
use zenoh::{Session, Wait};

use crate::config::BridgeConfig;
use crate::header::Header;
use crate::status::StatusFile;

/// A bridge's error: what failed, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Which way a bridged topic goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Local topic → Zenoh.
    Export,
    /// Zenoh → local topic.
    Import,
}

/// The counters of one bridged topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicStats {
    /// The local topic's name.
    pub topic: String,
    /// Which way.
    pub direction: Direction,
    /// The Zenoh key.
    pub key: String,
    /// Messages bridged (put to Zenoh, or published locally).
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Export: messages the bridge's local subscription lost (`Overwrite` lag, exact).
    /// Import: messages missing in the origins' sequences (dropped on the way), plus
    /// messages refused (larger than the local topic's maximum, or the local topic could
    /// not be created).
    pub dropped: u64,
    /// A word on the topic's state: `active`, or why it stopped.
    pub state: String,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) messages: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) state: Mutex<String>,
}

impl Counters {
    pub(crate) fn set_state(&self, s: impl Into<String>) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s.into();
    }

    /// Adds `messages` and `bytes`, for the counters' only writer (an exporting
    /// publisher, or a callback under its importer's lock): no read-modify-write needed.
    pub(crate) fn count(&self, messages: u64, bytes: usize) {
        let add = |n: &AtomicU64, k: u64| n.store(n.load(Ordering::Relaxed) + k, Ordering::Relaxed);
        add(&self.messages, messages);
        add(&self.bytes, bytes as u64);
    }

    /// What `shmlink ls` shows of the topic: these counters, now.
    pub(crate) fn bridged(&self, export: bool, topic: &str, key: &str) -> BridgedTopic {
        BridgedTopic {
            export,
            topic: topic.to_owned(),
            key: key.to_owned(),
            messages: self.messages.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            state: self.state.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

/// An imported topic: its local publisher (gone once the bridge closes it) and the last
/// sequence number seen from each origin, behind one lock that Zenoh's callbacks take.
struct Importer {
    counters: Arc<Counters>,
    state: Mutex<(Option<Publisher>, Origins)>,
}

/// At most this many origins of one imported topic are remembered besides the latest
/// (each publisher that restarts comes back with a new id): the longest unseen is
/// forgotten first, and a message from it later starts its count afresh.
const MAX_ORIGINS: usize = 256;

/// The last sequence number seen from each origin of an imported topic, to count what
/// was lost on the way. The latest origin is kept apart, so a topic with one publisher
/// (the usual case) costs no hashing per message.
#[derive(Default)]
pub(crate) struct Origins {
    latest: Option<(u128, u64)>,
    /// Other origins: last sequence number, and when they were last the latest.
    others: HashMap<u128, (u64, u64)>,
    tick: u64,
}

impl Origins {
    /// Records message `seq` of `origin`; returns how many of its messages before it
    /// were never seen (0 for a first, repeated or earlier number: whatever the
    /// attachment says, this neither overflows nor counts twice).
    pub(crate) fn see(&mut self, origin: u128, seq: u64) -> u64 {
        let prev = match self.latest {
            Some((o, s)) if o == origin => Some(s),
            latest => {
                if let Some((o, s)) = latest {
                    self.keep(o, s);
                }
                self.others.remove(&origin).map(|(s, _)| s)
            }
        };
        self.latest = Some((origin, seq));
        prev.and_then(|p| seq.checked_sub(p))
            .map_or(0, |d| d.saturating_sub(1))
    }

    fn keep(&mut self, origin: u128, seq: u64) {
        self.tick += 1;
        if self.others.len() >= MAX_ORIGINS && !self.others.contains_key(&origin) {
            let oldest = self
                .others
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(o, _)| *o);
            if let Some(o) = oldest {
                self.others.remove(&o);
            }
        }
        self.others.insert(origin, (seq, self.tick));
    }
}

thread_local! {
    /// The importer of the last key this Zenoh thread delivered, with its bridge's id:
    /// the next message of that key skips the `imported` map (its lock and hash). It may
    /// outlive its bridge; a closed importer publishes nothing.
    static LAST_IMPORT: RefCell<Option<(u128, String, Arc<Importer>)>> =
        const { RefCell::new(None) };
}

type Registry = Mutex<BTreeMap<(String, bool), (String, Arc<Counters>)>>;

struct Shared {
    id: u128,
    config: BridgeConfig,
    session: Session,
    stop: AtomicBool,
    stats: Registry,
    /// Topics this bridge publishes locally (imported): never exported. `Err(when)`:
    /// the local topic could not be made then (most often: a local publisher has the
    /// name, and the topic is exported instead); its messages are counted as dropped,
    /// and the first one after [`IMPORT_RETRY`] tries again.
    imported: Mutex<HashMap<String, Result<Arc<Importer>, Instant>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn counters(&self, topic: &str, direction: Direction) -> Arc<Counters> {
        let key = format!("{}{topic}", self.config.prefix);
        let mut m = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        m.entry((topic.to_owned(), direction == Direction::Import))
            .or_insert_with(|| (key, Arc::new(Counters::default())))
            .1
            .clone()
    }

    fn stats(&self) -> Vec<TopicStats> {
        let m = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        m.iter()
            .map(|((topic, import), (key, c))| TopicStats {
                topic: topic.clone(),
                direction: if *import {
                    Direction::Import
                } else {
                    Direction::Export
                },
                key: key.clone(),
                messages: c.messages.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
                dropped: c.dropped.load(Ordering::Relaxed),
                state: c.state.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            })
            .collect()
    }

    fn spawn(self: &Arc<Self>, name: String, f: impl FnOnce() + Send + 'static) {
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .expect("spawn a bridge thread");
        let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|h| !h.is_finished());
        t.push(handle);
    }
}

/// A running bridge (see the module docs). Stops on [`close`](Self::close) or drop.
pub struct Bridge {
    shared: Arc<Shared>,
    subscribers: Vec<zenoh::pubsub::Subscriber<()>>,
    status: StatusFile,
}

/// A Zenoh session made from `config`'s session settings (mode, endpoints, scouting,
/// TLS, access control).
pub(crate) fn open_session(config: &BridgeConfig) -> Result<Session, Error> {
    let zconfig = config.zenoh_config().map_err(Error)?;
    zenoh::open(zconfig)
        .wait()
        .map_err(|e| Error(format!("open the Zenoh session: {e}")))
}

pub(crate) fn random_id() -> u128 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    let a = h.finish();
    let mut h = RandomState::new().build_hasher();
    h.write_u64(a);
    (u128::from(a) << 64) | u128::from(h.finish())
}

/// A topic name as the library accepts it (letters, digits and `-_.+@=,`), at most 100
/// bytes; anything else from the network is refused.
fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.+@=,".contains(c))
}

impl Bridge {
    /// Opens the Zenoh session and starts bridging.
    pub fn open(config: BridgeConfig) -> Result<Bridge, Error> {
        if let Some(w) = config.tls_endpoint_warning() {
            tracing::warn!("{w}");
        }
        let session = open_session(&config)?;
        let id = random_id();
        tracing::info!(id = format!("{id:032x}"), zid = %session.zid(), "bridge open");
        let shared = Arc::new(Shared {
            id,
            config,
            session,
            stop: AtomicBool::new(false),
            stats: Mutex::new(BTreeMap::new()),
            imported: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let mut subscribers = Vec::new();
        for p in &shared.config.import {
            let key = p.key_expr(&shared.config.prefix);
            let s = Arc::clone(&shared);
            let sub = shared
                .session
                .declare_subscriber(key.clone())
                .allowed_origin(Locality::Remote)
                .callback(move |sample| deliver(&s, sample))
                .wait()
                .map_err(|e| Error(format!("subscribe to {key}: {e}")))?;
            tracing::info!(key, "importing");
            subscribers.push(sub);
        }
        if !shared.config.export.is_empty() {
            let s = Arc::clone(&shared);
            shared.spawn("shmlink-zenoh-scan".into(), move || scan(&s));
        }
        let s = Arc::clone(&shared);
        let status = StatusFile::start(id, move || {
            s.stats()
                .into_iter()
                .map(|t| BridgedTopic {
                    export: t.direction == Direction::Export,
                    topic: t.topic,
                    key: t.key,
                    messages: t.messages,
                    bytes: t.bytes,
                    dropped: t.dropped,
                    state: t.state,
                })
                .collect()
        });
        Ok(Bridge {
            shared,
            subscribers,
            status,
        })
    }

    /// This bridge's id, as its attachments carry it.
    pub fn id(&self) -> u128 {
        self.shared.id
    }

    /// The Zenoh session (to read its id or its peers).
    pub fn session(&self) -> &Session {
        &self.shared.session
    }

    /// The counters of every topic bridged so far, by topic name and direction.
    pub fn stats(&self) -> Vec<TopicStats> {
        self.shared.stats()
    }

    /// Stops every thread, closes the local topics it published and the Zenoh session.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        for s in self.subscribers.drain(..) {
            let _ = s.undeclare().wait();
        }
        let imported: Vec<_> = self
            .shared
            .imported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .filter_map(|(_, i)| i.ok())
            .collect();
        for i in imported {
            // Waits for a callback still publishing into it.
            let publisher = i.state.lock().unwrap_or_else(|e| e.into_inner()).0.take();
            if let Some(p) = publisher {
                let _ = p.close();
            }
            i.counters.set_state("bridge closed");
        }
        let threads: Vec<_> = self
            .shared
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for t in threads {
            let _ = t.join();
        }
        self.status.stop();
        let _ = self.shared.session.close().wait();
        tracing::info!("bridge closed");
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// ---------------------------------------------------------------------------------------
// Out: local topics to Zenoh.

fn scan(shared: &Arc<Shared>) {
    let mut running: HashMap<String, Arc<AtomicBool>> = HashMap::new();
    let dir = shmlink::rendezvous_dir();
    let me = std::process::id();
    while !shared.stop.load(Ordering::Relaxed) {
        running.retain(|_, done| !done.load(Ordering::Relaxed));
        if let Ok(reports) = shmlink::inspect(&dir, DEFAULT_INSPECT_TIMEOUT) {
            for r in reports {
                let SocketState::Topic(status) = &r.state else {
                    continue;
                };
                let Some(name) = status.address.strip_prefix("shm:") else {
                    continue;
                };
                if running.contains_key(name)
                    || status.exported
                    || r.listener.is_some_and(|l| l.pid == me)
                    || !shared.config.export.iter().any(|p| p.matches(name))
                    || shared
                        .imported
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(name)
                        .is_some_and(Result::is_ok)
                {
                    continue;
                }
                let done = Arc::new(AtomicBool::new(false));
                running.insert(name.to_owned(), Arc::clone(&done));
                let (s, name) = (Arc::clone(shared), name.to_owned());
                let slots = u32::try_from(status.slots).unwrap_or(0);
                shared.spawn(format!("shz-out-{name}"), move || {
                    export(&s, &name, slots);
                    done.store(true, Ordering::Relaxed);
                });
            }
        }
        let until = Instant::now() + shared.config.scan_interval;
        while Instant::now() < until && !shared.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn export(shared: &Shared, name: &str, slots: u32) {
    let counters = shared.counters(name, Direction::Export);
    let why = match export_topic(shared, name, slots, &counters) {
        Ok(why) => why,
        Err(e) => e.0,
    };
    tracing::info!(topic = name, why, "export stopped");
    counters.set_state(why);
}

/// The Zenoh publisher of an exported topic's key: `Block` topics with Zenoh's blocking
/// congestion control, `Overwrite` topics with its dropping one.
pub(crate) fn declare_export(
    session: &Session,
    key: &str,
    policy: Policy,
) -> Result<zenoh::pubsub::Publisher<'static>, Error> {
    session
        .declare_publisher(key.to_owned())
        .congestion_control(match policy {
            Policy::Block => CongestionControl::Block,
            Policy::Overwrite => CongestionControl::Drop,
        })
        .wait()
        .map_err(|e| Error(format!("declare {key}: {e}")))
}

fn export_topic(shared: &Shared, name: &str, slots: u32, c: &Counters) -> Result<String, Error> {
    let addr = format!("shm:{name}");
    // Blocking receives keep the wait policy's spin, so a busy topic is read without
    // announcing sleep (and making its publisher ring) at every message; the timeout
    // lets the loop see `stop`. A background subscription: the host's other subscribers
    // of the topic are rung first (docs/zenoh.md).
    let opts = PubSubOptions::default()
        .recv_timeout(Duration::from_millis(100))
        .background(true);
    let mut sub = Subscriber::connect(&addr, &opts)
        .map_err(|e| Error(format!("subscribe to {addr}: {e}")))?;
    let policy = sub.policy();
    let key = format!("{}{name}", shared.config.prefix);
    let publisher = declare_export(&shared.session, &key, policy)?;
    tracing::info!(topic = name, key, ?policy, "exporting");
    c.set_state("active");
    let mut head = Header {
        origin: shared.id,
        seq: 0,
        policy,
        max_msg: u32::try_from(sub.max_msg_size()).unwrap_or(u32::MAX),
        slots,
    };
    while !shared.stop.load(Ordering::Relaxed) {
        match sub.recv_vec() {
            Ok(msg) => {
                let n = msg.len();
                publisher
                    .put(msg)
                    .attachment(head.encode())
                    .wait()
                    .map_err(|e| Error(format!("put {key}: {e}")))?;
                head.seq += 1;
                c.messages.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => {}
            Err(e) if e.kind() == ErrorKind::Lagged => {
                let missed = e.missed().unwrap_or(0);
                head.seq += missed;
                c.dropped.fetch_add(missed, Ordering::Relaxed);
            }
            Err(e) => return Ok(format!("local topic ended: {e}")),
        }
    }
    Ok("bridge closed".into())
}

// ---------------------------------------------------------------------------------------
// In: Zenoh to local topics.

/// Zenoh's callback: publishes the message into its local topic (made at the first
/// message of a key); waits while a `Block` topic's local subscribers are behind.
fn deliver(shared: &Arc<Shared>, sample: Sample) {
    let key = sample.key_expr().as_str();
    let Some(name) = key.strip_prefix(shared.config.prefix.as_str()) else {
        return;
    };
    let head = sample
        .attachment()
        .and_then(|a| Header::decode(&a.to_bytes()));
    if head.is_some_and(|h| h.origin == shared.id) {
        return;
    }
    let delivered = LAST_IMPORT.with_borrow(|last| match last {
        Some((id, k, i)) if *id == shared.id && k == name => {
            i.publish(name, head, sample.payload());
            true
        }
        _ => false,
    });
    if delivered {
        return;
    }
    let importer = {
        let mut m = shared.imported.lock().unwrap_or_else(|e| e.into_inner());
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        // Only names that passed the checks below are in the map: a known key's
        // messages skip them.
        match m.get(name) {
            Some(Err(when)) if when.elapsed() < IMPORT_RETRY => None,
            Some(Ok(i)) => Some(Arc::clone(i)),
            _ => {
                if !valid_topic(name) || !shared.config.import.iter().any(|p| p.matches(name)) {
                    tracing::debug!(key, "refused: not a topic on the import list");
                    return;
                }
                let i = open_import(shared, name, head).ok_or_else(Instant::now);
                m.insert(name.to_owned(), i.clone());
                i.ok()
            }
        }
    };
    match importer {
        Some(i) => {
            i.publish(name, head, sample.payload());
            LAST_IMPORT.with_borrow_mut(|last| match last {
                Some((id, k, last)) => {
                    (*id, *last) = (shared.id, i);
                    k.clear();
                    k.push_str(name);
                }
                None => *last = Some((shared.id, name.to_owned(), i)),
            });
        }
        None => {
            shared
                .counters(name, Direction::Import)
                .dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How long after a failed import the next message of its key tries again.
const IMPORT_RETRY: Duration = Duration::from_secs(1);

/// The largest ring an imported topic gets, whatever the origin's attachment says: a
/// remote peer cannot make the bridge map more than this per topic.
pub(crate) const MAX_IMPORT_RING: usize = 256 << 20;

/// The policy, largest message and slots of the local topic for an import: the origin's
/// (from its attachment), bounded by [`BridgeConfig::max_import_msg`] and
/// [`MAX_IMPORT_RING`]; or the configured ones for messages of other applications.
fn import_geometry(
    first: Option<Header>,
    cfg: &BridgeConfig,
) -> Result<(Policy, usize, usize), Error> {
    let Some(h) = first else {
        return Ok((cfg.foreign_policy, cfg.foreign_max_msg, cfg.foreign_slots));
    };
    let max_msg = h.max_msg as usize;
    if max_msg == 0 || max_msg > cfg.max_import_msg {
        return Err(Error(format!(
            "the origin's largest message, {max_msg} bytes, is not in 1..={} (--max-import-msg)",
            cfg.max_import_msg
        )));
    }
    // Slots of the origin (or enough for bursts at its largest size), within the budget.
    let fit = (MAX_IMPORT_RING / (max_msg + 64)).max(2);
    let want = if h.slots != 0 { h.slots as usize } else { 1024 };
    Ok((h.policy, max_msg, prev_power_of_two(want.min(fit).max(2))))
}

fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
}

/// The local topic of an import, published by this bridge; `None` (logged, and the
/// message counted as dropped by the caller) if it cannot be made.
fn open_import(shared: &Shared, name: &str, first: Option<Header>) -> Option<Arc<Importer>> {
    let counters = shared.counters(name, Direction::Import);
    let cfg = &shared.config;
    let made = import_geometry(first, cfg).and_then(|(policy, max_msg, slots)| {
        let addr = format!("shm:{name}");
        let opts = PubSubOptions::default()
            .policy(policy)
            .max_msg_size(max_msg)
            .slots(slots)
            .stall_timeout(cfg.stall_timeout);
        let publisher = Publisher::bind(&addr, &opts)
            .map_err(|e| Error(format!("publish {addr} locally: {e}")))?;
        tracing::info!(
            topic = name,
            ?policy,
            max_msg,
            "importing into a local topic"
        );
        Ok(publisher)
    });
    match made {
        Ok(publisher) => {
            counters.set_state("active");
            Some(Arc::new(Importer {
                counters,
                state: Mutex::new((Some(publisher), Origins::default())),
            }))
        }
        Err(e) => {
            tracing::warn!(topic = name, error = e.0, "import failed");
            counters.set_state(e.0);
            None
        }
    }
}

impl Importer {
    /// Publishes one message from Zenoh; counts what the origins' sequence numbers say
    /// was lost on the way, and what the local topic refused.
    fn publish(&self, name: &str, head: Option<Header>, payload: &ZBytes) {
        let c = &self.counters;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(publisher), origins) = &mut *state else {
            // Closed by the bridge's shutdown.
            return;
        };
        if let Some(h) = head {
            let missed = origins.see(h.origin, h.seq);
            if missed > 0 {
                c.dropped.fetch_add(missed, Ordering::Relaxed);
            }
        }
        let len = payload.len();
        if len > publisher.max_msg_size() {
            c.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                topic = name,
                len,
                "refused: larger than the topic's maximum"
            );
            return;
        }
        match publish_payload(publisher, payload) {
            // Only here, under the importer's lock.
            Ok(()) => c.count(1, len),
            Err(e) => {
                c.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(topic = name, error = %e, "local publish failed");
            }
        }
    }
}

/// Publishes a Zenoh payload of at most the topic's largest message: copied once, from
/// Zenoh's buffers (the fragments of a large message as they arrived) straight into the
/// ring's slot.
pub(crate) fn publish_payload(publisher: &mut Publisher, payload: &ZBytes) -> shmlink::Result<()> {
    publisher.loan(payload.len()).and_then(|mut slot| {
        let mut at = 0;
        for piece in payload.slices() {
            slot[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
        slot.publish()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(max_msg: u32, slots: u32) -> Option<Header> {
        Some(Header {
            origin: 1,
            seq: 0,
            policy: Policy::Block,
            max_msg,
            slots,
        })
    }

    #[test]
    fn origins_count_each_publishers_gaps_and_stay_bounded() {
        let mut o = Origins::default();
        assert_eq!(o.see(1, 0), 0, "a first message");
        assert_eq!(o.see(1, 1), 0);
        assert_eq!(o.see(1, 5), 3, "2, 3 and 4 lost");
        // Two publishers interleaved: each one's own sequence.
        assert_eq!(o.see(2, 10), 0);
        assert_eq!(o.see(1, 6), 0);
        assert_eq!(o.see(2, 12), 1);
        assert_eq!(o.see(1, 8), 1);
        // Hostile or repeated numbers: no overflow, nothing counted twice.
        assert_eq!(o.see(1, u64::MAX), u64::MAX - 9);
        assert_eq!(o.see(1, 0), 0);
        assert_eq!(o.see(1, 0), 0);
        // Many origins (restarts, or a peer making ids up): at most MAX_ORIGINS others
        // are kept, the longest unseen forgotten first.
        for id in 100..100 + 3 * MAX_ORIGINS as u128 {
            assert_eq!(o.see(id, 7), 0);
        }
        assert_eq!(o.others.len(), MAX_ORIGINS);
        let last = 100 + 3 * MAX_ORIGINS as u128 - 2;
        assert_eq!(o.see(last, 9), 1, "a recent origin is remembered");
        assert_eq!(o.see(2, 20), 0, "a forgotten one starts afresh");
    }

    #[test]
    fn import_geometry_is_bounded_whatever_the_attachment_says() {
        let cfg = BridgeConfig::default();
        assert_eq!(
            import_geometry(head(4096, 64), &cfg).unwrap(),
            (Policy::Block, 4096, 64)
        );
        assert_eq!(import_geometry(head(1 << 20, 0), &cfg).unwrap().2, 128);
        // Hostile: a huge ring is cut to the budget, a huge or empty message refused.
        let (_, m, n) = import_geometry(head(1 << 20, u32::MAX), &cfg).unwrap();
        assert!(
            n * (m + 64) <= MAX_IMPORT_RING && n.is_power_of_two(),
            "{n}"
        );
        assert!(import_geometry(head(u32::MAX, 2), &cfg).is_err());
        assert!(import_geometry(head(0, 2), &cfg).is_err());
        assert_eq!(import_geometry(head(7, 3), &cfg).unwrap().2, 2);
        let foreign = import_geometry(None, &cfg).unwrap();
        assert_eq!(
            foreign,
            (cfg.foreign_policy, cfg.foreign_max_msg, cfg.foreign_slots)
        );
    }
}
