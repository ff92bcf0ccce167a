//! Connection and listener options, TLS settings among them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// Smallest ring: one page.
pub const MIN_RING_SIZE: usize = 4096;
/// Largest ring (per direction).
pub const MAX_RING_SIZE: usize = 1 << 30;
/// Hard upper bound for [`Options::max_msg_size`].
pub const MAX_MSG_SIZE_LIMIT: usize = 1 << 30;
/// A ring record's header and alignment slack on top of its payload
/// ([`Options::large_messages`]).
const LARGE_RECORD_OVERHEAD: usize = 16;

/// How a blocked call waits for its peer: busy-poll, then yield, then sleep in the kernel.
///
/// A shared-memory round trip costs a fraction of a microsecond while a wake-up from sleep
/// costs several to tens of microseconds (more across cores in a VM), so a short spin keeps
/// busy connections fast; the budget bounds the CPU an idle connection burns before it
/// parks. `spin` polls with the CPU's `pause` hint; `yield_` polls with `sched_yield`, which
/// lets a peer pinned to the same core run. Both zero means "always sleep" (the blocking
/// policy).
///
/// On `shm:`, a blocking receive that took 64 KiB or more since its previous wait yields
/// for longer before it sleeps: half a nanosecond more per byte taken, at most 1 ms (a
/// peer needs about that long to produce a message of that size; sleeping would add a
/// wake-up to every large message). Not under the blocking policy.
///
/// Setting a connection up waits the same way: a client for the listener's answer, both
/// ends of an `auto:` negotiation for each other, and an `auto:` listener's blocking
/// `accept` for its next client (at most this budget after each connection it hands out,
/// so that clients connecting back to back find it awake). On a thread whose affinity
/// allows one CPU only, these waits skip the spin and yield for the whole budget: a peer
/// on that CPU could not run while they spin.
///
/// `Send`, `Sync`, `Copy`.
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

/// Where a PEM document comes from: a file, or the text itself.
///
/// Its `Debug` form never shows the text, which may be a private key.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, PartialEq, Eq)]
pub enum Pem {
    /// The path of a file holding PEM text.
    File(PathBuf),
    /// PEM text (`-----BEGIN …-----` blocks).
    Text(String),
}

impl Pem {
    /// PEM read from the file at `path` (when the connection or listener is set up).
    pub fn file(path: impl Into<PathBuf>) -> Pem {
        Pem::File(path.into())
    }

    /// PEM given as text.
    pub fn text(pem: impl Into<String>) -> Pem {
        Pem::Text(pem.into())
    }
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pem::File(path) => f.debug_tuple("File").field(path).finish(),
            Pem::Text(text) => write!(f, "Text(<{} bytes>)", text.len()),
        }
    }
}

impl fmt::Display for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pem::File(path) => write!(f, "file {}", path.display()),
            Pem::Text(_) => f.write_str("PEM text"),
        }
    }
}

/// TLS settings for `tls:HOST:PORT` (set with [`Options::tls`]; other transports ignore
/// them).
///
/// - A **listener** needs its certificate chain ([`cert`](Self::cert)) and private key
///   ([`key`](Self::key)). With a [`ca`](Self::ca) too, it requires every client to
///   present a certificate signed by that CA (mutual TLS) and refuses the others.
/// - A **client** needs the [`ca`](Self::ca) that signed the listener's certificate:
///   there are no system roots. It checks that the certificate is valid for the host
///   name or IP address of the address it connects to — or for
///   [`server_name`](Self::server_name) — unless [`verify_hostname`](Self::verify_hostname)
///   is switched off. With [`cert`](Self::cert) and [`key`](Self::key) it presents a
///   certificate to a listener that asks for one.
///
/// A refused certificate, ours or the peer's, fails `connect` with
/// [`ErrorKind::PermissionDenied`] and a message that says what was wrong. Only TLS 1.3
/// is spoken.
///
/// ```
/// use shmlink::{Options, Pem, TlsOptions};
/// let server = Options::default().tls(
///     TlsOptions::new()
///         .cert(Pem::file("/etc/myapp/server.pem"))
///         .key(Pem::file("/etc/myapp/server.key"))
///         .ca(Pem::file("/etc/myapp/clients-ca.pem")), // require client certificates
/// );
/// let client = Options::default().tls(
///     TlsOptions::new()
///         .ca(Pem::file("/etc/myapp/ca.pem"))
///         .server_name("server.example"), // the name in the listener's certificate
/// );
/// # let _ = (server, client);
/// ```
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsOptions {
    pub(crate) cert: Option<Pem>,
    pub(crate) key: Option<Pem>,
    pub(crate) ca: Option<Pem>,
    pub(crate) server_name: Option<String>,
    pub(crate) verify_hostname: bool,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            cert: None,
            key: None,
            ca: None,
            server_name: None,
            verify_hostname: true,
        }
    }
}

impl TlsOptions {
    /// No certificates, hostname verification on.
    pub fn new() -> TlsOptions {
        TlsOptions::default()
    }

    /// This side's certificate chain: its own certificate first, then any intermediates.
    pub fn cert(mut self, pem: Pem) -> Self {
        self.cert = Some(pem);
        self
    }

    /// This side's private key (PKCS#8, PKCS#1 or SEC1), for [`cert`](Self::cert).
    pub fn key(mut self, pem: Pem) -> Self {
        self.key = Some(pem);
        self
    }

    /// The certificates of the CA(s) this side trusts to sign the peer's certificate.
    /// Required on a client; on a listener it turns on mutual TLS.
    pub fn ca(mut self, pem: Pem) -> Self {
        self.ca = Some(pem);
        self
    }

    /// The name (DNS name or IP address) the listener's certificate must be valid for,
    /// when it differs from the host in the address (the default).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Whether a client checks that the listener's certificate is valid for the server
    /// name (default: on). Off, any certificate the CA signed is accepted, whatever name
    /// it is for.
    pub fn verify_hostname(mut self, on: bool) -> Self {
        self.verify_hostname = on;
        self
    }

    /// Checks what can be checked without reading files; the error names the option.
    fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::new(ErrorKind::InvalidInput, msg));
        match (&self.cert, &self.key) {
            (Some(_), None) => return bad("option tls.cert is set without tls.key".into()),
            (None, Some(_)) => return bad("option tls.key is set without tls.cert".into()),
            _ => {}
        }
        if self.server_name.as_deref() == Some("") {
            return bad("option tls.server_name is empty".into());
        }
        Ok(())
    }
}

/// Options for [`Connection::connect`](crate::Connection::connect) and
/// [`Listener::bind`](crate::Listener::bind).
///
/// A by-value builder: each setter has the option's plain name and returns the options;
/// the value reads back through the same name prefixed `configured_` (the pattern of
/// [`PubSubOptions`](crate::PubSubOptions) too). `Send`, `Sync`, `Clone`.
///
/// ```
/// use std::time::Duration;
/// let opts = shmlink::Options::default()
///     .ring_size(1 << 20)
///     .max_msg_size(16 << 20)
///     .connect_timeout(Duration::from_secs(2));
/// assert_eq!(opts.configured_ring_size(), 1 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub(crate) ring_size: usize,
    /// `shm:` copying sends of 64 KiB or more keep within `run_ahead` of the receiver:
    /// the ring was sized by [`Options::large_messages`] for work in place, not by the
    /// user as a buffer.
    pub(crate) copy_ahead: bool,
    pub(crate) max_msg_size: usize,
    pub(crate) wait: WaitPolicy,
    pub(crate) connect_timeout: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) allow_uids: Vec<u32>,
    pub(crate) allow_gids: Vec<u32>,
    pub(crate) dir_mode: u32,
    pub(crate) expect_uids: Vec<u32>,
    pub(crate) shared_dir: bool,
    pub(crate) tls: TlsOptions,
    /// `vm:`: the group that may share the region file with its owner.
    pub(crate) vm_region_gid: Option<u32>,
    /// `auto:` with TLS: the `vm:` region is private to the two ends.
    pub(crate) vm_region_private: bool,
    /// `shm:` between two ends in one process takes the in-process path.
    pub(crate) in_process: bool,
    /// `shm:` listeners and connecting processes make the next connection's segment ahead.
    pub(crate) prepare_ahead: bool,
    /// `auto:` without TLS: resumption tickets, issued and used.
    pub(crate) auto_resume: bool,
    /// What a framed listener serves or a framed client expects (set by pub/sub only).
    pub(crate) role: Role,
}

/// What a framed endpoint is, announced in its hello so that a point-to-point peer and a
/// publish/subscribe peer that meet refuse each other with a clear error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Role {
    /// A [`Connection`](crate::Connection) or [`Listener`](crate::Listener).
    #[default]
    Connection = 0,
    /// A publish/subscribe topic: a [`Publisher`](crate::Publisher) or
    /// [`Subscriber`](crate::Subscriber).
    Topic = 1,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ring_size: 256 << 10,
            copy_ahead: false,
            max_msg_size: 64 << 20,
            wait: WaitPolicy::default(),
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(2),
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            dir_mode: 0o700,
            expect_uids: Vec::new(),
            shared_dir: false,
            tls: TlsOptions::default(),
            vm_region_gid: None,
            vm_region_private: false,
            in_process: true,
            prepare_ahead: true,
            auto_resume: true,
            role: Role::Connection,
        }
    }
}

impl Options {
    /// Bytes per ring and direction for `shm:` (a power of two, 4 KiB ..= 1 GiB). On a
    /// listener this is the largest ring a client may ask for. Default 256 KiB: a
    /// connection holds two rings and a header page each, 520 KiB of shared memory.
    /// A message of up to half the ring less 16 bytes is one record (read in place by
    /// `recv_ref`); a larger one goes in fragments of a quarter ring (at most 128 KiB),
    /// which the receiver copies out while the sender writes the next. For messages
    /// over 64 KiB see [`large_messages`](Self::large_messages).
    pub fn ring_size(mut self, bytes: usize) -> Self {
        self.ring_size = bytes;
        self.copy_ahead = false;
        self
    }

    /// Largest message this side sends or accepts (≤ 1 GiB). Larger messages are refused
    /// with [`ErrorKind::MessageTooLarge`]. Independent of the ring size: messages larger
    /// than a ring are fragmented.
    pub fn max_msg_size(mut self, bytes: usize) -> Self {
        self.max_msg_size = bytes;
        self
    }

    /// Sizes `shm:` for messages of up to `bytes` each, read and written in place: the
    /// ring becomes the smallest power of two that holds two such messages (its largest
    /// record, half the ring, holds one whole) and 16 of them or 1 MiB, whichever is
    /// less (never smaller than it was, at most [`MAX_RING_SIZE`]), and
    /// [`max_msg_size`](Self::max_msg_size) is raised to `bytes` if it was lower.
    ///
    /// What it buys: `reserve`/`commit` and `recv_ref` of such a message work in the ring
    /// with no copy (with the default ring a message over 128 KiB is split: `reserve`
    /// stages it and `recv_ref` reassembles it, a copy each), with many messages in
    /// flight (64 KiB: 16). The copying `send` and `recv` are faster on it too: a `send`
    /// to a receiver that waits goes in fragments it copies out while the sender writes
    /// the next, one to a receiver that is behind goes whole. On a ring this sized, a
    /// copying `send` of 64 KiB or more keeps at most half the level-2 cache or four
    /// messages' room of the ring in use (three 64 KiB messages in flight with a 512 KiB
    /// L2), so that its copies are still in the caches when the receiver copies them out;
    /// a ring set with [`ring_size`](Self::ring_size) (after this call, or larger than
    /// this would make) is a buffer, and `send` fills it. Measured against iceoryx2 on
    /// one machine (docs/benchmarks.md, "Placement"): the copying round trip 1.2×, 1.5×
    /// and 1.9× faster at 64 KiB, 1 MiB and 4 MiB, zero-copy throughput 1.2× (64 KiB) to
    /// 4.7× (1 MiB), copying throughput 0.7–1.0×.
    ///
    /// What it costs: shared memory of two rings per connection, one per direction,
    /// mapped by both processes (pages are allocated as the rings are first written):
    /// 512 KiB rings for 16 KiB messages, 1 MiB from about 32 KiB to 256 KiB, then about
    /// 4 × `bytes` (1 MiB messages: 4 MiB rings, 8 MiB per connection; 16 MiB messages:
    /// 64 MiB rings, 128 MiB per connection). Set it on both ends: a listener's ring size
    /// caps the rings its clients get.
    ///
    /// ```
    /// use shmlink::Options;
    /// assert_eq!(Options::default().large_messages(1 << 20).configured_ring_size(), 4 << 20);
    /// assert_eq!(Options::default().large_messages(64 << 10).configured_ring_size(), 1 << 20);
    /// assert_eq!(Options::default().large_messages(16 << 10).configured_ring_size(), 512 << 10);
    /// assert_eq!(Options::default().large_messages(4 << 10).configured_ring_size(), 256 << 10);
    /// let opts = Options::default().large_messages(1 << 20);
    /// assert_eq!(opts.configured_max_msg_size(), 64 << 20); // the default, already larger
    /// ```
    pub fn large_messages(mut self, bytes: usize) -> Self {
        let record = bytes.saturating_add(LARGE_RECORD_OVERHEAD);
        let ring = record
            .saturating_mul(2)
            .max(record.saturating_mul(16).min(1 << 20))
            .min(MAX_RING_SIZE)
            .next_power_of_two();
        if ring > self.ring_size {
            // Sized here for work in place, not by the user as a buffer.
            self.copy_ahead = true;
        }
        self.ring_size = self.ring_size.max(ring).min(MAX_RING_SIZE);
        self.max_msg_size = self.max_msg_size.max(bytes);
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

    /// How long a listener waits for a client's hello (and, on `shm:`, its segment after
    /// the answer; on `tls:`, its TLS handshake) before dropping it.
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
    /// (default `0o700`: only this user can reach the sockets in it; `0o711` lets other
    /// users reach sockets they know the name of). An existing directory keeps its mode.
    /// A mode that lets other users write the directory needs
    /// [`shared_rendezvous_dir`](Options::shared_rendezvous_dir).
    pub fn rendezvous_dir_mode(mut self, mode: u32) -> Self {
        self.dir_mode = mode;
        self
    }

    /// Client (connection or subscriber): user ids trusted to serve it besides its own
    /// uid and root (the default trusts only those two). The listener's or publisher's
    /// uid is checked with `SO_PEERCRED` on the rendezvous socket of `shm:` and `ux:`
    /// addresses before anything is sent; another uid gets
    /// [`ErrorKind::PermissionDenied`] naming both.
    /// This is what stops another local user who bound an abstract name (`shm:@name`)
    /// or a socket in a shared directory first. The same uids may own the rendezvous
    /// directory. On `vm:` they may also own the region file and serve its doorbell
    /// (`REGION.bell`, checked with `SO_PEERCRED` too). (`auto:`'s upgrade needs no uid:
    /// the listener proves it is the one reached over TCP.)
    pub fn expect_uids(mut self, uids: impl IntoIterator<Item = u32>) -> Self {
        self.expect_uids = uids.into_iter().collect();
        self
    }

    /// Both sides: the rendezvous directory of `shm:NAME` is shared on purpose (a
    /// volume mounted into containers that run as different uids, say), so accept it
    /// whoever owns it and whoever may write it. By default (`false`) binding and
    /// connecting refuse a directory that is owned by an untrusted uid or writable by
    /// group or others, because whoever can write it can replace the sockets in it.
    /// Either way a symbolic link is refused, and clients still check the server's uid
    /// ([`expect_uids`](Options::expect_uids)) and listeners the client's.
    pub fn shared_rendezvous_dir(mut self, shared: bool) -> Self {
        self.shared_dir = shared;
        self
    }

    /// Both sides: whether a `shm:` connection whose listener lives in this same process
    /// skips the kernel (default `true`). On, [`Listener::bind`](crate::Listener::bind)
    /// enters the listener in a process-wide table and a client in the same process that
    /// also says so gets an in-process ring with thread park/unpark: no memfd, no socket,
    /// no system call per message while both ends are awake; same API and semantics
    /// (boundaries, order, flow control within the smaller ring size, non-blocking mode,
    /// a pollable fd, end of stream or reset when the other end goes). Either side
    /// saying `false` keeps that side's connections on the kernel path (shared memory
    /// between two mappings, doorbells on the rendezvous socket), as between processes:
    /// what a test of that path, or a program that hands the connection's descriptors
    /// to another process, wants. See docs/design.md, "In-process connections".
    pub fn in_process(mut self, on: bool) -> Self {
        self.in_process = on;
        self
    }

    /// Whether [`in_process`](Self::in_process) is on.
    pub fn configured_in_process(&self) -> bool {
        self.in_process
    }

    /// `shm:`: whether the next connection's shared memory is made ahead of time (default
    /// `true`): a listener keeps one segment ready for its next client, and a process that
    /// connects keeps one for its next connect (made while the listener answers). Each
    /// holds a descriptor and its memory (a header page and one ring) between
    /// connections. A program that closes descriptors it did not open (a daemon's
    /// start-up, the preload library's host programs) turns this off: the segment is then
    /// made during the handshake, which costs connection setup time only. Off, a `shm:`
    /// connection also keeps no descriptor beside its socket: it does not negotiate
    /// doorbell pipes (blocking waits then sleep on the socket, a little slower per
    /// wake-up; docs/design.md §4.4).
    pub fn prepare_ahead(mut self, on: bool) -> Self {
        self.prepare_ahead = on;
        self
    }

    /// `auto:` without TLS settings: whether a connection to a listener this process
    /// reached before skips TCP (default `true`). Each `auto:` connection upgraded to
    /// shared memory brings a single-use resumption ticket from its listener; the next
    /// connect to the same address presents it at the listener's upgrade socket
    /// directly (no TCP connection, no negotiation) and gets the next ticket with its
    /// answer. A ticket the listener no longer knows (it restarted, the ticket expired
    /// after ten minutes or was pushed out by newer ones) costs one refused attempt, and
    /// the connect negotiates over TCP as the first one did. On a listener, `false`
    /// issues no tickets. With TLS settings an `auto:` end neither issues nor uses
    /// tickets: every connection runs the TLS handshake and its certificate checks.
    /// docs/design.md §5.3.
    pub fn auto_resume(mut self, on: bool) -> Self {
        self.auto_resume = on;
        self
    }

    /// `vm:` on the host: the group that may read and write the region file besides its
    /// owner (docs/vms.md, "Who can read a region"). By default a region file must be a
    /// regular file (not a symbolic link) owned by this uid, root or an
    /// [`expect_uids`](Self::expect_uids) uid, with no permission for group or others
    /// (mode `0600`): whoever can read it reads every message that passes through it, and
    /// whoever can write it can forge them. With a group named here, a file of that group
    /// may also be group-readable and -writable (`0660`: a QEMU running as another user
    /// of the group); others never. Anything else is refused with the owner, mode or type
    /// that made it so.
    pub fn vm_region_group(mut self, gid: u32) -> Self {
        self.vm_region_gid = Some(gid);
        self
    }

    /// `auto:` with TLS settings: whether the `vm:` region named by `$SHMLINK_AUTO_VM` is
    /// private to the two ends, so that a TLS connection may leave TLS for it (default
    /// `false`; `$SHMLINK_AUTO_VM_PRIVATE=1` says the same for the process).
    ///
    /// A `vm:` region carries messages in plaintext, and every guest whose QEMU maps it
    /// and every host process that can open its file can read and write all of it. So
    /// an `auto:` connection that was asked for TLS (TLS options on either end) moves to
    /// `vm:` only when this says that nobody but the two ends can reach the region: no
    /// third guest maps it, and its host file is readable by nobody else (the host's
    /// business: docs/vms.md). Otherwise it stays on TLS. (`auto:`'s same-kernel move to
    /// `shm:` is not affected: its memory is two sealed memfds only the two processes
    /// hold, with the peers' uids checked.)
    pub fn vm_region_private(mut self, private: bool) -> Self {
        self.vm_region_private = private;
        self
    }

    /// The group [`vm_region_group`](Self::vm_region_group) set, if any.
    pub fn configured_vm_region_group(&self) -> Option<u32> {
        self.vm_region_gid
    }

    /// Whether [`vm_region_private`](Self::vm_region_private) is on.
    pub fn configured_vm_region_private(&self) -> bool {
        self.vm_region_private
    }

    /// TLS settings, for `tls:` addresses.
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self
    }

    /// The TLS settings [`tls`](Self::tls) set.
    pub fn configured_tls(&self) -> &TlsOptions {
        &self.tls
    }

    /// The ring size [`ring_size`](Self::ring_size) set (or the default).
    pub fn configured_ring_size(&self) -> usize {
        self.ring_size
    }

    /// The maximum message size [`max_msg_size`](Self::max_msg_size) set (or the
    /// default). A connection's real limit also depends on the peer:
    /// [`Connection::max_msg_size`](crate::Connection::max_msg_size).
    pub fn configured_max_msg_size(&self) -> usize {
        self.max_msg_size
    }

    /// The wait policy [`wait_policy`](Self::wait_policy) set (or the default).
    pub fn configured_wait_policy(&self) -> WaitPolicy {
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
        if self.dir_mode & 0o022 != 0 && !self.shared_dir {
            return bad(format!(
                "option rendezvous_dir_mode = {:#o} lets other users write the directory; \
                 declare it with shared_rendezvous_dir(true) if that is the intent",
                self.dir_mode
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
        self.tls.validate()
    }
}

/// Most subscribers a topic serves at once ([`PubSubOptions`](crate::PubSubOptions)).
pub use crate::pubsub::MAX_SUBSCRIBERS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_ring_large_messages_sized_bounds_copying_sends() {
        let d = Options::default;
        assert!(d().large_messages(64 << 10).copy_ahead);
        assert!(!d().large_messages(4 << 10).copy_ahead, "the default ring");
        assert!(!d().large_messages(64 << 10).ring_size(1 << 20).copy_ahead);
        // The user's ring was larger: it stays, and so does its use as a buffer.
        let big = d().ring_size(8 << 20).large_messages(64 << 10);
        assert_eq!((big.ring_size, big.copy_ahead), (8 << 20, false));
        assert!(d().ring_size(8 << 20).large_messages(4 << 20).copy_ahead);
    }

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
            (
                Options::default().tls(TlsOptions::new().cert(Pem::text("x"))),
                "tls.key",
            ),
            (
                Options::default().tls(TlsOptions::new().key(Pem::file("k.pem"))),
                "tls.cert",
            ),
            (
                Options::default().tls(TlsOptions::new().server_name("")),
                "tls.server_name",
            ),
        ] {
            let e = opts.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.to_string().contains(name), "{e}");
        }
        Options::default().validate().unwrap();
    }

    #[test]
    fn pem_text_is_never_shown() {
        let secret = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n";
        let opts = Options::default().tls(TlsOptions::new().key(Pem::text(secret)));
        let shown = format!("{opts:?}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        assert!(
            shown.contains(&format!("<{} bytes>", secret.len())),
            "{shown}"
        );
    }
}
