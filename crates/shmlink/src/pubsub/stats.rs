//! Statistics types shared by the subscriber kinds: the shared-memory and the network
//! subscriber fill in [`SubscriberStats`], the public [`Subscriber`](crate::Subscriber)
//! hands it out.

/// Subscriber statistics.
///
/// `Send`, `Sync`, `Copy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Messages received.
    pub received: u64,
    /// Messages lost to overwriting (`overwrite` policy), in total.
    pub missed: u64,
    /// Messages published and not read yet (over `tcp:`/`tls:`: 0, not known).
    pub lag: u64,
}
