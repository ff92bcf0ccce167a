//! The layout of a connection slot and of a listener entry (offsets inside each). Their
//! state words change only through the handshake state machines of `shmlink_ring::slot`
//! ([`Slot`], [`Entry`], [`Once`], re-exported here). Every value is read from shared
//! memory and compared against the known ones; an unknown one is never trusted.

pub(crate) use shmlink_ring::slot::{Entry, Once, Slot, State};

/// Slot: the state word (u32, [`Slot`]).
pub(crate) const STATE: usize = 0;
/// Slot: the listener entry the request is for (u32).
pub(crate) const LISTENER: usize = 4;
/// Slot: that listener's nonce (u64), so that a request never reaches a later listener
/// that reused the entry.
pub(crate) const LISTENER_NONCE: usize = 8;
/// Slot: the client's maximum message size (u64).
pub(crate) const CLIENT_MAX: usize = 16;
/// Slot: the server's maximum message size (u64).
pub(crate) const SERVER_MAX: usize = 24;
/// Slot: the client's bell word (u32, bell.rs: whether and as which ivshmem peer id it
/// can be rung, whether it rings).
pub(crate) const CLIENT_BELL: usize = 96;
/// Slot: the server's bell word (u32).
pub(crate) const SERVER_BELL: usize = 100;
/// Slot: the client's process id, in its own guest (u32; 0: unknown). For `shmlink ls`.
pub(crate) const CLIENT_PID: usize = 32;
/// Slot: the server's process id, in its own guest (u32; 0: unknown).
pub(crate) const SERVER_PID: usize = 36;
/// Slot: the client's heartbeat (u64, own cache line).
pub(crate) const CLIENT_HB: usize = 128;
/// Slot: the server's heartbeat.
pub(crate) const SERVER_HB: usize = 256;
/// Slot: client→server ring, producer block (the client's).
pub(crate) const C2S_PROD: usize = 384;
/// Slot: client→server ring, consumer block (the server's).
pub(crate) const C2S_CONS: usize = 768;
/// Slot: server→client ring, producer block (the server's).
pub(crate) const S2C_PROD: usize = 1024;
/// Slot: server→client ring, consumer block (the client's).
pub(crate) const S2C_CONS: usize = 1408;
/// Slot: end of the ring blocks.
pub(crate) const CTL_END: usize = 1664;

/// Listener: state (u32, [`Entry`]).
pub(crate) const L_STATE: usize = 0;
/// Listener: name length (u32).
pub(crate) const L_NAME_LEN: usize = 4;
/// Listener: nonce (u64), new at every bind.
pub(crate) const L_NONCE: usize = 8;
/// Listener: heartbeat (u64).
pub(crate) const L_HB: usize = 16;
/// Listener: the listening process's id, in its own guest (u32; 0: unknown).
pub(crate) const L_PID: usize = 24;
/// Listener: name bytes.
pub(crate) const L_NAME: usize = 32;
/// Longest listener name.
pub(crate) const L_NAME_MAX: usize = 64;

// The ring blocks and the name fit their slot and entry (checked at compile time).
const _: () = assert!(CTL_END <= super::region::SLOT_BYTES);
const _: () = assert!(L_NAME + L_NAME_MAX <= super::region::LISTENER_BYTES);

#[cfg(test)]
mod tests {
    use super::*;
    use shmlink_ring::spsc::{ConsumerCtl, ProducerCtl};
    use std::mem::size_of;

    #[test]
    fn layout_fits() {
        assert_eq!(C2S_CONS - C2S_PROD, size_of::<ProducerCtl>());
        assert_eq!(S2C_PROD - C2S_CONS, size_of::<ConsumerCtl>());
        assert_eq!(S2C_CONS - S2C_PROD, size_of::<ProducerCtl>());
        assert_eq!(CTL_END - S2C_CONS, size_of::<ConsumerCtl>());
        for off in [C2S_PROD, C2S_CONS, S2C_PROD, S2C_CONS] {
            assert_eq!(off % 128, 0);
        }
    }
}
