//! Typed readiness for [`Epoll`](crate::Epoll) and [`poll_fd`](crate::poll_fd): what to
//! watch a descriptor for ([`Interest`]), the caller's name for it ([`Token`]) and what
//! was reported ([`Event`]), so that no `EPOLL*`/`POLL*` constant leaves this crate.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// What to watch a descriptor for; combine with `|`
/// (`Interest::READABLE | Interest::WRITABLE`).
///
/// Errors and hang-ups (`EPOLLERR`, `EPOLLHUP`) end every wait whatever the interest;
/// the kernel reports them unasked.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interest(u8);

const READ: u8 = 1;
const WRITE: u8 = 2;
const READ_CLOSED: u8 = 4;

impl Interest {
    /// Data (or a connection, on a listening socket) can be read (`EPOLLIN`).
    pub const READABLE: Interest = Interest(READ);
    /// Data can be written without blocking (`EPOLLOUT`).
    pub const WRITABLE: Interest = Interest(WRITE);
    /// The peer shut down its sending side or closed the connection (`EPOLLRDHUP`, and
    /// `EPOLLHUP` stated explicitly): a watch for a peer's departure that does not fire
    /// for data.
    pub const READ_CLOSED: Interest = Interest(READ_CLOSED);

    /// Both interests.
    pub const fn add(self, other: Interest) -> Interest {
        Interest(self.0 | other.0)
    }

    /// Whether every interest of `other` is in `self`.
    pub const fn contains(self, other: Interest) -> bool {
        self.0 & other.0 == other.0
    }

    /// The `events` mask of an `epoll_event`.
    pub(crate) fn epoll_events(self) -> u32 {
        let mut events = 0;
        if self.contains(Interest::READABLE) {
            events |= libc::EPOLLIN;
        }
        if self.contains(Interest::WRITABLE) {
            events |= libc::EPOLLOUT;
        }
        if self.contains(Interest::READ_CLOSED) {
            events |= libc::EPOLLRDHUP | libc::EPOLLHUP;
        }
        events as u32
    }

    /// The `events` mask of a `pollfd`.
    pub(crate) fn poll_events(self) -> i16 {
        let mut events = 0;
        if self.contains(Interest::READABLE) {
            events |= libc::POLLIN;
        }
        if self.contains(Interest::WRITABLE) {
            events |= libc::POLLOUT;
        }
        if self.contains(Interest::READ_CLOSED) {
            events |= libc::POLLRDHUP | libc::POLLHUP;
        }
        events
    }
}

impl BitOr for Interest {
    type Output = Interest;

    fn bitor(self, other: Interest) -> Interest {
        self.add(other)
    }
}

impl BitOrAssign for Interest {
    fn bitor_assign(&mut self, other: Interest) {
        *self = self.add(other);
    }
}

impl fmt::Debug for Interest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Interest::READABLE, "READABLE"),
            (Interest::WRITABLE, "WRITABLE"),
            (Interest::READ_CLOSED, "READ_CLOSED"),
        ];
        let mut sep = "";
        for (i, name) in names {
            if self.contains(i) {
                write!(f, "{sep}{name}")?;
                sep = " | ";
            }
        }
        if sep.is_empty() {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}

/// The caller's name for a registered descriptor, handed back in each [`Event`] for it
/// (the `u64` of an `epoll_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub u64);

// `Event::from_poll` keeps `poll`'s bits as they are: Linux gives them epoll's values.
const _: () = assert!(
    libc::POLLIN as i32 == libc::EPOLLIN
        && libc::POLLOUT as i32 == libc::EPOLLOUT
        && libc::POLLERR as i32 == libc::EPOLLERR
        && libc::POLLHUP as i32 == libc::EPOLLHUP
        && libc::POLLRDHUP as i32 == libc::EPOLLRDHUP
);

/// One readiness report from [`Epoll::wait`](crate::Epoll::wait).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Event {
    token: Token,
    events: u32,
}

impl Event {
    pub(crate) fn from_epoll(token: Token, events: u32) -> Event {
        Event { token, events }
    }

    /// From `poll`'s `revents`, whose bits Linux defines equal to epoll's.
    pub(crate) fn from_poll(token: Token, revents: libc::c_short) -> Event {
        Event {
            token,
            events: revents as u16 as u32,
        }
    }

    /// Anything at all was reported: readiness, an error or a hang-up.
    pub fn is_ready(&self) -> bool {
        self.events != 0
    }

    /// The token the descriptor was registered with.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Data can be read (or a read returns end of file or an error at once).
    pub fn is_readable(&self) -> bool {
        self.events & libc::EPOLLIN as u32 != 0
    }

    /// Data can be written.
    pub fn is_writable(&self) -> bool {
        self.events & libc::EPOLLOUT as u32 != 0
    }

    /// The peer shut down its sending side, or the connection hung up entirely.
    pub fn is_read_closed(&self) -> bool {
        self.events & (libc::EPOLLRDHUP | libc::EPOLLHUP) as u32 != 0
    }

    /// An error is pending on the descriptor (`EPOLLERR`).
    pub fn is_error(&self) -> bool {
        self.events & libc::EPOLLERR as u32 != 0
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("token", &self.token)
            .field("readable", &self.is_readable())
            .field("writable", &self.is_writable())
            .field("read_closed", &self.is_read_closed())
            .field("error", &self.is_error())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{socket, Epoll};

    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(20))
    }

    #[test]
    fn interests_combine_and_map_to_the_kernel_bits() {
        let both = Interest::READABLE | Interest::WRITABLE;
        assert!(both.contains(Interest::READABLE) && both.contains(Interest::WRITABLE));
        assert!(!both.contains(Interest::READ_CLOSED));
        assert_eq!(both.epoll_events(), (libc::EPOLLIN | libc::EPOLLOUT) as u32);
        assert_eq!(both.poll_events(), libc::POLLIN | libc::POLLOUT);
        let mut gone = Interest::READ_CLOSED;
        gone |= Interest::READ_CLOSED;
        assert_eq!(
            gone.epoll_events(),
            (libc::EPOLLRDHUP | libc::EPOLLHUP) as u32
        );
        assert_eq!(format!("{both:?}"), "READABLE | WRITABLE");
    }

    /// The events a socket pair really reports, through a real epoll set: tokens come
    /// back as registered, and each interest reports what it names.
    #[test]
    fn epoll_reports_typed_events_with_their_tokens() {
        let (a, b) = socket::seqpacket_pair().unwrap();
        let epoll = Epoll::new().unwrap();
        let mut out = Vec::new();
        epoll
            .add(b.as_raw_fd(), Interest::READABLE, Token(7))
            .unwrap();
        epoll.wait(soon(), &mut out).unwrap();
        assert!(out.is_empty(), "nothing sent yet: {out:?}");

        socket::send(a.as_fd(), b"x").unwrap();
        epoll.wait(soon(), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token(), Token(7));
        assert!(out[0].is_readable() && !out[0].is_writable() && !out[0].is_read_closed());

        epoll
            .modify(b.as_raw_fd(), Interest::WRITABLE, Token(8))
            .unwrap();
        epoll.wait(soon(), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token(), Token(8));
        assert!(out[0].is_writable() && !out[0].is_readable());

        // Watching for the peer's departure only: data does not fire it, a close does.
        epoll
            .modify(b.as_raw_fd(), Interest::READ_CLOSED, Token(9))
            .unwrap();
        socket::send(a.as_fd(), b"y").unwrap();
        epoll.wait(soon(), &mut out).unwrap();
        assert!(out.is_empty(), "data is not a departure: {out:?}");
        drop(a);
        epoll.wait(soon(), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token(), Token(9));
        assert!(out[0].is_read_closed());

        epoll.delete(b.as_raw_fd()).unwrap();
        epoll.wait(soon(), &mut out).unwrap();
        assert!(out.is_empty(), "deleted: {out:?}");
    }
}
