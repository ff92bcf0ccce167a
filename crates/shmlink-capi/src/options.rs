//! The opaque options builders: `shmlink_options` (connections and listeners) and
//! `shmlink_pubsub_options` (publishers and subscribers).
//!
//! Every setter checks its value at once (EINVAL, the options unchanged) where the value
//! alone can be judged; combinations are checked when the options are used.

use std::ffi::{c_char, c_int};
use std::time::Duration;

use shmlink::{Options, Pem, Policy, PubSubOptions, TlsOptions, WaitPolicy};

use crate::args::{obj, text};
use crate::error::{call, Fail, Res};

/// Options for `shmlink_connect` and `shmlink_listen` (opaque). Make one with
/// `shmlink_options_new`, set what you need, pass it to any number of calls (they copy
/// what they need), free it with `shmlink_options_free`.
pub struct ShmlinkOptions {
    pub(crate) opts: Options,
}

/// Options for `shmlink_publisher_bind` and `shmlink_subscribe` (opaque); see
/// `shmlink_pubsub_options_new`.
pub struct ShmlinkPubsubOptions {
    pub(crate) opts: PubSubOptions,
}

/// `shmlink_pubsub_options_set_policy`: a full ring makes `shmlink_publish` wait for the
/// slowest subscriber (lossless; the default).
pub const SHMLINK_POLICY_BLOCK: c_int = 0;
/// `shmlink_pubsub_options_set_policy`: the publisher never waits; a subscriber that
/// falls behind loses the oldest messages and is told how many (`EOVERFLOW`).
pub const SHMLINK_POLICY_OVERWRITE: c_int = 1;

/// The defaults of `opts`, or of a NULL pointer.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`.
pub(crate) unsafe fn conn_opts(opts: *const ShmlinkOptions) -> Options {
    // SAFETY: forwarded to the caller.
    match unsafe { opts.as_ref() } {
        Some(o) => o.opts.clone(),
        None => Options::default(),
    }
}

/// The defaults of `opts`, or of a NULL pointer.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
pub(crate) unsafe fn pubsub_opts(opts: *const ShmlinkPubsubOptions) -> PubSubOptions {
    // SAFETY: forwarded to the caller.
    match unsafe { opts.as_ref() } {
        Some(o) => o.opts.clone(),
        None => PubSubOptions::default(),
    }
}

/// Applies `change` to the options if the result validates; EINVAL (options unchanged)
/// otherwise.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options` no other thread uses during the call.
unsafe fn set(opts: *mut ShmlinkOptions, change: impl FnOnce(Options) -> Res<Options>) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let o = unsafe { obj(opts, "options") }?;
        let next = change(o.opts.clone())?;
        next.validate()?;
        o.opts = next;
        Ok(0)
    })
}

/// Like [`set`] for pub/sub options; `check` judges the value alone (combinations are
/// checked by bind and subscribe, since the order of the setters must not matter).
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options` no other thread uses during the call.
unsafe fn set_ps(
    opts: *mut ShmlinkPubsubOptions,
    change: impl FnOnce(PubSubOptions) -> Res<PubSubOptions>,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let o = unsafe { obj(opts, "pub/sub options") }?;
        o.opts = change(o.opts.clone())?;
        Ok(0)
    })
}

/// Like [`set`] without validating the whole: the TLS file setters (a certificate
/// without its key is incomplete until the next setter adds the key; `connect` and
/// `listen` check the whole).
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options` no other thread uses during the call.
unsafe fn set_partial(
    opts: *mut ShmlinkOptions,
    change: impl FnOnce(Options) -> Res<Options>,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let o = unsafe { obj(opts, "options") }?;
        o.opts = change(o.opts.clone())?;
        Ok(0)
    })
}

fn millis(ms: u64, what: &str) -> Res<Duration> {
    if ms == 0 {
        return Err(Fail::inval(format!("option {what} must be non-zero")));
    }
    Ok(Duration::from_millis(ms))
}

/// A uid/gid list from C.
///
/// # Safety
/// `ids` is NULL (with `n == 0`) or points to `n` readable `uint32_t`.
unsafe fn ids(ids: *const u32, n: usize) -> Res<Vec<u32>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if ids.is_null() {
        return Err(Fail::inval(format!(
            "id list is NULL but its length is {n}"
        )));
    }
    if n > 1 << 20 {
        return Err(Fail::inval(format!("id list of {n} entries is too long")));
    }
    // SAFETY: non-NULL, `n` readable ids as the caller promises.
    Ok(unsafe { std::slice::from_raw_parts(ids, n) }.to_vec())
}

/// New connection options with the defaults (ring 256 KiB per direction, messages up to
/// 64 MiB, spin 20 µs then yield 30 µs then sleep, connect timeout 5 s, handshake
/// timeout 2 s). NULL with `ENOMEM` only if memory runs out.
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn shmlink_options_new() -> *mut ShmlinkOptions {
    call(std::ptr::null_mut(), || {
        Ok(Box::into_raw(Box::new(ShmlinkOptions {
            opts: Options::default(),
        })))
    })
}

/// Frees options made by `shmlink_options_new` (NULL: nothing happens). Connections and
/// listeners made with them keep working.
///
/// Thread safety: no other thread may use `opts` during or after the call.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_free(opts: *mut ShmlinkOptions) {
    if !opts.is_null() {
        call((), || {
            // SAFETY: made by Box::into_raw in shmlink_options_new, freed once (caller).
            drop(unsafe { Box::from_raw(opts) });
            Ok(())
        })
    }
}

/// Bytes per ring and direction on `shm:` (a power of two, 4096 ..= 1 GiB; default
/// 256 KiB); on a listener the largest ring a client may ask for. 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object (the same for every setter).
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_ring_size(
    opts: *mut ShmlinkOptions,
    bytes: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set(opts, |o| Ok(o.ring_size(bytes))) }
}

/// Largest message this side sends or accepts (1 ..= 1 GiB; default 64 MiB). Larger
/// messages than a ring are fragmented. 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_max_msg_size(
    opts: *mut ShmlinkOptions,
    bytes: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set(opts, |o| {
            if bytes == 0 {
                return Err(Fail::inval("option max_msg_size must be non-zero"));
            }
            Ok(o.max_msg_size(bytes))
        })
    }
}

/// How a blocked call waits for its peer: busy-poll `spin_us` microseconds, then poll
/// with `sched_yield` for `yield_us`, then sleep in the kernel. Both 0: always sleep.
/// Default 20 and 30. 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_wait_policy(
    opts: *mut ShmlinkOptions,
    spin_us: u64,
    yield_us: u64,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set(opts, |o| {
            Ok(o.wait_policy(WaitPolicy {
                spin: Duration::from_micros(spin_us),
                yield_: Duration::from_micros(yield_us),
            }))
        })
    }
}

/// How long `shmlink_connect` waits for the listener and the handshake (milliseconds,
/// non-zero; default 5000). 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_connect_timeout_ms(
    opts: *mut ShmlinkOptions,
    ms: u64,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set(opts, |o| {
            Ok(o.connect_timeout(millis(ms, "connect_timeout")?))
        })
    }
}

/// How long a listener waits for a client's handshake before dropping it (milliseconds,
/// non-zero; default 2000). 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_handshake_timeout_ms(
    opts: *mut ShmlinkOptions,
    ms: u64,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set(opts, |o| {
            Ok(o.handshake_timeout(millis(ms, "handshake_timeout")?))
        })
    }
}

/// Listener: user ids admitted besides the listener's own uid and root (checked with
/// `SO_PEERCRED`); replaces an earlier list. `uids` may be NULL when `n` is 0.
/// 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `uids` points to `n` readable ids.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_allow_uids(
    opts: *mut ShmlinkOptions,
    uids: *const u32,
    n: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set(opts, |o| Ok(o.allow_uids(ids(uids, n)?))) }
}

/// Listener: group ids whose members are admitted too; replaces an earlier list.
/// 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `gids` points to `n` readable ids.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_allow_gids(
    opts: *mut ShmlinkOptions,
    gids: *const u32,
    n: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set(opts, |o| Ok(o.allow_gids(ids(gids, n)?))) }
}

/// Client: the user ids the listening process may run as (default: this process's uid
/// or root); a listener run by anyone else is refused with `EACCES`. 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `uids` points to `n` readable ids.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_expect_uids(
    opts: *mut ShmlinkOptions,
    uids: *const u32,
    n: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set(opts, |o| Ok(o.expect_uids(ids(uids, n)?))) }
}

/// Declares the rendezvous directory shared with other users on purpose (1) or not (0,
/// the default: a directory other users may write is refused). 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_shared_rendezvous_dir(
    opts: *mut ShmlinkOptions,
    shared: bool,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set(opts, |o| Ok(o.shared_rendezvous_dir(shared))) }
}

/// Which TLS file `set_tls_file` sets.
#[derive(Clone, Copy)]
enum TlsFile {
    Cert,
    Key,
    Ca,
}

/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `path` NULL or a NUL-terminated string.
unsafe fn set_tls_file(opts: *mut ShmlinkOptions, path: *const c_char, which: TlsFile) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set_partial(opts, |o| {
            // SAFETY: forwarded to the caller.
            let path = text(path, "TLS file path")?;
            let pem = Pem::file(path);
            let tls: TlsOptions = o.configured_tls().clone();
            let tls = match which {
                TlsFile::Cert => tls.cert(pem),
                TlsFile::Key => tls.key(pem),
                TlsFile::Ca => tls.ca(pem),
            };
            Ok(o.tls(tls))
        })
    }
}

/// `tls:` (and `auto:` with TLS): the PEM file of this side's certificate chain (a
/// listener's, or a client's for client authentication). Read when the options are used.
/// 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_tls_cert_file(
    opts: *mut ShmlinkOptions,
    path: *const c_char,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set_tls_file(opts, path, TlsFile::Cert) }
}

/// `tls:`: the PEM file of the private key that goes with the certificate.
/// 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_tls_key_file(
    opts: *mut ShmlinkOptions,
    path: *const c_char,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set_tls_file(opts, path, TlsFile::Key) }
}

/// `tls:`: the PEM file of the CA certificates trusted for the peer (a client checks the
/// listener with it; a listener given one requires client certificates signed by it).
/// 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `path` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_tls_ca_file(
    opts: *mut ShmlinkOptions,
    path: *const c_char,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set_tls_file(opts, path, TlsFile::Ca) }
}

/// `tls:` client: the name the listener's certificate must be valid for (default: the
/// host of the address). 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_options`; `name` NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn shmlink_options_set_tls_server_name(
    opts: *mut ShmlinkOptions,
    name: *const c_char,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set(opts, |o| {
            // SAFETY: forwarded to the caller.
            let name = text(name, "TLS server name")?;
            let tls = o.configured_tls().clone().server_name(name);
            Ok(o.tls(tls))
        })
    }
}

/// New pub/sub options with the defaults (publisher: 1024 slots, messages up to 4080
/// bytes, block policy, stall timeout 1 s, no history, up to 128 subscribers;
/// subscriber: accepts any topic, replays whatever history the publisher offers).
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn shmlink_pubsub_options_new() -> *mut ShmlinkPubsubOptions {
    call(std::ptr::null_mut(), || {
        Ok(Box::into_raw(Box::new(ShmlinkPubsubOptions {
            opts: PubSubOptions::default(),
        })))
    })
}

/// Frees pub/sub options (NULL: nothing happens).
///
/// Thread safety: no other thread may use `opts` during or after the call.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_free(opts: *mut ShmlinkPubsubOptions) {
    if !opts.is_null() {
        call((), || {
            // SAFETY: made by Box::into_raw in shmlink_pubsub_options_new, freed once.
            drop(unsafe { Box::from_raw(opts) });
            Ok(())
        })
    }
}

/// Publisher: the number of slots (messages the ring holds), a power of two in
/// 2 ..= 2^24. 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object (the same for every setter).
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_slots(
    opts: *mut ShmlinkPubsubOptions,
    n: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set_ps(opts, |o| {
            if !n.is_power_of_two() || n < 2 {
                return Err(Fail::inval(format!(
                    "option slots = {n}: must be a power of two, at least 2"
                )));
            }
            Ok(o.slots(n))
        })
    }
}

/// Publisher: a byte budget for the ring instead of a slot count (the largest
/// power-of-two number of slots that fits, at least 2). 0 or -1 (`EINVAL` for 0).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_capacity(
    opts: *mut ShmlinkPubsubOptions,
    bytes: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set_ps(opts, |o| {
            if bytes == 0 {
                return Err(Fail::inval("option capacity must be non-zero"));
            }
            Ok(o.capacity(bytes))
        })
    }
}

/// Publisher: the largest message (default 4080). Subscriber: the largest message it
/// accepts (a topic with a larger maximum is refused). 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_max_msg_size(
    opts: *mut ShmlinkPubsubOptions,
    bytes: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set_ps(opts, |o| {
            if bytes == 0 || bytes > shmlink::options::MAX_MSG_SIZE_LIMIT {
                return Err(Fail::inval(format!(
                    "option max_msg_size = {bytes}: must be in 1..={}",
                    shmlink::options::MAX_MSG_SIZE_LIMIT
                )));
            }
            Ok(o.max_msg_size(bytes))
        })
    }
}

/// Publisher: `SHMLINK_POLICY_BLOCK` (default) or `SHMLINK_POLICY_OVERWRITE`.
/// 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_policy(
    opts: *mut ShmlinkPubsubOptions,
    policy: c_int,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set_ps(opts, |o| match policy {
            SHMLINK_POLICY_BLOCK => Ok(o.policy(Policy::Block)),
            SHMLINK_POLICY_OVERWRITE => Ok(o.policy(Policy::Overwrite)),
            _ => Err(Fail::inval(format!("unknown policy {policy}"))),
        })
    }
}

/// Publisher, block policy: how long a subscriber that holds the publisher up has to
/// catch up before it is detached (milliseconds, non-zero; default 1000).
/// 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_stall_timeout_ms(
    opts: *mut ShmlinkPubsubOptions,
    ms: u64,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set_ps(opts, |o| Ok(o.stall_timeout(millis(ms, "stall_timeout")?))) }
}

/// Publisher: how many past messages a late joiner may replay (below the slot count).
/// Subscriber: how many it wants (0: start with the next message). 0 or -1.
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_history(
    opts: *mut ShmlinkPubsubOptions,
    messages: u64,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe { set_ps(opts, |o| Ok(o.history(messages))) }
}

/// Publisher: most subscribers at once (1 ..= 128). 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_max_subscribers(
    opts: *mut ShmlinkPubsubOptions,
    n: usize,
) -> c_int {
    // SAFETY: forwarded to the caller.
    unsafe {
        set_ps(opts, |o| {
            if !(1..=shmlink::options::MAX_SUBSCRIBERS).contains(&n) {
                return Err(Fail::inval(format!(
                    "option max_subscribers = {n}: must be in 1..={}",
                    shmlink::options::MAX_SUBSCRIBERS
                )));
            }
            Ok(o.max_subscribers(n))
        })
    }
}

/// The connection options underneath (wait policy, TLS files, allowed and expected
/// uids, timeouts): a copy of `base` (NULL: the defaults). 0 or -1 (`EINVAL`).
///
/// Thread safety: one thread at a time per options object.
///
/// # Safety
/// `opts` is NULL or a live `shmlink_pubsub_options`; `base` NULL or a live
/// `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pubsub_options_set_options(
    opts: *mut ShmlinkPubsubOptions,
    base: *const ShmlinkOptions,
) -> c_int {
    // SAFETY: forwarded to the caller.
    let base = unsafe { conn_opts(base) };
    // SAFETY: forwarded to the caller.
    unsafe { set_ps(opts, |o| Ok(o.options(base))) }
}
