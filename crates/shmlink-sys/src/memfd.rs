//! Sealed memfd segments and their double mapping.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use crate::{owned, page_size, syscall};

/// The seals every segment carries before it is shared: nobody can shrink it (SIGBUS on
/// the other side), grow it, or change the seals.
pub const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// The seal that makes memory read-only for everyone but the writable mappings that
/// exist: the kernel refuses every new writable mapping, `mprotect` to writable and
/// `write`, whoever holds the descriptor (Linux 5.1 and later).
pub const SEAL_FUTURE_WRITE: libc::c_int = libc::F_SEAL_FUTURE_WRITE;

/// The seals of memory only its creator writes: [`SEALS`] and [`SEAL_FUTURE_WRITE`], added
/// after the creator's own writable mapping.
pub const OWNER_SEALS: libc::c_int = SEALS | SEAL_FUTURE_WRITE;

/// The seal that forbids every write, even through existing writable mappings (what a
/// genuine segment never carries: tests add it to show the kernel refuses it).
pub const SEAL_WRITE: libc::c_int = libc::F_SEAL_WRITE;

/// `PROT_READ`, and `PROT_WRITE` too if `writable`.
fn protection(writable: bool) -> libc::c_int {
    if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    }
}

/// Maps `len` bytes of `fd` from its start, shared, with `prot`, where the kernel chooses.
/// Whoever reads through the address makes sure the file backs the pages it touches.
fn map_file_start(
    fd: BorrowedFd<'_>,
    len: usize,
    prot: libc::c_int,
) -> io::Result<*mut libc::c_void> {
    // SAFETY: a fresh shared mapping chosen by the kernel; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base)
}

/// Writes `buf` at `offset` of the file (`pwrite`): how many bytes the kernel took. A
/// sealed segment refuses (`EPERM`): tests check that.
pub fn write_at(fd: BorrowedFd<'_>, offset: u64, buf: &[u8]) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
    // SAFETY: `buf` is readable for its length; the kernel only reads it.
    let n = syscall!(pwrite(
        fd.as_raw_fd(),
        buf.as_ptr().cast(),
        buf.len(),
        offset
    ))?;
    Ok(n as usize)
}

/// Sets the file's size (`ftruncate`). A sealed segment refuses to shrink or grow.
pub fn truncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length out of range"))?;
    // SAFETY: plain integer arguments on a descriptor the caller holds.
    syscall!(ftruncate(fd.as_raw_fd(), len))?;
    Ok(())
}

/// Creates an anonymous memfd of `size` bytes, zero-filled, and seals it.
pub fn create_sealed(name: &str, size: usize) -> io::Result<OwnedFd> {
    let fd = create_unsealed(name, size)?;
    // SAFETY: plain integer arguments on a descriptor we own.
    syscall!(fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS))?;
    Ok(fd)
}

/// Adds `seals` to a sealable memfd.
pub fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: plain integer arguments on a descriptor the caller holds.
    syscall!(fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals))?;
    Ok(())
}

/// The seals a memfd carries (`EINVAL`-based error if it is no sealable file).
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: plain integer arguments on a descriptor the caller holds.
    syscall!(fcntl(fd.as_raw_fd(), libc::F_GET_SEALS))
}

/// Creates an anonymous, sealable memfd of `size` bytes, zero-filled, without seals.
pub fn create_unsealed(name: &str, size: usize) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name contains NUL"))?;
    // SAFETY: `cname` is a valid NUL-terminated string; the flags are valid.
    let fd = syscall!(memfd_create(
        cname.as_ptr(),
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING
    ))?;
    // SAFETY: memfd_create returned a fresh descriptor.
    let fd = unsafe { owned(fd) };
    // SAFETY: plain integer arguments on a descriptor we own.
    syscall!(ftruncate(fd.as_raw_fd(), size as libc::off_t))?;
    Ok(fd)
}

/// Checks that a descriptor received from a peer is a memfd sealed against shrinking and
/// growing, of exactly `size` bytes: the size both sides derived from the handshake. A
/// file of another size means the peer and its announcement disagree.
pub fn check_sealed(fd: BorrowedFd<'_>, size: usize) -> io::Result<()> {
    check_seals(
        fd,
        size,
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        "sealed against resizing",
    )
}

/// Checks that a descriptor received from a peer is a memfd only the peer can write: it
/// carries every one of [`OWNER_SEALS`] (so nobody can map it writable any more, resize it
/// or change its seals) and has exactly `size` bytes. One `F_GET_SEALS` and one `fstat`.
pub fn check_owner_sealed(fd: BorrowedFd<'_>, size: usize) -> io::Result<()> {
    check_seals(
        fd,
        size,
        OWNER_SEALS,
        "sealed read-only for us (shrink, grow, seal and future-write)",
    )
}

/// Checks that `fd` is a sealable file carrying every seal of `need` (`what` says which
/// in an error) and of exactly `size` bytes.
fn check_seals(fd: BorrowedFd<'_>, size: usize, need: libc::c_int, what: &str) -> io::Result<()> {
    // SAFETY: plain integer arguments; F_GET_SEALS fails with EINVAL on anything that is
    // not a sealable file, which we report.
    let seals = syscall!(fcntl(fd.as_raw_fd(), libc::F_GET_SEALS)).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("segment is not a sealable memfd: {e}"),
        )
    })?;
    if seals & need != need {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("segment is not {what} (seals {seals:#x}, need {need:#x})"),
        ));
    }
    let got = file_size(fd)?;
    if got != size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("segment has {got} bytes, expected {size}"),
        ));
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes of the file at `offset` (`pread`, the counterpart of
/// [`write_at`]): how many bytes the kernel gave.
pub fn read_at(fd: BorrowedFd<'_>, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
    // SAFETY: `buf` is writable for its length; the kernel writes at most that many
    // bytes into it.
    let n = syscall!(pread(
        fd.as_raw_fd(),
        buf.as_mut_ptr().cast(),
        buf.len(),
        offset
    ))?;
    Ok(n as usize)
}

/// The size of the file behind `fd`.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<usize> {
    // SAFETY: stat is plain data; all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid stat buffer.
    syscall!(fstat(fd.as_raw_fd(), &mut st))?;
    usize::try_from(st.st_size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "negative file size"))
}

/// A mapped segment: a header area followed by ring data areas, each data area mapped
/// twice back to back so that any record up to the ring's size is contiguous in memory.
///
/// Layout of the file: `[header (page)] [ring 0 data] [ring 1 data] …`.
/// Layout of the mapping: `[header] [ring 0][ring 0 again] [ring 1][ring 1 again] …`.
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
    /// (offset in the mapping, size) of each ring's first copy.
    rings: Vec<(usize, usize)>,
}

// SAFETY: a Mapping is a plain region of shared memory; all access to its contents goes
// through raw pointers whose users synchronise with atomics.
unsafe impl Send for Mapping {}
// SAFETY: see Send; the struct itself is never mutated after creation.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// The file size a segment with these parts needs.
    pub fn file_size(header_len: usize, rings: &[usize]) -> usize {
        header_len + rings.iter().sum::<usize>()
    }

    /// Maps `fd` (at least [`Mapping::file_size`] bytes, sealed) with the layout above,
    /// read-write for the segment's creator, read-only for its peer (a file sealed with
    /// `F_SEAL_FUTURE_WRITE` can then never be made writable here). `header_len` and every
    /// ring size must be multiples of the page size.
    pub fn map(
        fd: BorrowedFd<'_>,
        header_len: usize,
        rings: &[usize],
        writable: bool,
    ) -> io::Result<Mapping> {
        let page = page_size();
        if header_len % page != 0 || rings.iter().any(|&r| r == 0 || r % page != 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("segment parts must be non-zero multiples of the page size {page}"),
            ));
        }
        let len = rings
            .iter()
            .try_fold(header_len, |acc, &r| acc.checked_add(r.checked_mul(2)?))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        let prot = protection(writable);
        // The whole address range at once, as the file from its start: the header and the
        // first ring's first copy are then in place already (file and mapping agree up to
        // there), and the fixed mappings below replace the rest, so they can only land
        // inside memory we own. Before they do, the tail maps past the end of the file or
        // other parts of it; nothing reads it then. Two `mmap` calls for a one-ring
        // segment instead of four (a reservation, the header, the ring twice): connection
        // setup maps four of them. A file that cannot be mapped past its end (a PCI BAR's
        // sysfs `resource` file: EINVAL) gets an anonymous reservation instead, and the
        // header and ring 0's first copy are mapped into it like the rest.
        // Pages past the end of the file are never touched (they are replaced below
        // before the mapping is handed out).
        let (base, in_place) = match map_file_start(fd, len, prot) {
            Ok(whole) => (whole, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // SAFETY: a fresh anonymous PROT_NONE mapping; no existing memory is
                // affected.
                let reserved = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                if reserved == libc::MAP_FAILED {
                    return Err(io::Error::last_os_error());
                }
                (reserved, false)
            }
            Err(e) => return Err(e),
        };
        let mut map = Mapping {
            base: NonNull::new(base.cast()).expect("mmap never returns null on success"),
            len,
            rings: Vec::with_capacity(rings.len()),
        };
        let fixed = |offset: usize, size: usize, file_off: usize| -> io::Result<()> {
            // SAFETY: [base+offset, base+offset+size) lies inside our reservation (offsets
            // are sums of the sizes that made up `len`), so MAP_FIXED replaces only pages
            // we own; the file is sealed and at least `file_off + size` long (checked by
            // the caller).
            let p = unsafe {
                libc::mmap(
                    base.cast::<u8>().add(offset).cast(),
                    size,
                    prot,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    file_off as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        if !in_place {
            fixed(0, header_len, 0)?;
        }
        let (mut off, mut file_off) = (header_len, header_len);
        for (i, &r) in rings.iter().enumerate() {
            // Ring 0's first copy came with the whole range (same offset in both).
            if i > 0 || !in_place {
                fixed(off, r, file_off)?;
            }
            fixed(off + r, r, file_off)?;
            map.rings.push((off, r));
            off += 2 * r;
            file_off += r;
        }
        Ok(map)
    }

    /// Start of the header area.
    pub fn header(&self) -> NonNull<u8> {
        self.base
    }

    /// Start and size of ring `i`'s data area (mapped twice: `2 * size` bytes are valid).
    pub fn ring(&self, i: usize) -> (NonNull<u8>, usize) {
        let (off, size) = self.rings[i];
        // SAFETY: `off` lies inside the mapping by construction.
        (unsafe { self.base.add(off) }, size)
    }
}

/// One plain shared mapping of a whole file (no double mapping), readable, and writable
/// if asked for: the publish/subscribe segments.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is a plain region of shared memory; all access to its contents goes
// through raw pointers whose users synchronise with atomics.
unsafe impl Send for Region {}
// SAFETY: see Send; the struct itself is never mutated after creation.
unsafe impl Sync for Region {}

impl Region {
    /// Maps the first `len` bytes of `fd` shared, read-only or read-write. A read-only
    /// mapping of a file sealed with `F_SEAL_FUTURE_WRITE` can never be made writable
    /// (the kernel refuses `mprotect`), which is what protects a segment from the
    /// processes that only read it.
    pub fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Region> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let prot = protection(writable);
        // The caller checked that the file is at least `len` bytes and sealed against
        // shrinking, so every mapped page stays backed (no SIGBUS).
        let base = map_file_start(fd, len, prot)?;
        Ok(Region {
            base: NonNull::new(base.cast()).expect("mmap never returns null on success"),
            len,
        })
    }

    /// Start of the mapping (page-aligned).
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Asks the kernel to make the whole mapping writable (`mprotect`): refused
    /// (`EACCES`) for a read-only mapping of a file sealed with [`SEAL_FUTURE_WRITE`],
    /// which tests check.
    pub fn make_writable(&self) -> io::Result<()> {
        // SAFETY: base/len describe exactly our own live mapping; more permission on it
        // invalidates no reference.
        syscall!(mprotect(
            self.base.as_ptr().cast(),
            self.len,
            libc::PROT_READ | libc::PROT_WRITE
        ))?;
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: base/len describe exactly the mapping made in `map`; its users borrow
        // the Region's owner, so nothing refers to it once the Region is gone.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len describe exactly the mapping made in `map`; nothing refers
        // to it once the Mapping is gone (rings borrow the Mapping's owner).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn double_mapping_mirrors_the_ring() {
        let page = page_size();
        let fd = create_sealed("t", Mapping::file_size(page, &[page, 2 * page])).unwrap();
        let m = Mapping::map(fd.as_fd(), page, &[page, 2 * page], true).unwrap();
        let (r1, size) = m.ring(1);
        // SAFETY: both offsets lie in the doubly mapped 2*size bytes of ring 1.
        unsafe {
            r1.as_ptr().add(5).write(42);
            assert_eq!(r1.as_ptr().add(size + 5).read(), 42);
        }
    }

    #[test]
    fn future_write_seal_keeps_readers_read_only() {
        let page = page_size();
        let fd = create_unsealed("t", page).unwrap();
        let rw = Region::map(fd.as_fd(), page, true).unwrap();
        add_seals(fd.as_fd(), SEALS | libc::F_SEAL_FUTURE_WRITE).unwrap();
        // The creator's mapping stays writable …
        // SAFETY: offset 0 of a one-page writable mapping.
        unsafe { rw.base().as_ptr().write(7) };
        // … nobody can map the file writable any more, or make a read-only mapping
        // writable, or write through the descriptor.
        assert!(Region::map(fd.as_fd(), page, false).is_ok());
        let err = Region::map(fd.as_fd(), page, true).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        let ro = Region::map(fd.as_fd(), page, false).unwrap();
        // SAFETY: asks to change the protection of our own read-only mapping.
        let r = unsafe {
            libc::mprotect(
                ro.base().as_ptr().cast(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        assert_eq!(r, -1);
        // SAFETY: a one-byte buffer.
        let w = unsafe { libc::write(fd.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        assert_eq!(w, -1);
        // SAFETY: offset 0 of a one-page readable mapping of the same file.
        assert_eq!(unsafe { ro.base().as_ptr().read() }, 7);
        assert!(seals(fd.as_fd()).unwrap() & libc::F_SEAL_FUTURE_WRITE != 0);
    }

    #[test]
    fn sealed_segments_cannot_be_resized() {
        let fd = create_sealed("t", 8192).unwrap();
        // SAFETY: plain integer arguments on a descriptor we own.
        let err = syscall!(ftruncate(fd.as_raw_fd(), 4096)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        check_sealed(fd.as_fd(), 8192).unwrap();
        assert!(check_sealed(fd.as_fd(), 8193).is_err());
        assert!(check_sealed(fd.as_fd(), 4096).is_err());
    }
}
