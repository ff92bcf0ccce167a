//! The messages of a shm connection's stream besides data, and their sizes: data
//! messages of at most [`CHUNK`] bytes, the empty message (the FIN of
//! `shutdown(SHUT_WR)`), and the exec *switch* message, longer than any data message,
//! which is how the peer tells it from data (`crate::exec` says what it is for).
//!
//! The switch message: a 64-byte header (magic, the bytes of the peer's stream the
//! sender's program consumed, the bytes it wrote, the returned bytes' length), then the
//! returned bytes (what the sender's library had taken from the ring but its program had
//! not read), padded to [`SWITCH_LEN`].

/// The largest message one write puts into the ring (a quarter of the smallest ring we
/// configure, so it always fits one record).
pub(crate) const CHUNK: usize = 16 * 1024;

const MAGIC: &[u8; 16] = b"SHMLINK-EXEC-TCP";
/// Longer than any data message, so never taken for data.
const SWITCH_LEN: usize = CHUNK + 64;

/// The switch message's header: magic, consumed, wrote, the returned bytes' length.
const SWITCH_HEADER: usize = 64;
/// The most bytes a switch message returns: it must fit one record of the smallest ring
/// (64 KiB: records of up to 32 KiB), so that sending it is all or nothing.
pub(crate) const MAX_RETURNED: usize = 2 * CHUNK - 2 * SWITCH_HEADER;

/// A switch message: `consumed` and `wrote` byte counts, then `returned`.
pub(crate) fn encode(consumed: u64, wrote: u64, returned: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; SWITCH_LEN.max(SWITCH_HEADER + returned.len())];
    v[..16].copy_from_slice(MAGIC);
    v[16..24].copy_from_slice(&consumed.to_le_bytes());
    v[24..32].copy_from_slice(&wrote.to_le_bytes());
    v[32..40].copy_from_slice(&(returned.len() as u64).to_le_bytes());
    v[SWITCH_HEADER..SWITCH_HEADER + returned.len()].copy_from_slice(returned);
    v
}

/// (consumed, wrote, returned bytes) of a switch message.
pub(crate) fn decode(msg: &[u8]) -> Option<(u64, u64, &[u8])> {
    if msg.len() < SWITCH_LEN || &msg[..16] != MAGIC {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(msg[i..i + 8].try_into().expect("8 bytes"));
    let returned = usize::try_from(word(32)).ok()?;
    let end = SWITCH_HEADER.checked_add(returned)?;
    Some((word(16), word(24), msg.get(SWITCH_HEADER..end)?))
}
