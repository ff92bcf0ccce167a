//! A fast, position-dependent 64-bit checksum, and a payload generator that fills a buffer
//! and checksums it in the same pass.
//!
//! The checksum is a Fletcher-style pair of running sums over little-endian 64-bit words,
//! kept in `LANES` independent lanes so the compiler turns the loop into plain vector
//! adds (no multiplies in the hot loop): per 64-byte block, lane `l` does
//! `s1[l] += word[l]; s2[l] += s1[l]`. `s1` changes under any single flipped bit (it moves
//! by ±2^k, never 0 mod 2^64); `s2` makes the sum depend on the block order. The lanes, the
//! length and a caller's seed are folded together at the end with a bijective mixer, so a
//! changed `s1` always changes the result unless `s2` changes in exactly the compensating
//! way (probability about 2^-64). A tail shorter than a block is cut into 8-byte words,
//! the last one zero-padded, word `i` going to lane `i`.

/// Independent accumulator lanes (8 × 8 bytes = one 64-byte block per step).
const LANES: usize = 8;
/// Bytes consumed per step.
const BLOCK: usize = LANES * 8;

/// Blocks in the generator's template (4 KiB: it stays in L1 while a large message is
/// written, so the sender's cost is the write itself).
const TEMPLATE_BLOCKS: usize = 64;

/// The generator's template: fixed pseudo-random words (xorshift64*), built at compile time.
static TEMPLATE: [[u64; LANES]; TEMPLATE_BLOCKS] = make_template();

const fn make_template() -> [[u64; LANES]; TEMPLATE_BLOCKS] {
    let mut t = [[0u64; LANES]; TEMPLATE_BLOCKS];
    let mut x: u64 = 0x5348_4d4c_494e_4b21; // "SHMLINK!"
    let mut b = 0;
    while b < TEMPLATE_BLOCKS {
        let mut l = 0;
        while l < LANES {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            t[b][l] = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            l += 1;
        }
        b += 1;
    }
    t
}

/// murmur3's 64-bit finaliser: a bijection that spreads every input bit over the output.
pub(crate) fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(w)
}

/// The running sums.
struct Sums {
    s1: [u64; LANES],
    s2: [u64; LANES],
}

impl Sums {
    fn new() -> Sums {
        Sums {
            s1: [0; LANES],
            s2: [0; LANES],
        }
    }

    #[inline(always)]
    fn add(&mut self, w: &[u64; LANES]) {
        for ((s1, s2), w) in self.s1.iter_mut().zip(&mut self.s2).zip(w) {
            *s1 = s1.wrapping_add(*w);
            *s2 = s2.wrapping_add(*s1);
        }
    }

    #[inline(always)]
    fn add_block(&mut self, block: &[u8]) {
        let mut w = [0u64; LANES];
        for (l, w) in w.iter_mut().enumerate() {
            *w = u64::from_le_bytes(block[l * 8..l * 8 + 8].try_into().unwrap());
        }
        self.add(&w);
    }

    /// Adds a tail shorter than a block: word `i` (zero-padded) to lane `i`.
    fn add_tail(&mut self, tail: &[u8]) {
        debug_assert!(tail.len() < BLOCK);
        let mut w = [0u64; LANES];
        for (w, chunk) in w.iter_mut().zip(tail.chunks(8)) {
            *w = word(chunk);
        }
        self.add(&w);
    }

    /// Folds each sum's lanes with independent multiplies by distinct odd constants (no
    /// chain of dependent mixes: the multiplies overlap), mixes the `s1` fold, then the
    /// `s2` fold into it. A change `d ≠ 0` in one `s1` lane changes its fold by
    /// `d · odd ≠ 0 (mod 2^64)`, hence the mixed value (a bijection); cancelling that
    /// through the `s2` fold needs a 64-bit coincidence.
    fn finish(&self, seed: u64, len: usize) -> u64 {
        const ODD: [u64; LANES] = [
            0x9e37_79b9_7f4a_7c15,
            0xc2b2_ae3d_27d4_eb4f,
            0x1656_67b1_9e37_79f9,
            0x85eb_ca77_c2b2_ae63,
            0x27d4_eb2f_1656_67c5,
            0xff51_afd7_ed55_8ccd,
            0xc4ce_b9fe_1a85_ec53,
            0x9fb2_1c65_1e98_df25,
        ];
        let fold = |sums: &[u64; LANES]| {
            sums.iter()
                .zip(ODD)
                .fold(0u64, |acc, (s, k)| acc.wrapping_add(s.wrapping_mul(k)))
        };
        let h = fmix64(seed ^ (len as u64).wrapping_mul(0xd6e8_feb8_6659_fd93) ^ fold(&self.s1));
        fmix64(h ^ fold(&self.s2))
    }
}

/// The checksum of `data`, seeded with `seed`.
// Not inlined: inlined into a caller with more live state, the lanes were seen to spill
// to the stack instead of staying in vector registers (3x slower).
#[inline(never)]
pub fn checksum(seed: u64, data: &[u8]) -> u64 {
    let mut sums = Sums::new();
    let mut blocks = data.chunks_exact(BLOCK);
    for block in &mut blocks {
        sums.add_block(block);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        sums.add_tail(tail);
    }
    sums.finish(seed, data.len())
}

/// Fills `dst` with generated bytes that depend on `key` and on the position (the 4 KiB
/// template, xor-ed with `key` and with the index of each 4 KiB chunk), and returns
/// `checksum(seed, dst)`, computed in the same pass.
#[inline(never)] // see `checksum`
pub fn fill(dst: &mut [u8], seed: u64, key: u64) -> u64 {
    const CHUNK: usize = TEMPLATE_BLOCKS * BLOCK;
    let chunk_key = |c: usize| key ^ (c as u64).wrapping_mul(0xd6e8_feb8_6659_fd93);
    let len = dst.len();
    let mut sums = Sums::new();
    let mut chunks = dst.chunks_exact_mut(CHUNK);
    let mut c = 0;
    for chunk in &mut chunks {
        fill_blocks(chunk, chunk_key(c), &mut sums);
        c += 1;
    }
    // The last, partial chunk: whole blocks, then a tail shorter than a block.
    let rest = chunks.into_remainder();
    let k = chunk_key(c);
    let whole = rest.len() / BLOCK * BLOCK;
    let (blocks, tail) = rest.split_at_mut(whole);
    fill_blocks(blocks, k, &mut sums);
    if !tail.is_empty() {
        // Build the tail in a local block and copy it out in one go: byte stores straight
        // into shared memory queue up behind the cache-line transfer and stall the core.
        let mut local = [0u8; BLOCK];
        for (out, t) in local.chunks_exact_mut(8).zip(&TEMPLATE[whole / BLOCK]) {
            out.copy_from_slice(&(t ^ k).to_le_bytes());
        }
        let local = &local[..tail.len()];
        tail.copy_from_slice(local);
        sums.add_tail(local);
    }
    sums.finish(seed, len)
}

/// Fills whole blocks (at most one template's worth) from the template xor `k`, adding
/// each to `sums`.
#[inline(always)]
fn fill_blocks(dst: &mut [u8], k: u64, sums: &mut Sums) {
    debug_assert!(dst.len() % BLOCK == 0 && dst.len() <= TEMPLATE_BLOCKS * BLOCK);
    for (t, block) in TEMPLATE.iter().zip(dst.chunks_exact_mut(BLOCK)) {
        let mut w = [0u64; LANES];
        for (w, t) in w.iter_mut().zip(t) {
            *w = t ^ k;
        }
        for (out, w) in block.chunks_exact_mut(8).zip(&w) {
            out.copy_from_slice(&w.to_le_bytes());
        }
        sums.add(&w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_returns_the_checksum_of_what_it_wrote() {
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 100, 4095, 4096, 4097, 10_000] {
            let mut buf = vec![0u8; len];
            let sum = fill(&mut buf, 42, 7);
            assert_eq!(sum, checksum(42, &buf), "len {len}");
        }
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        for len in [1, 13, 64, 200] {
            let mut buf = vec![0u8; len];
            let good = fill(&mut buf, 1, 2);
            for bit in 0..len * 8 {
                buf[bit / 8] ^= 1 << (bit % 8);
                assert_ne!(checksum(1, &buf), good, "len {len}, bit {bit}");
                buf[bit / 8] ^= 1 << (bit % 8);
            }
            assert_eq!(checksum(1, &buf), good);
        }
    }

    #[test]
    fn flipped_bit_in_a_large_buffer_is_detected() {
        let mut buf = vec![0u8; 1 << 20];
        let good = fill(&mut buf, 9, 9);
        for pos in [0, 4096, 500_000, (1 << 20) - 1] {
            buf[pos] ^= 0x80;
            assert_ne!(checksum(9, &buf), good, "pos {pos}");
            buf[pos] ^= 0x80;
        }
    }

    #[test]
    fn swapped_blocks_seed_and_length_change_the_sum() {
        let mut buf = vec![0u8; 256];
        let good = fill(&mut buf, 3, 4);
        let (a, b) = buf.split_at_mut(64);
        a.swap_with_slice(&mut b[..64]);
        assert_ne!(checksum(3, &buf), good, "swapped blocks");
        assert_ne!(checksum(4, &[0u8; 8]), checksum(5, &[0u8; 8]), "seed");
        assert_ne!(checksum(0, &[0u8; 8]), checksum(0, &[0u8; 9]), "length");
    }

    #[test]
    fn content_depends_on_key_and_position() {
        let mut a = vec![0u8; 3 * 4096];
        let mut b = vec![0u8; 3 * 4096];
        fill(&mut a, 0, 1);
        fill(&mut b, 0, 2);
        assert_ne!(a, b);
        assert_ne!(a[..4096], a[4096..8192], "4 KiB chunks differ");
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use std::time::Instant;

    /// Prints the checksum's and the generator's speed; run with
    /// `cargo test --release -p shmlink-cli checksum_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints a measurement; timings are not asserted"]
    fn checksum_speed() {
        for size in [4096usize, 64 << 10, 1 << 20, 64 << 20] {
            let mut buf = vec![0u8; size];
            let rounds = ((1usize << 32) / size).max(4);
            let t = Instant::now();
            let mut x = 0;
            for i in 0..rounds {
                x ^= fill(&mut buf, i as u64, i as u64);
            }
            let fill_gbs = (size * rounds) as f64 / t.elapsed().as_secs_f64() / 1e9;
            let t = Instant::now();
            for i in 0..rounds {
                x ^= checksum(i as u64, std::hint::black_box(&buf));
            }
            let sum_gbs = (size * rounds) as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("{size:>9} B: fill {fill_gbs:6.1} GB/s, checksum {sum_gbs:6.1} GB/s ({x:x})");
        }
    }
}
