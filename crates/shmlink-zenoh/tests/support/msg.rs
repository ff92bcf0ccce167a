//! The test messages: numbered, checksummed, of mixed sizes, so a subscriber checks
//! order, integrity and boundaries of every message it receives.
//!
//! Layout: sequence (u64, `WARMUP` for the warm-up messages sent until every subscriber
//! is there), length (u32), FNV-1a of the body (u64), then the body (bytes derived from
//! the sequence).

/// Header bytes before the body.
pub const HEAD: usize = 20;
/// Sequence number of the warm-up messages (of the first origin; the n-th origin's are
/// `WARMUP - n`).
pub const WARMUP: u64 = u64::MAX;
/// Sequence numbers of a second (third, ...) publishing host start at multiples of this.
pub const ORIGIN_STEP: u64 = 1 << 32;
/// The largest message of the mixed-size stream (the topic's maximum).
pub const MAX: usize = 1 << 20;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The size of message `seq` in the mixed stream: every 50th is 1 MiB exactly, every
/// other 10th between 64 KiB and 1 MiB, the rest between 64 B and 4 KiB.
pub fn mixed_size(seq: u64) -> usize {
    let r = mix(seq) as usize;
    if seq % 50 == 49 {
        MAX
    } else if seq % 10 == 9 {
        64 * 1024 + r % (MAX - 64 * 1024)
    } else {
        64 + r % (4096 - 64)
    }
}

/// The size of message `seq` in the long-tail stream (mean ~11 KB, for long runs): every
/// 1000th is 1 MiB exactly, every other 100th between 64 KiB and 1 MiB, every other 10th
/// between 4 KiB and 64 KiB, the rest (90 %) between 64 B and 4 KiB.
pub fn tail_size(seq: u64) -> usize {
    let r = mix(seq) as usize;
    if seq % 1000 == 999 {
        MAX
    } else if seq % 100 == 99 {
        64 * 1024 + r % (MAX - 64 * 1024)
    } else if seq % 10 == 9 {
        4096 + r % (64 * 1024 - 4096)
    } else {
        64 + r % (4096 - 64)
    }
}

/// The size of message `seq` in the stream named `sizes` (`SHZ_SIZES`): `mixed`, `tail`,
/// or `small` (64 B to 4 KiB).
pub fn size_of(sizes: &str, seq: u64) -> usize {
    match sizes {
        "mixed" => mixed_size(seq),
        "tail" => tail_size(seq),
        _ => 64 + (seq as usize * 97) % 4000,
    }
}

/// FNV-1a, 64 bits.
pub fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &c| {
        (h ^ u64::from(c)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Writes message `seq` of `len` bytes (at least [`HEAD`]) into `buf`.
pub fn fill(buf: &mut Vec<u8>, seq: u64, len: usize) {
    buf.clear();
    buf.resize(len.max(HEAD), 0);
    let mut x = mix(seq ^ 0x5eed);
    for chunk in buf[HEAD..].chunks_mut(8) {
        x = mix(x);
        let n = chunk.len();
        chunk.copy_from_slice(&x.to_le_bytes()[..n]);
    }
    let sum = fnv(&buf[HEAD..]);
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    buf[12..20].copy_from_slice(&sum.to_le_bytes());
}

/// Checks a received message; returns its sequence number.
pub fn check(m: &[u8]) -> Result<u64, String> {
    if m.len() < HEAD {
        return Err(format!("a {}-byte message", m.len()));
    }
    let seq = u64::from_le_bytes(m[..8].try_into().unwrap());
    let len = u32::from_le_bytes(m[8..12].try_into().unwrap()) as usize;
    if len != m.len() {
        return Err(format!(
            "message {seq}: {} bytes, its header says {len}",
            m.len()
        ));
    }
    let sum = u64::from_le_bytes(m[12..20].try_into().unwrap());
    // The publisher derives the body from the sequence number and sums it: a body that
    // is another message's, cut or changed fails the sum.
    if sum != fnv(&m[HEAD..]) {
        return Err(format!("message {seq}: checksum mismatch"));
    }
    Ok(seq)
}

/// The codec finds what it must find.
pub fn self_check() {
    let mut b = Vec::new();
    for seq in [0, 9, 49, 1234] {
        fill(&mut b, seq, mixed_size(seq));
        assert_eq!(check(&b), Ok(seq));
        let last = b.len() - 1;
        b[last] ^= 1;
        assert!(check(&b).is_err());
    }
    assert_eq!(mixed_size(49), MAX);
    assert_eq!(tail_size(999), MAX);
    assert!((64 * 1024..MAX).contains(&tail_size(99)));
    assert!((4096..64 * 1024).contains(&tail_size(9)));
    assert!((64..4096).contains(&tail_size(1)));
    assert_eq!(size_of("tail", 999), MAX);
    assert!((64..=4096).contains(&mixed_size(1)));
    assert!(check(&[0; 5]).is_err());
}
