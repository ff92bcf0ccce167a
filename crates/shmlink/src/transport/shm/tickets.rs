//! An `auto:` listener's resumption tickets (docs/design.md §5.3): single-use pairs of
//! 128-bit ticket and proof, handed to a client with a connection (in the `Offer` over
//! TCP, then in each `Resumed`), with which its next connect to the same listener goes
//! straight to the upgrade socket. Bounded: the oldest ticket goes when a new one would
//! exceed [`MAX_TICKETS`], and a ticket is worth nothing after [`LIFETIME`]. A client whose
//! ticket is gone negotiates over TCP as on its first connect.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::handshake::random_pair;
use super::handshake::Token;
use crate::error::Result;

/// Most tickets a listener holds (about 80 bytes each).
pub(crate) const MAX_TICKETS: usize = 1024;
/// How long a ticket stays good.
pub(crate) const LIFETIME: Duration = Duration::from_secs(600);

/// The tickets a listener handed out and not yet saw back.
#[derive(Default)]
pub(crate) struct Tickets {
    /// Ticket → its proof and when it expires.
    live: HashMap<Token, (Token, Instant)>,
    /// Tickets in the order they were issued (with redeemed ones among them, until the
    /// queue is compacted), for dropping the oldest.
    order: VecDeque<Token>,
}

impl Tickets {
    /// A new ticket and its proof, kept until redeemed, expired or pushed out.
    pub(crate) fn issue(&mut self) -> Result<(Token, Token)> {
        let (ticket, proof) = random_pair()?;
        while self.live.len() >= MAX_TICKETS {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.live.remove(&oldest);
        }
        if self.order.len() >= 2 * MAX_TICKETS {
            let live = &self.live;
            self.order.retain(|t| live.contains_key(t));
        }
        self.order.push_back(ticket);
        self.live.insert(ticket, (proof, Instant::now() + LIFETIME));
        Ok((ticket, proof))
    }

    /// The proof of `ticket` if it is live; it is used up either way.
    pub(crate) fn redeem(&mut self, ticket: &Token) -> Option<Token> {
        let (proof, expires) = self.live.remove(ticket)?;
        (expires > Instant::now()).then_some(proof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_good_once() {
        let mut t = Tickets::default();
        let (ticket, proof) = t.issue().unwrap();
        assert_eq!(t.redeem(&ticket), Some(proof));
        assert_eq!(t.redeem(&ticket), None);
        assert_eq!(t.redeem(&[0; 16]), None);
    }

    #[test]
    fn the_oldest_tickets_go_first_and_the_queue_stays_bounded() {
        let mut t = Tickets::default();
        let (first, _) = t.issue().unwrap();
        let (second, proof) = t.issue().unwrap();
        for _ in 0..MAX_TICKETS - 1 {
            t.issue().unwrap();
        }
        assert_eq!(t.live.len(), MAX_TICKETS);
        assert_eq!(t.redeem(&first), None, "the oldest was pushed out");
        assert_eq!(t.redeem(&second), Some(proof));
        // Issue and redeem many: the order queue is compacted, never unbounded.
        for _ in 0..10 * MAX_TICKETS {
            let (ticket, _) = t.issue().unwrap();
            assert!(t.redeem(&ticket).is_some());
        }
        assert!(t.order.len() <= 2 * MAX_TICKETS);
    }
}
