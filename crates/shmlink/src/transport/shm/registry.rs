//! What a listener remembers of the connections it accepted, to answer `shmlink ls`
//! (a `Query` on its rendezvous socket; see `crate::status`).
//!
//! Each entry holds a weak reference to the connection's counters, which the
//! [`Connection`](crate::Connection) keeps alive: a connection dropped by the application
//! leaves an entry that no longer upgrades, and such entries are pruned when the listener
//! answers and whenever the list has doubled since the last pruning, so a listener that
//! is never asked keeps at most about twice as many entries as it has live connections.

use std::sync::{Arc, Weak};
use std::time::SystemTime;

use crate::status::{ConnectionStatus, ListenerStatus, ProcessCred, Refusals, SharedCounters};
use crate::transport::shm::handshake::RefuseCode;

/// Fewest entries before the list is pruned.
const MIN_PRUNE: usize = 64;

/// One accepted connection.
struct Entry {
    counters: Weak<SharedCounters>,
    transport: &'static str,
    peer: Option<ProcessCred>,
    peer_addr: Option<String>,
    accepted: SystemTime,
}

/// The connections a listener accepted and what it says about itself.
pub(crate) struct Registry {
    entries: Vec<Entry>,
    /// Prune when `entries` reaches this length.
    prune_at: usize,
    started: SystemTime,
    /// For an `auto:` listener's upgrade socket: the `auto:` address and the `tcp:` or
    /// `tls:` address it listens on.
    auto: Option<(String, String)>,
    /// The clients it refused, by reason. Only the accepting thread counts and answers.
    refusals: Refusals,
}

impl Registry {
    pub(crate) fn new() -> Registry {
        Registry {
            entries: Vec::new(),
            prune_at: MIN_PRUNE,
            started: SystemTime::now(),
            auto: None,
            refusals: Refusals::default(),
        }
    }

    /// Reports this listener as the upgrade socket of the `auto:` listener `addr`, which
    /// listens on `over` (`tcp:`/`tls:`).
    pub(crate) fn set_auto(&mut self, addr: String, over: String) {
        self.auto = Some((addr, over));
    }

    /// Remembers a connection just accepted; returns the counters it is to count into.
    pub(crate) fn track(
        &mut self,
        transport: &'static str,
        peer: Option<ProcessCred>,
        peer_addr: Option<String>,
    ) -> Arc<SharedCounters> {
        if self.entries.len() >= self.prune_at {
            self.prune();
            self.prune_at = (2 * self.entries.len()).max(MIN_PRUNE);
        }
        let counters = Arc::new(SharedCounters::new());
        self.entries.push(Entry {
            counters: Arc::downgrade(&counters),
            transport,
            peer,
            peer_addr,
            accepted: SystemTime::now(),
        });
        counters
    }

    /// Counts a client refused with `code`.
    pub(crate) fn refused(&mut self, code: RefuseCode) {
        let r = &mut self.refusals;
        let n = match code {
            RefuseCode::Version => &mut r.version,
            RefuseCode::Permission => &mut r.permission,
            RefuseCode::Invalid => &mut r.invalid,
            RefuseCode::Protocol => &mut r.protocol,
            RefuseCode::Resources => &mut r.resources,
        };
        *n = n.saturating_add(1);
    }

    fn prune(&mut self) {
        self.entries.retain(|e| e.counters.strong_count() > 0);
    }

    /// The answer to a query on the listener `addr` (`shm:NAME`).
    pub(crate) fn status(&mut self, addr: &str) -> ListenerStatus {
        self.prune();
        let connections = self
            .entries
            .iter()
            .filter_map(|e| {
                Some(ConnectionStatus {
                    counters: e.counters.upgrade()?.get(),
                    transport: e.transport.to_string(),
                    peer: e.peer,
                    peer_addr: e.peer_addr.clone(),
                    accepted: e.accepted,
                })
            })
            .collect();
        let (address, transport, over) = match &self.auto {
            Some((auto, over)) => (auto.clone(), "auto", Some(over.clone())),
            None => (addr.to_string(), "shm", None),
        };
        ListenerStatus {
            address,
            transport: transport.to_string(),
            over,
            started: self.started,
            connections,
            truncated: false,
            refusals: self.refusals,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_connections_are_pruned_and_the_list_stays_bounded() {
        let mut r = Registry::new();
        let mut live = Vec::new();
        for i in 0..10_000 {
            let c = r.track("shm", None, None);
            if i % 100 == 0 {
                live.push(c);
            }
            assert!(
                r.len() <= 2 * live.len() + MIN_PRUNE + 1,
                "{i}: {}",
                r.len()
            );
        }
        let status = r.status("shm:x");
        assert_eq!(status.connections.len(), live.len());
        assert_eq!(r.len(), live.len());
        drop(live);
        assert!(r.status("shm:x").connections.is_empty());
    }
}
