//! What the publisher and its two threads share: the [`Topic`] (the topic's memory, the
//! subscriber [`Table`] under its lock, the epoll sets and signals) and the epoll tokens.
//! The publisher ([`super::publisher`]) creates it and starts the control thread
//! ([`super::control`]) and the fan-out thread ([`super::fanout`]); all three use it, and
//! it names none of them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::options::{Policy, PubSubOptions};
use super::ring::{Geometry, LastRing, Ring};
use super::segment::{BellSegment, CursorSegment, TopicSegment};
use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::sys::socket::{self, PeerCred};
use crate::sys::{Epoll, TimerFd};
use crate::transport::shm::handshake::Token;

/// Epoll token of the stall timer in the publisher's set.
pub(crate) const TIMER_TOKEN: u64 = u64::MAX;
/// Epoll token of the table-changed signal in the publisher's set.
pub(crate) const CHANGED_TOKEN: u64 = u64::MAX - 1;

/// Epoll token of subscriber `slot` of generation `gen`.
pub(crate) fn sub_token(slot: usize, gen: u64) -> u64 {
    gen << 8 | slot as u64
}

/// The slot and generation in a subscriber token.
pub(crate) fn token_sub(token: u64) -> (usize, u64) {
    ((token & 0xff) as usize, token >> 8)
}

/// Why a subscriber leaves the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Its socket closed: it unsubscribed, exited or died.
    Gone,
    /// It held the publisher up for the stall timeout.
    Stalled,
    /// Its cursor page said something impossible.
    Violation,
}

/// One subscriber, as the publisher keeps it.
pub(crate) struct Sub {
    /// Tells this subscriber from later ones in the same slot (epoll tokens).
    pub gen: u64,
    pub page: CursorSegment,
    /// The control socket: doorbells both ways, EOF when either side goes.
    pub sock: OwnedFd,
    pub cred: PeerCred,
    /// A ring reader of the fan-out thread, serving a subscriber over the network (it
    /// counts against `max_remote_subscribers`).
    pub remote: bool,
    /// Its cursor as last read and validated (cursors only move forward).
    pub known: u64,
    /// Its stall window, while it owes the publisher progress (`block` policy; see the
    /// stall rule in the module docs).
    pub stall: Option<StallWindow>,
    /// Its last doorbell, for the doorbell rule (see `shmlink_ring::broadcast`).
    pub last_ring: LastRing,
    /// Asked to be woken after the others (`PubSubOptions::background`).
    pub background: bool,
}

/// A subscriber that held the publisher up at `since` must reach `target` (the
/// publisher's position then) within the stall timeout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StallWindow {
    pub since: Instant,
    pub target: u64,
    /// When a rescan last found it out of the way, if it has not held the publisher up
    /// again since.
    pub freed: Option<Instant>,
}

/// The subscribers, under the topic's lock.
pub(crate) struct Table {
    pub subs: Vec<Option<Sub>>,
    /// Where the search for a free slot starts: slots are handed out round-robin, so a
    /// slot just freed is reused last (its former subscriber, if alive, may still touch
    /// its bell bit until it notices it was removed).
    pub next_slot: usize,
    pub next_gen: u64,
    pub count: usize,
    pub joined: u64,
    pub left: u64,
    pub detached: u64,
    /// Set when the publisher closes: no more joins.
    pub closed: bool,
}

/// One subscriber as a report shows it: its lag and losses read from the cursor page it
/// writes, clamped into what is possible at `published`.
pub(crate) struct SubView<'a> {
    pub slot: usize,
    pub sub: &'a Sub,
    pub lag: u64,
    pub missed: u64,
}

impl Table {
    /// Every subscriber in the table with its lag and losses at `published`. Its page is
    /// untrusted (the subscriber writes it): a cursor past `published` counts as caught
    /// up, losses as at most `published`.
    pub fn views(&self, published: u64) -> impl Iterator<Item = SubView<'_>> {
        self.subs.iter().enumerate().filter_map(move |(slot, sub)| {
            let sub = sub.as_ref()?;
            let page = sub.page.get();
            Some(SubView {
                slot,
                sub,
                lag: published - page.load_cursor().min(published),
                missed: page.missed().min(published),
            })
        })
    }
}

/// What the publisher and the control thread share.
pub(crate) struct Topic {
    pub addr: String,
    pub opts: PubSubOptions,
    pub geom: Geometry,
    pub policy: Policy,
    pub seg: TopicSegment,
    pub seg_fd: OwnedFd,
    pub bell: BellSegment,
    pub bell_fd: OwnedFd,
    /// Lowest cursor of a live subscriber at the last rescan (`u64::MAX`: none), lowered
    /// by joins. Read by the publisher without the lock; written under it.
    pub cached_min: AtomicU64,
    /// The table's `count`, readable without the lock (`Publisher::subscriber_count`,
    /// which an exporting publisher asks at every message); written under it.
    pub members: AtomicUsize,
    pub table: Mutex<Table>,
    /// Signalled when a subscriber joins.
    pub joins: Condvar,
    /// The publisher's sleep set: every subscriber socket (doorbells, EOF) and the timer.
    pub pub_epoll: Epoll,
    /// The control thread's set: the listener, handshakes, every subscriber socket for
    /// hang-ups only, and the stop signal.
    pub ctl_epoll: Epoll,
    /// Fires at the earliest stall deadline, for a non-blocking publisher's event loop.
    pub timer: TimerFd,
    /// A byte on `changed.0` makes `changed.1` (in the publisher's set) readable: a
    /// subscriber left the table, so a publisher waiting for it may go on.
    pub changed: (OwnedFd, OwnedFd),
    /// The network peers of the subscribers the fan-out thread reads for, by slot.
    pub remotes: Mutex<HashMap<usize, SocketAddr>>,
    /// A socket pair to the control thread: the fan-out thread passes one end of a new
    /// pair over `inject.0` (`SCM_RIGHTS`) and subscribes on the other, so its ring
    /// readers join without the rendezvous socket file (which `auto:` tests or an
    /// operator may remove).
    pub inject: (OwnedFd, OwnedFd),
    /// An `auto:` topic's upgrade tokens and their proofs: handed out by the fan-out
    /// thread over a network subscription, taken (once) by the control thread from a
    /// subscriber on the rendezvous socket, which admits no one else. `None` for other
    /// topics.
    pub tokens: Option<Mutex<HashMap<Token, Token>>>,
}

impl Topic {
    pub fn ring(&self) -> Ring {
        self.seg.ring()
    }

    /// Records an upgrade token handed out over the network and the proof that answers it.
    pub fn offer_token(&self, token: Token, proof: Token) {
        if let Some(book) = &self.tokens {
            book.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(token, proof);
        }
    }

    /// Takes an upgrade token (single-use): its proof, if it was handed out and not yet
    /// taken or revoked.
    pub fn take_token(&self, token: &Token) -> Option<Token> {
        let book = self.tokens.as_ref()?;
        book.lock().unwrap_or_else(|p| p.into_inner()).remove(token)
    }

    /// Locks the map of remote subscribers' peers.
    pub fn remotes(&self) -> MutexGuard<'_, HashMap<usize, SocketAddr>> {
        self.remotes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Locks the table (a panic elsewhere does not make the table unusable: every
    /// update to it is a single assignment).
    pub fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes subscriber `slot` from the table. A detached one finds the mark in its
    /// page; every one sees its socket close.
    pub fn remove(&self, table: &mut Table, slot: usize, why: Leave) {
        let Some(sub) = table.subs[slot].take() else {
            return;
        };
        crate::trace::event!(
            info,
            topic = %self.addr,
            slot,
            remote = sub.remote,
            why = ?why,
            "subscriber left or detached"
        );
        let fd = sub.sock.as_raw_fd();
        let _ = self.pub_epoll.delete(fd);
        let _ = self.ctl_epoll.delete(fd);
        if why != Leave::Gone {
            // Before the socket closes: the subscriber looks for the mark on EOF.
            sub.page.get().set_detached();
            table.detached += 1;
        } else {
            table.left += 1;
        }
        self.ring().clear_bell(self.bell.get(), slot);
        let _ = socket::shutdown(sub.sock.as_fd());
        table.count -= 1;
        // SYNC POINT (members): Release pairs with the Acquire load in
        // `Publisher::subscriber_count`; the count is a snapshot either way.
        self.members.store(table.count, Ordering::Release);
        // The publisher may be waiting for this one (its socket just left the set).
        let _ = socket::send(self.changed.0.as_fd(), &[1]);
    }
}
