//! [`copy_shared`]: the one routine that copies message bytes into and out of shared
//! memory, opaque to the compiler, and fast whatever the two addresses are.
//!
//! On x86-64 a copy shorter than [`SHORT_COPY`] is a run of unaligned 16-byte moves
//! and a tail of 8, 4, 2 and 1 bytes; a longer one is `rep movsb`, except where `rep
//! movsb` is slow: when the destination lies 1 to 63 bytes after the source modulo 4 KiB,
//! it is a loop of unaligned 32-byte loads and stores (AVX, where the CPU has it) or the
//! short copy's 16-byte moves. Measured on an AMD EPYC (Zen 3, KVM) with
//! `scripts/copy-alias.c`:
//! `rep movsb` of 128 KiB in cache took 46-48 µs at distances 1 to 31 (also 4 KiB + 8 and
//! 64 KiB + 8), 2.9-3.4 µs at every other distance; glibc's `memcpy` the same (it uses
//! `rep movsb` between its thresholds, 64 KiB to 256 KiB here), so the senders' copies
//! into their rings go through this routine too. The vector loop ran at 25-35 GB/s at
//! every distance. The window avoided is 1 to 63, the one glibc avoids on Intel CPUs
//! (there modulo 4 GiB, which the check modulo 4 KiB covers). Which distance a message's
//! copies see depends on where the allocator put the caller's buffer and where the ring's
//! record lies, so without the check a large message was copied fast or 15 times slower
//! by chance (docs/benchmarks.md, "Large copies and 4K aliasing").

/// Copies shorter than this are, on x86-64, a run of independent 16-byte moves (and a
/// tail), whatever the two addresses; longer ones `rep movsb` or the vector loop. A small
/// message's copy out of a ring reads lines that may still be arriving from the sender's
/// core, and there `rep movsb` measured slower than independent loads, which wait for the
/// lines together: 64 B round trips of the bare ring 0.37 against 0.44 µs p50, 100 B 0.48
/// against 0.52 (docs/benchmarks.md, "Short copies"). In cache the two cost about the
/// same below this length (3.7 against 3-7 ns up to 128 bytes, 12-15 at 384-512), and
/// `rep movsb` is ahead beyond it.
pub(crate) const SHORT_COPY: usize = 512;

/// Copies `len` bytes from memory another process may be writing at the same time.
///
/// A plain `copy_nonoverlapping` of such memory is a data race, undefined behaviour in
/// the Rust memory model even when the result is checked afterwards. On x86-64 the copy
/// is inline assembly (16-byte moves for a short copy, else `rep movsb` or, where that
/// is slow, a vector loop: see the module docs): the compiler treats it as an opaque
/// access it cannot reason about (like a system call), each byte is read once, and it
/// is as fast as `memcpy` for large sizes. Elsewhere it is a loop of relaxed atomic
/// byte loads. Either way the bytes may be torn: callers validate afterwards (seqlock
/// stamps) or accept whatever the peer left there. It is as good a copy into shared
/// memory others read (a sender's ring).
///
/// # Safety
/// `src..src + len` is mapped and readable, `dst..dst + len` writable, and the two do
/// not overlap.
#[inline]
pub unsafe fn copy_shared(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if len < SHORT_COPY {
            // SAFETY: forwarded from the caller.
            unsafe { x86::short(dst, src, len) };
            return;
        }
        if aliased(dst, src) {
            // SAFETY: forwarded from the caller; `len >= SHORT_COPY` >= one vector block.
            unsafe { x86::copy_vectors(dst, src, len) };
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { x86::rep_movsb(dst, src, len) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    for i in 0..len {
        // SAFETY: `i < len`: inside both ranges. An atomic load of a byte another process
        // may store to is not a data race.
        unsafe {
            let b = std::sync::atomic::AtomicU8::from_ptr(src.add(i).cast_mut())
                .load(std::sync::atomic::Ordering::Relaxed);
            dst.add(i).write(b);
        }
    }
}

/// Copies `len` bytes of our own into shared memory we own and others read (a sender's
/// ring record, a publisher's slot): a short copy as [`copy_shared`]'s 16-byte moves (a
/// 64 B round trip measured 5-15 ns faster than with `memcpy`), a longer one with
/// `memcpy`, whose vectors are ahead of `rep movsb` in cache up to some KiB. Not for
/// large messages whose copies may meet the 4 KiB aliasing of the module docs: those go
/// through [`copy_shared`].
///
/// # Safety
/// As [`copy_shared`].
#[inline]
pub unsafe fn copy_to_shared(dst: *mut u8, src: *const u8, len: usize) {
    if cfg!(target_arch = "x86_64") && len < SHORT_COPY {
        // SAFETY: forwarded from the caller.
        unsafe { copy_shared(dst, src, len) };
    } else {
        // SAFETY: forwarded from the caller; the peers only read `dst`.
        unsafe { dst.copy_from_nonoverlapping(src, len) };
    }
}

/// Whether `dst` lies 1 to 63 bytes after `src` modulo 4 KiB, where `rep movsb` is slow.
#[inline(always)]
pub(crate) fn aliased(dst: *const u8, src: *const u8) -> bool {
    let distance = (dst as usize).wrapping_sub(src as usize) & 4095;
    distance.wrapping_sub(1) < 63
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::sync::atomic::{AtomicU8, Ordering};

    /// `rep movsb` of `len` bytes.
    ///
    /// # Safety
    /// As [`super::copy_shared`].
    #[inline(always)]
    pub(super) unsafe fn rep_movsb(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: the caller guarantees both ranges; `rep movsb` copies exactly `rcx`
        // bytes forwards (the direction flag is clear, as the ABI requires at any call).
        unsafe {
            std::arch::asm!(
                "rep movsb",
                inout("rcx") len => _,
                inout("rsi") src => _,
                inout("rdi") dst => _,
                options(nostack, preserves_flags)
            );
        }
    }

    /// A short copy: unaligned 16-byte moves (SSE2, which every x86-64 CPU has), then 8,
    /// 4, 2 and 1 bytes as `len` has them; each byte is read once. Independent loads, so
    /// the lines of a record that are still arriving are waited for together.
    ///
    /// # Safety
    /// As [`super::copy_shared`].
    #[inline(always)]
    pub(super) unsafe fn short(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: the caller guarantees both ranges; every move stays inside them (16
        // bytes while at least 16 remain, then one move per set bit of the rest).
        unsafe {
            std::arch::asm!(
                "cmp {n}, 16",
                "jb 3f",
                "2:",
                "movdqu {v}, [{src}]",
                "movdqu [{dst}], {v}",
                "add {src}, 16",
                "add {dst}, 16",
                "sub {n}, 16",
                "cmp {n}, 16",
                "jae 2b",
                "3:",
                "test {n}, 8",
                "jz 4f",
                "mov {t}, [{src}]",
                "mov [{dst}], {t}",
                "add {src}, 8",
                "add {dst}, 8",
                "4:",
                "test {n}, 4",
                "jz 5f",
                "mov {t:e}, [{src}]",
                "mov [{dst}], {t:e}",
                "add {src}, 4",
                "add {dst}, 4",
                "5:",
                "test {n}, 2",
                "jz 6f",
                "mov {t:x}, [{src}]",
                "mov [{dst}], {t:x}",
                "add {src}, 2",
                "add {dst}, 2",
                "6:",
                "test {n}, 1",
                "jz 7f",
                "mov {t:l}, [{src}]",
                "mov [{dst}], {t:l}",
                "7:",
                src = inout(reg) src => _,
                dst = inout(reg) dst => _,
                n = inout(reg) len => _,
                t = out(reg) _,
                v = out(xmm_reg) _,
                options(nostack)
            );
        }
    }

    /// Whether the CPU has AVX: 0 not asked yet, 1 no, 2 yes.
    static AVX: AtomicU8 = AtomicU8::new(0);

    fn has_avx() -> bool {
        // SYNC POINT: none needed, a cached answer to the same question; a race asks the
        // CPU twice and stores the same value.
        match AVX.load(Ordering::Relaxed) {
            0 => {
                let yes = std::arch::is_x86_feature_detected!("avx");
                AVX.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
            v => v == 2,
        }
    }

    /// The vector loop: whole blocks of 128 bytes with AVX (none without it), the rest
    /// (less than a block, or everything) with [`short`].
    ///
    /// # Safety
    /// As [`super::copy_shared`], and `len >= 128`.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn copy_vectors(dst: *mut u8, src: *const u8, len: usize) {
        let done = if has_avx() {
            // SAFETY: the CPU has AVX (checked above); the caller's ranges.
            unsafe { blocks_avx(dst, src, len / 128) };
            len / 128 * 128
        } else {
            0
        };
        // SAFETY: `done <= len`: the rest lies in both ranges.
        unsafe { short(dst.add(done), src.add(done), len - done) };
    }

    /// `blocks` blocks of 128 bytes with unaligned 32-byte loads and stores.
    ///
    /// # Safety
    /// The CPU has AVX; `src..src + 128 * blocks` is readable, `dst..dst + 128 * blocks`
    /// writable, and they do not overlap.
    #[target_feature(enable = "avx")]
    unsafe fn blocks_avx(dst: *mut u8, src: *const u8, blocks: usize) {
        if blocks == 0 {
            return;
        }
        // SAFETY: the caller's contract: each iteration reads and writes the next 128
        // bytes of the two ranges, `blocks` times; `vzeroupper` leaves the upper halves
        // clean for SSE code after it.
        unsafe {
            std::arch::asm!(
                "2:",
                "vmovdqu ymm0, [{src}]",
                "vmovdqu ymm1, [{src} + 32]",
                "vmovdqu ymm2, [{src} + 64]",
                "vmovdqu ymm3, [{src} + 96]",
                "vmovdqu [{dst}], ymm0",
                "vmovdqu [{dst} + 32], ymm1",
                "vmovdqu [{dst} + 64], ymm2",
                "vmovdqu [{dst} + 96], ymm3",
                "add {src}, 128",
                "add {dst}, 128",
                "dec {n}",
                "jnz 2b",
                "vzeroupper",
                src = inout(reg) src => _,
                dst = inout(reg) dst => _,
                n = inout(reg) blocks => _,
                out("ymm0") _,
                out("ymm1") _,
                out("ymm2") _,
                out("ymm3") _,
                options(nostack)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the vector sizes, at distances inside and outside the
    /// aliasing window, copies exactly its bytes and nothing beyond them.
    #[test]
    fn copies_to_shared_memory_exactly() {
        let src: Vec<u8> = (0..2_000u32).map(|i| (i * 11) as u8).collect();
        for &len in &[0, 1, 15, 64, 72, 511, 512, 1_500] {
            let mut dst = vec![0xEEu8; 2_000];
            // SAFETY: `3 + len <= dst.len()`, `len <= src.len()`; two separate vectors.
            unsafe { copy_to_shared(dst.as_mut_ptr().add(3), src.as_ptr(), len) };
            assert_eq!(&dst[3..3 + len], &src[..len], "len {len}");
            assert!(dst[..3].iter().chain(&dst[3 + len..]).all(|&b| b == 0xEE));
        }
    }

    #[test]
    fn copies_exactly_at_every_distance() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut dst = vec![0u8; 24_000];
        for &len in &[
            0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 56, 63, 64, 72, 127, 128, 255, 511, 512, 513, 640,
            4095, 4096, 12_345,
        ] {
            for &off in &[0usize, 1, 8, 31, 32, 63, 64, 100] {
                dst.fill(0xEE);
                // Shift the destination so that it lies `off` bytes after the source
                // modulo 4 KiB.
                let base = (src.as_ptr() as usize).wrapping_sub(dst.as_ptr() as usize) & 4095;
                let at = (base + off) & 4095;
                // SAFETY: `at + len <= 4095 + 12_345 < dst.len()`, `len <= src.len()`;
                // two separate vectors.
                unsafe { copy_shared(dst.as_mut_ptr().add(at), src.as_ptr(), len) };
                assert_eq!(
                    aliased(dst[at..].as_ptr(), src.as_ptr()),
                    (1..64).contains(&off)
                );
                assert_eq!(&dst[at..at + len], &src[..len], "len {len}, distance {off}");
                assert!(dst[..at].iter().all(|&b| b == 0xEE), "before, len {len}");
                assert!(
                    dst[at + len..].iter().all(|&b| b == 0xEE),
                    "after, len {len}"
                );
            }
        }
    }
}
