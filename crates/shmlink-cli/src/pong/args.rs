//! `shmlink pong`'s arguments once parsed, with defaults applied: what the pong run needs,
//! whatever parses the command line.

use shmlink_measure::verify::Sampling;
use shmlink_measure::Mode;

/// Which ends of the pong this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Client here, server as a child process.
    Both,
    Server,
    Client,
}

/// Where the two ends run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinning {
    /// No pinning.
    Off,
    /// The default: the first two CPUs this process may use; a failure to pin is only a
    /// warning.
    Auto { client: usize, server: usize },
    /// Given with `--cpus`; a failure to pin is an error.
    Cpus { client: usize, server: usize },
}

impl Pinning {
    /// The `--cpus` argument that gives a server process this pinning.
    pub fn to_arg(self) -> String {
        match self {
            Pinning::Off => "none".into(),
            Pinning::Auto { client, server } | Pinning::Cpus { client, server } => {
                format!("{client},{server}")
            }
        }
    }

    /// The CPU of the client or of the server end, if pinned.
    pub fn cpu(self, server: bool) -> Option<usize> {
        match self {
            Pinning::Off => None,
            Pinning::Auto { client, server: s } | Pinning::Cpus { client, server: s } => {
                Some(if server { s } else { client })
            }
        }
    }
}

/// `shmlink pong`'s arguments, with defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PongArgs {
    pub role: Role,
    pub mode: Mode,
    /// Bytes per message.
    pub size: usize,
    /// Measured messages.
    pub count: u64,
    /// Messages in flight (1 in latency mode).
    pub window: u64,
    /// Which measured messages are checksummed in full (`--verify`).
    pub verify: Sampling,
    /// `--zero-copy`: messages written and read in place.
    pub zero_copy: bool,
    pub pinning: Pinning,
    pub json: bool,
    pub ring_size: Option<usize>,
    pub spin_us: Option<u64>,
    /// `--shared-dir`: the rendezvous directory is shared on purpose.
    pub shared_dir: bool,
    /// `--allow-uid`, `--allow-gid`, `--expect-uid`: other users admitted or trusted.
    pub users: crate::args::UserFlags,
    /// `tls:` PEM files: this end's certificate chain and key, the CA it trusts.
    pub cert: Option<String>,
    pub key: Option<String>,
    pub ca: Option<String>,
    /// Addresses, in order; never empty (without ADDR, both ends run on
    /// [`default_addrs`]; a server has exactly one).
    pub addrs: Vec<String>,
    /// `--client`: how long to wait for each server to listen (`--wait`, `--no-wait`).
    pub wait: std::time::Duration,
    /// Internal (`--once`): serve one client, print the bound address on stdout first.
    pub once: bool,
    /// Internal (`--parent-pid`): die with this process.
    pub parent_pid: Option<u32>,
}

impl PongArgs {
    /// Messages sent before the measured ones.
    pub fn warmup(&self) -> u64 {
        (self.count / 10).min(1000)
    }

    /// The options both ends use for their connections.
    pub fn options(&self) -> shmlink::Options {
        let mut opts = crate::args::conn_options(
            self.shared_dir,
            self.cert.as_deref(),
            self.key.as_deref(),
            self.ca.as_deref(),
        );
        opts = self.users.apply(opts);
        if let Some(ring) = self.ring_size {
            opts = opts.ring_size(ring);
        }
        if let Some(us) = self.spin_us {
            let d = std::time::Duration::from_micros(us);
            opts = opts.wait_policy(shmlink::WaitPolicy { spin: d, yield_: d });
        }
        opts
    }
}

/// The default measured count for `mode` and `size`: seconds, not minutes, per run.
pub fn default_count(mode: Mode, size: usize) -> u64 {
    let size = size.max(1) as u64;
    match mode {
        Mode::Latency => ((1u64 << 30) / size).clamp(50, 20_000),
        Mode::Throughput => ((4u64 << 30) / size).clamp(100, 500_000),
    }
}

/// The default addresses: every transport, named after this process.
pub fn default_addrs() -> Vec<String> {
    let pid = std::process::id();
    vec![
        format!("shm:pong-{pid}"),
        format!("ux:pong-{pid}"),
        "tcp:127.0.0.1:0".to_string(),
    ]
}
