//! Helpers shared by the integration tests: unique addresses per transport, options that
//! carry the test certificates for `tls:`, connected pairs, self-verifying payloads, and
//! whether a thread sleeps in the kernel (parked, or blocked).
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener, Options, Pem, TlsOptions};

#[path = "../../src/transport/tls/test_pki.rs"]
pub mod test_pki;
pub use test_pki::pki;

/// The transports every conformance test runs on: `auto` is `auto:` upgraded to shared
/// memory, `auto_tcp` is `auto:` whose upgrade socket is gone, so it stays on TCP, and
/// `auto_tls` the same with TLS options, so it stays on TLS. `inproc` is `shm:` with
/// both ends in this process and `Options::in_process` on (the in-process ring).
pub const TRANSPORTS: &[&str] = &[
    "shm", "ux", "tcp", "tls", "auto", "auto_tcp", "auto_tls", "inproc",
];

/// The path a connection of test transport `t` takes (what `Connection::transport` says).
pub fn path_of(t: &str) -> &str {
    match t {
        "ux_path" => "ux",
        "auto" | "inproc" => "shm",
        "auto_tcp" => "tcp",
        "auto_tls" => "tls",
        t => t,
    }
}

/// TLS options for both ends of a test connection: the listener's certificate (for
/// localhost and 127.0.0.1) and key, and the test CA, which makes a listener require
/// client certificates (mutual TLS) — the same certificate serves the client.
pub fn test_tls() -> TlsOptions {
    let pki = pki();
    TlsOptions::new()
        .cert(Pem::text(&pki.server.cert))
        .key(Pem::text(&pki.server.key))
        .ca(Pem::text(&pki.ca))
}

/// Default options for `transport`: with [`test_tls`] on `tls`; `shm` keeps both ends
/// on the kernel path ([`Options::in_process`] off: in-process is the default between
/// two ends of one process), `inproc` takes the in-process one.
pub fn opts(transport: &str) -> Options {
    match transport {
        "tls" | "auto_tls" => Options::default().tls(test_tls()),
        "inproc" => Options::default().in_process(true),
        _ => kernel_opts(),
    }
}

/// Default options, but `shm:` between two ends of this process goes through the kernel
/// (memfds, the rendezvous socket) as between processes: what the tests of that path use.
pub fn kernel_opts() -> Options {
    Options::default().in_process(false)
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh address for `transport`, unique within this test process.
pub fn fresh_addr(transport: &str) -> String {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    match transport {
        "shm" | "inproc" => {
            let dir = test_dir();
            format!("shm:{}/t{n}.sock", dir.display())
        }
        "ux" => format!("ux:shmlink-test-{pid}-{n}"),
        // `ux:` at a socket file instead of an abstract name (conformance suite only).
        "ux_path" => format!("ux:{}/u{n}.sock", test_dir().display()),
        "tcp" => "tcp:127.0.0.1:0".to_string(),
        "auto" | "auto_tcp" | "auto_tls" => "auto:127.0.0.1:0".to_string(),
        "tls" => "tls:127.0.0.1:0".to_string(),
        // `vm:` in a region file of its own (16 MiB: 64 KiB rings, owner-only as the
        // library requires), in the test directory, removed when the test process exits.
        "vm" => {
            let region = test_dir().join(format!("v{n}.region"));
            create_region_file(&region).set_len(16 << 20).unwrap();
            remove_at_exit(region.clone());
            format!("vm:t{n}@{}", region.display())
        }
        other => panic!("unknown transport {other}"),
    }
}

/// Creates (or empties) a `vm:` region file as `shmlink vm-host` does: owner-only (mode
/// 0600), or the library refuses to map it.
pub fn create_region_file(p: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)
        .unwrap()
}

/// Files removed when the test process exits (`vm:` regions: both ends of a test's
/// connections open them by name, so they live until the tests are done).
static AT_EXIT: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

fn remove_at_exit(path: std::path::PathBuf) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    extern "C" fn remove_all() {
        if let Ok(list) = AT_EXIT.lock() {
            for p in list.iter() {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    // SAFETY: registers a plain function with no arguments; it only removes files.
    REGISTER.call_once(|| unsafe {
        libc::atexit(remove_all);
    });
    AT_EXIT.lock().unwrap().push(path);
}

/// A per-process directory for socket files.
pub fn test_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shmlink-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Binds a fresh address; returns the listener and the address clients connect to.
pub fn bind(transport: &str, opts: &Options) -> (Listener, String) {
    let l = Listener::bind(&fresh_addr(transport), opts).unwrap();
    let addr = l.local_addr();
    if transport == "auto_tcp" || transport == "auto_tls" {
        remove_upgrade_socket(&addr);
    }
    (l, addr)
}

/// Removes the upgrade socket of the `auto:` listener at `addr` (`auto-PORT-*.sock` in
/// the rendezvous directory), so its clients stay on TCP.
pub fn remove_upgrade_socket(addr: &str) {
    let port = addr.rsplit(':').next().unwrap();
    let prefix = format!("auto-{port}-");
    let mut removed = 0;
    for entry in std::fs::read_dir(shmlink::rendezvous_dir()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_file(entry.path()).unwrap();
            removed += 1;
        }
    }
    assert_eq!(removed, 1, "upgrade socket of {addr}");
}

/// A connected (client, server) pair.
pub fn pair_with(transport: &str, opts: &Options) -> (Connection, Connection) {
    let (mut l, addr) = bind(transport, opts);
    let o = opts.clone();
    let client = std::thread::spawn(move || Connection::connect(&addr, &o).unwrap());
    let server = l.accept().unwrap();
    (client.join().unwrap(), server)
}

/// A connected pair with default options ([`opts`]).
pub fn pair(transport: &str) -> (Connection, Connection) {
    pair_with(transport, &opts(transport))
}

/// FNV-1a over the bytes.
pub fn checksum(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// A message of `len` bytes carrying `seq`: bytes derived from seq, then (if there is
/// room) seq (8 bytes) and a checksum of the body (4 bytes) at the front.
pub fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (seq as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect();
    if len >= 12 {
        let sum = checksum(&v[12..]);
        v[..8].copy_from_slice(&seq.to_le_bytes());
        v[8..12].copy_from_slice(&sum.to_le_bytes());
    }
    v
}

/// Checks that `msg` is `payload(seq, len)` for the expected seq and length.
pub fn verify(seq: u64, len: usize, msg: &[u8]) {
    assert_eq!(msg.len(), len, "message {seq}: wrong length");
    if len >= 12 {
        let got = u64::from_le_bytes(msg[..8].try_into().unwrap());
        assert_eq!(got, seq, "out of order or lost message");
        let sum = u32::from_le_bytes(msg[8..12].try_into().unwrap());
        assert_eq!(
            sum,
            checksum(&msg[12..]),
            "message {seq}: checksum mismatch"
        );
    } else {
        assert_eq!(msg, &payload(seq, len)[..], "message {seq}: corrupted");
    }
}

/// Waits until `cond` holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

/// The calling thread's id, to find it in `/proc/self/task`.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// System calls a parked connection sleeps in: polls and socket reads or writes, and the
/// futex an in-process connection parks its thread on.
pub const IO_WAITS: &[libc::c_long] = &[
    libc::SYS_futex,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_pwait,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_select,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_epoll_wait,
];

/// Whether thread `tid` of this process sleeps in the kernel waiting for I/O: state `S`
/// (a spinning or yielding thread is `R`) inside one of [`IO_WAITS`] (not, say, a lock).
/// How a test sees that a connection parked, or that a sender blocked.
pub fn sleeps_waiting_for_io(tid: libc::pid_t) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return false;
    };
    // The command name in parentheses may hold anything; the state follows the last ')'.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    if !state.is_some_and(|s| s.starts_with('S')) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) {
        Ok(s) => s
            .split_whitespace()
            .next()
            .and_then(|nr| nr.parse::<libc::c_long>().ok())
            .is_some_and(|nr| IO_WAITS.contains(&nr)),
        // A kernel without /proc/PID/syscall: the state alone has to do.
        Err(_) => true,
    }
}

/// Receives until end of stream; panics on any other error.
pub fn expect_eos(conn: &mut Connection) {
    let e = conn.recv_vec().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
}

/// This test binary, to run only its ignored test `test` (a child role the tests start;
/// ignored so that it does not count as a test of its own).
pub fn rerun_ignored(test: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd
}

/// This test binary's ignored test `child`, re-run as `uid`/`gid` with `env` (how the
/// access tests play another user; dropping privileges from root, std also clears the
/// supplementary groups).
pub fn child_as(uid: u32, gid: u32, env: &[(&str, &str)]) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = rerun_ignored("child");
    cmd.envs(env.iter().copied()).uid(uid).gid(gid);
    cmd
}

/// What a [`child_as`] run printed after `RESULT `.
pub fn child_result(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "child printed no result: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Whether `fd` becomes readable within `ms` milliseconds (0: is readable now).
pub fn readable_within(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// A fresh `vm:` region path in /dev/shm (nothing created) and its doorbell socket
/// (`REGION.bell`), both removed on drop; `tag` names the test binary in the path.
pub struct VmPaths {
    pub region: std::path::PathBuf,
    pub bell: std::path::PathBuf,
}

impl VmPaths {
    pub fn new(tag: &str) -> VmPaths {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let region =
            std::path::PathBuf::from(format!("/dev/shm/shmlink-{tag}-{}-{n}", std::process::id()));
        let bell = std::path::PathBuf::from(format!("{}.bell", region.display()));
        let _ = std::fs::remove_file(&region);
        let _ = std::fs::remove_file(&bell);
        VmPaths { region, bell }
    }

    /// The `vm:` address of `name` in this region.
    pub fn addr(&self, name: &str) -> String {
        format!("vm:{name}@{}", self.region.display())
    }

    /// A connected pair in this region: (client, server, listener).
    pub fn pair(&self, name: &str) -> (Connection, Connection, Listener) {
        let mut l = Listener::bind(&self.addr(name), &Options::default()).unwrap();
        let addr = self.addr(name);
        let t =
            std::thread::spawn(move || Connection::connect(&addr, &Options::default()).unwrap());
        let s = l.accept().unwrap();
        (t.join().unwrap(), s, l)
    }
}

impl Drop for VmPaths {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.region);
        let _ = std::fs::remove_file(&self.bell);
    }
}

/// A child process (a role of this test binary) and the lines it prints. Dropping it
/// closes its stdin (the roles run until then) and reaps it, killing it after 10 s.
pub struct ChildProc {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ChildProc {
    /// Spawns `cmd` with its stdin and stdout piped.
    pub fn start(mut cmd: std::process::Command) -> ChildProc {
        use std::io::BufRead;
        use std::process::Stdio;
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildProc { child, lines }
    }

    /// The rest of the first line holding `prefix`, waiting at most 30 s.
    pub fn line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the child never printed {prefix:?}"));
            // libtest may print "test child ... " before the child's first line.
            if let Some((_, rest)) = line.split_once(prefix) {
                return rest.trim().to_string();
            }
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `body` on a thread of its own named `name`, one such body at a time in this test
/// binary (`serial` is the binary's lock), and fails if it has no result within
/// `deadline`; a panic of the body is the test's.
pub fn serially_within(
    serial: &std::sync::Mutex<()>,
    name: &str,
    deadline: Duration,
    body: impl FnOnce() + Send + 'static,
) {
    use std::sync::mpsc;
    let _serial = serial.lock().unwrap_or_else(|p| p.into_inner());
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let worker = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            body();
            let _ = done_tx.send(());
        })
        .unwrap();
    match done_rx.recv_timeout(deadline) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name}: hung, no result within {deadline:?}")
        }
    }
}

/// Sends one ivshmem doorbell protocol message with an optional descriptor, as a server
/// (or a hostile client) does, waiting for room.
pub fn send_ivshmem_msg(
    sock: &std::os::unix::net::UnixStream,
    v: i64,
    fd: Option<&std::os::fd::OwnedFd>,
) -> bool {
    use std::os::fd::AsRawFd;
    let bytes = v.to_le_bytes();
    // SAFETY: a plain blocking sendmsg of 8 bytes with at most one SCM_RIGHTS descriptor,
    // the control message built with the libc macros inside a large enough, aligned
    // buffer.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut _,
            iov_len: 8,
        };
        let mut cbuf = [0u64; 4];
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        if let Some(fd) = fd {
            m.msg_control = cbuf.as_mut_ptr().cast();
            m.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let cm = libc::CMSG_FIRSTHDR(&m);
            (*cm).cmsg_level = libc::SOL_SOCKET;
            (*cm).cmsg_type = libc::SCM_RIGHTS;
            (*cm).cmsg_len = libc::CMSG_LEN(4) as usize;
            *libc::CMSG_DATA(cm).cast::<i32>() = fd.as_raw_fd();
        }
        libc::sendmsg(sock.as_raw_fd(), &m, libc::MSG_NOSIGNAL) == 8
    }
}

/// Echoes every message of an async connection back until the peer's end of stream.
pub async fn echo_until_end(mut s: shmlink::tokio::Connection) {
    loop {
        match s.recv_vec().await {
            Ok(m) => s.send(&m).await.unwrap(),
            Err(e) if e.kind() == ErrorKind::EndOfStream => break,
            Err(e) => panic!("server: {e}"),
        }
    }
}
