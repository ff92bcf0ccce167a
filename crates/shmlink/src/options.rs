//! Connection and listener options.

use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// Smallest ring: one page.
pub const MIN_RING_SIZE: usize = 4096;
/// Largest ring (per direction).
pub const MAX_RING_SIZE: usize = 1 << 30;
/// Hard upper bound for [`Options::max_msg_size`].
pub const MAX_MSG_SIZE_LIMIT: usize = 1 << 30;

/// How a blocked call waits for its peer: busy-poll, then yield, then sleep in the kernel.
///
/// A shared-memory round trip costs a fraction of a microsecond while a wake-up from sleep
/// costs several to tens of microseconds (more across cores in a VM), so a short spin keeps
/// busy connections fast; the budget bounds the CPU an idle connection burns before it
/// parks. `spin` polls with the CPU's `pause` hint; `yield_` polls with `sched_yield`, which
/// lets a peer pinned to the same core run. Both zero means "always sleep" (the blocking
/// policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Busy-poll time before yielding.
    pub spin: Duration,
    /// Time spent polling with `sched_yield` after the spin, before parking.
    pub yield_: Duration,
}

impl WaitPolicy {
    /// Never spin: every wait sleeps in the kernel (`spin` and `yield_` zero).
    pub const BLOCKING: WaitPolicy = WaitPolicy {
        spin: Duration::ZERO,
        yield_: Duration::ZERO,
    };
}

impl Default for WaitPolicy {
    /// 20 µs of busy polling, then 30 µs of yielding, then sleep (see `README.md` for the
    /// measurements behind these numbers).
    fn default() -> Self {
        WaitPolicy {
            spin: Duration::from_micros(20),
            yield_: Duration::from_micros(30),
        }
    }
}

/// Options for [`Connection::connect`](crate::Connection::connect) and
/// [`Listener::bind`](crate::Listener::bind).
///
/// ```
/// use std::time::Duration;
/// let opts = shmlink::Options::default()
///     .ring_size(1 << 20)
///     .max_msg_size(16 << 20)
///     .connect_timeout(Duration::from_secs(2));
/// assert_eq!(opts.get_ring_size(), 1 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub(crate) ring_size: usize,
    pub(crate) max_msg_size: usize,
    pub(crate) wait: WaitPolicy,
    pub(crate) connect_timeout: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) allow_uids: Vec<u32>,
    pub(crate) allow_gids: Vec<u32>,
    pub(crate) dir_mode: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ring_size: 256 << 10,
            max_msg_size: 64 << 20,
            wait: WaitPolicy::default(),
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(2),
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            dir_mode: 0o700,
        }
    }
}

impl Options {
    /// Bytes per ring and direction for `shm:` (a power of two, 4 KiB ..= 1 GiB). On a
    /// listener this is the largest ring a client may ask for.
    pub fn ring_size(mut self, bytes: usize) -> Self {
        self.ring_size = bytes;
        self
    }

    /// Largest message this side sends or accepts (≤ 1 GiB). Larger messages are refused
    /// with [`ErrorKind::MessageTooLarge`]. Independent of the ring size: messages larger
    /// than a ring are fragmented.
    pub fn max_msg_size(mut self, bytes: usize) -> Self {
        self.max_msg_size = bytes;
        self
    }

    /// How blocked calls wait.
    pub fn wait_policy(mut self, policy: WaitPolicy) -> Self {
        self.wait = policy;
        self
    }

    /// How long `connect` waits for the listener (socket connect plus handshake).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// How long a listener waits for a client's hello before dropping it.
    pub fn handshake_timeout(mut self, t: Duration) -> Self {
        self.handshake_timeout = t;
        self
    }

    /// Listener: user ids allowed to connect over `shm:` besides the listener's own uid
    /// and root (the default allows only those two). Checked against the client's
    /// `SO_PEERCRED`; a client not allowed gets [`ErrorKind::PermissionDenied`] with the
    /// reason. When other users are allowed, the rendezvous socket file is made writable
    /// for everyone (the credential check is the gate), and the directory must let them
    /// in: see [`Options::rendezvous_dir_mode`].
    pub fn allow_uids(mut self, uids: impl IntoIterator<Item = u32>) -> Self {
        self.allow_uids = uids.into_iter().collect();
        self
    }

    /// Listener: group ids (the client's primary gid, from `SO_PEERCRED`) allowed to
    /// connect over `shm:`, as [`Options::allow_uids`].
    pub fn allow_gids(mut self, gids: impl IntoIterator<Item = u32>) -> Self {
        self.allow_gids = gids.into_iter().collect();
        self
    }

    /// Listener: the mode of the rendezvous directory when `shm:NAME` creates it
    /// (default `0o700`: only this user can reach the sockets in it). An existing
    /// directory is left as it is.
    pub fn rendezvous_dir_mode(mut self, mode: u32) -> Self {
        self.dir_mode = mode;
        self
    }

    /// The ring size set.
    pub fn get_ring_size(&self) -> usize {
        self.ring_size
    }

    /// The maximum message size set.
    pub fn get_max_msg_size(&self) -> usize {
        self.max_msg_size
    }

    /// The wait policy set.
    pub fn get_wait_policy(&self) -> WaitPolicy {
        self.wait
    }

    /// Checks every option; the error names the option and the allowed range.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::new(ErrorKind::InvalidInput, msg));
        if !self.ring_size.is_power_of_two()
            || !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&self.ring_size)
        {
            return bad(format!(
                "option ring_size = {}: must be a power of two in {MIN_RING_SIZE}..={MAX_RING_SIZE}",
                self.ring_size
            ));
        }
        if self.max_msg_size > MAX_MSG_SIZE_LIMIT {
            return bad(format!(
                "option max_msg_size = {}: must be at most {MAX_MSG_SIZE_LIMIT}",
                self.max_msg_size
            ));
        }
        if self.dir_mode & !0o7777 != 0 || self.dir_mode & 0o700 != 0o700 {
            return bad(format!(
                "option rendezvous_dir_mode = {:#o}: must be a permission mode (at most 0o7777) that includes 0o700",
                self.dir_mode
            ));
        }
        if self.connect_timeout.is_zero() || self.handshake_timeout.is_zero() {
            return bad("options connect_timeout and handshake_timeout must be non-zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_name_the_option() {
        for (opts, name) in [
            (Options::default().ring_size(0), "ring_size"),
            (Options::default().ring_size(5000), "ring_size"),
            (Options::default().max_msg_size(usize::MAX), "max_msg_size"),
            (
                Options::default().connect_timeout(Duration::ZERO),
                "connect_timeout",
            ),
            (
                Options::default().rendezvous_dir_mode(0o070),
                "rendezvous_dir_mode",
            ),
            (
                Options::default().rendezvous_dir_mode(0o10700),
                "rendezvous_dir_mode",
            ),
        ] {
            let e = opts.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.to_string().contains(name), "{e}");
        }
        Options::default().validate().unwrap();
    }
}
