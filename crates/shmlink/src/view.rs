//! [`SharedBytes`]: a received message lent in place, read without undefined behaviour
//! even while another process writes it (docs/threat-model.md, "in-place reads").
//!
//! A `&[u8]` promises the compiler that nobody changes the bytes while it lives. Over a
//! ring the peer maps, a hostile peer can break that promise at will, and safe code that
//! trusted it (say `str::from_utf8` followed by `chars().next_back()`) can then read out
//! of bounds. So the safe methods here never hand out such a reference over memory
//! another process may write: they copy out with [`sys::copy_shared`], which reads the
//! bytes exactly once and is outside the Rust memory model's data-race rules. The
//! borrowing accessor is `unsafe`, with the trust it needs in its contract; where the
//! bytes live in this process's own memory (messages over `ux:`, `tcp:`, `tls:`, and
//! `shm:` messages reassembled from fragments), [`SharedBytes::as_local`] lends them
//! safely.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::sys;

/// The bytes of a message lent in place: in a shared-memory ring another process may be
/// writing (`shm:`), or in this process's own memory. Copy them out, or borrow them with
/// [`as_local`](SharedBytes::as_local) or, trusting the peer, with the `unsafe`
/// [`as_slice`](SharedBytes::as_slice).
///
/// ```
/// # fn demo(conn: &mut shmlink::Connection) -> shmlink::Result<()> {
/// let msg = conn.recv_ref()?;
/// let mut header = [0u8; 8];
/// let n = msg.bytes().copy_to(&mut header); // the first min(8, len) bytes
/// println!("{} bytes, header {:?}", msg.len(), &header[..n]);
/// # Ok(()) }
/// ```
///
/// No safe path leads to a `&[u8]` over the peer's memory:
///
/// ```compile_fail
/// # fn demo(conn: &mut shmlink::Connection) -> shmlink::Result<()> {
/// let msg = conn.recv_ref()?;
/// let text = std::str::from_utf8(&msg); // RecvBuf is not a slice
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn demo(conn: &mut shmlink::Connection) -> shmlink::Result<()> {
/// let msg = conn.recv_ref()?;
/// let bytes: &[u8] = msg.bytes().as_slice(); // needs `unsafe`
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn demo(sub: &mut shmlink::Subscriber) -> shmlink::Result<()> {
/// let sample = sub.recv_ref()?;
/// let first = sample[0]; // Sample is not a slice either
/// # Ok(()) }
/// ```
///
/// `Send`, `Sync`, `Copy`: a view whose every read is a copy.
#[derive(Clone, Copy)]
pub struct SharedBytes<'a> {
    ptr: NonNull<u8>,
    len: usize,
    /// In this process's own memory: no other process can change it.
    local: bool,
    _lent: PhantomData<&'a [u8]>,
}

// SAFETY: a SharedBytes is a read-only view; reading it from another thread is what any
// reader does (the bytes are only ever read through `copy_shared` or under the
// contracts of `as_slice`/`as_local`).
unsafe impl Send for SharedBytes<'_> {}
// SAFETY: as for Send: every access is a read.
unsafe impl Sync for SharedBytes<'_> {}

impl<'a> SharedBytes<'a> {
    /// Bytes in this process's own memory.
    pub(crate) fn local(bytes: &'a [u8]) -> SharedBytes<'a> {
        SharedBytes {
            ptr: NonNull::from(bytes).cast(),
            len: bytes.len(),
            local: true,
            _lent: PhantomData,
        }
    }

    /// Bytes in memory another process maps and may write.
    ///
    /// # Safety
    /// `ptr..ptr + len` stays mapped and readable for `'a`.
    pub(crate) unsafe fn shared(ptr: NonNull<u8>, len: usize) -> SharedBytes<'a> {
        SharedBytes {
            ptr,
            len,
            local: false,
            _lent: PhantomData,
        }
    }

    /// The message length (fixed when the message was received; the peer cannot change
    /// it).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the first `min(len, dst.len())` bytes into `dst`; returns how many.
    #[inline]
    pub fn copy_to(&self, dst: &mut [u8]) -> usize {
        self.copy_range_to(0, dst)
    }

    /// Copies bytes from `offset` on into `dst`, as many as fit and exist; returns how
    /// many (0 when `offset` is past the end).
    #[inline]
    pub fn copy_range_to(&self, offset: usize, dst: &mut [u8]) -> usize {
        let n = self.len.saturating_sub(offset).min(dst.len());
        if n == 0 {
            return 0;
        }
        // SAFETY: `offset + n <= len`, inside the lent bytes, which stay mapped for 'a;
        // `dst` is a distinct, writable buffer of at least `n` bytes.
        unsafe { sys::copy_shared(dst.as_mut_ptr(), self.ptr.as_ptr().add(offset), n) };
        n
    }

    /// The byte at `i`, read once.
    #[inline]
    pub fn get(&self, i: usize) -> Option<u8> {
        let mut b = [0u8];
        (self.copy_range_to(i, &mut b) == 1).then_some(b[0])
    }

    /// A copy of the whole message.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        // SAFETY: the vector has capacity `len`; `copy_shared` initialises exactly
        // `len` bytes of it from the lent bytes (mapped for 'a) before `set_len`.
        unsafe {
            sys::copy_shared(v.as_mut_ptr(), self.ptr.as_ptr(), self.len);
            v.set_len(self.len);
        }
        v
    }

    /// The bytes, borrowed, when they live in this process's own memory (`ux:`, `tcp:`,
    /// `tls:`, and `shm:` messages reassembled from fragments); `None` when they are in
    /// a ring another process maps.
    #[inline]
    pub fn as_local(&self) -> Option<&'a [u8]> {
        // SAFETY: local bytes are owned by this process and not changed while lent.
        self.local
            .then(|| unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes, borrowed in place, wherever they are.
    ///
    /// # Safety
    /// No other process may write these bytes while the returned slice is used. That
    /// holds when the peer is trusted to follow the protocol: on `shm:` a sender never
    /// writes a record before the receiver has released it. A hostile or broken peer can
    /// change the bytes under the reference, which is undefined behaviour; use the copy
    /// methods unless you trust the peer.
    #[inline]
    pub unsafe fn as_slice(&self) -> &'a [u8] {
        // SAFETY: mapped for 'a; the caller promises nobody writes meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for SharedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBytes")
            .field("len", &self.len)
            .field("local", &self.local)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_bounded_by_both_ends() {
        let data: Vec<u8> = (0..100).collect();
        let b = SharedBytes::local(&data);
        assert_eq!(b.to_vec(), data);
        let mut small = [0u8; 10];
        assert_eq!(b.copy_to(&mut small), 10);
        assert_eq!(small, data[..10]);
        let mut big = [0u8; 200];
        assert_eq!(b.copy_to(&mut big), 100);
        assert_eq!(&big[..100], &data[..]);
        assert_eq!(b.copy_range_to(95, &mut small), 5);
        assert_eq!(small[..5], data[95..]);
        assert_eq!(b.copy_range_to(100, &mut small), 0);
        assert_eq!(b.copy_range_to(usize::MAX, &mut small), 0);
        assert_eq!(b.get(99), Some(99));
        assert_eq!(b.get(100), None);
        assert_eq!(b.as_local(), Some(&data[..]));
        // SAFETY: a view of the test's own vector: nobody else writes it.
        let shared = unsafe { SharedBytes::shared(NonNull::from(&data[..]).cast(), data.len()) };
        assert_eq!(shared.as_local(), None);
        assert_eq!(shared.to_vec(), data);
    }
}
