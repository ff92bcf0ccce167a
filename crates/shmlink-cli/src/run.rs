//! `shmlink run [OPTIONS] -- CMD ARGS…`: runs an unmodified TCP program in transparent
//! mode, with `libshmlink_preload.so` preloaded (see docs/transparent.md);
//! `shmlink run --print-path` prints where that library is.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use clap::Args;

/// The preload library's file name.
pub const PRELOAD_LIB: &str = "libshmlink_preload.so";

/// `shmlink run`.
#[derive(Args, Debug)]
#[command(
    about = "Run an unmodified TCP program with its local connections on shared memory",
    long_about = "Run CMD with libshmlink_preload.so preloaded: its TCP connections to other \
                  preloaded programs on this kernel go over shared memory, everything else \
                  over the kernel as before. See docs/transparent.md.",
    after_help = "Examples:\n  shmlink run -- redis-server --port 6379\n  \
                  shmlink run -- redis-benchmark -t get\n  \
                  SHMLINK_DIR=/run/shmlink shmlink run --allow-uid 65534 -- SERVER   (admit nobody's clients)\n  \
                  SHMLINK_DIR=/run/shmlink shmlink run --expect-uid 65534 -- CLIENT  (trust a server running as nobody)\n  \
                  LD_PRELOAD=$(shmlink run --print-path) CMD   (the same by hand)"
)]
pub struct RunCli {
    /// Print the path of libshmlink_preload.so and exit.
    #[arg(long)]
    pub print_path: bool,
    /// Spin budget of a blocking wait before it sleeps, in microseconds (SHMLINK_SPIN_US).
    #[arg(long, value_name = "US")]
    pub spin_us: Option<u64>,
    /// Ring size per direction in bytes, a power of two (SHMLINK_RING_SIZE).
    #[arg(long, value_name = "BYTES")]
    pub ring_size: Option<usize>,
    /// Log each decision on stderr (SHMLINK_LOG=debug), refusals with their reason.
    #[arg(long, short = 'v')]
    pub debug: bool,
    /// Other users over shared memory: --allow-uid/--allow-gid on the server's side
    /// (SHMLINK_ALLOW_UIDS, SHMLINK_ALLOW_GIDS), --expect-uid on the client's
    /// (SHMLINK_EXPECT_UIDS). Both sides need the same rendezvous directory
    /// (SHMLINK_DIR); see docs/transparent.md, "Across users".
    #[command(flatten)]
    pub users: crate::args::UserFlags,
    /// The program and its arguments.
    #[arg(value_name = "CMD", trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub cmd: Vec<OsString>,
}

/// Where the preload library is: `$SHMLINK_PRELOAD_LIB`, next to this program (where
/// cargo builds both), or in `../lib` (an installed tree).
fn library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SHMLINK_PRELOAD_LIB").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(PRELOAD_LIB), dir.join("../lib").join(PRELOAD_LIB)]
        .into_iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or(p))
}

/// Runs `shmlink run`.
pub fn run(args: &RunCli) -> ExitCode {
    let Some(lib) = library() else {
        eprintln!(
            "shmlink run: {PRELOAD_LIB} not found (next to this program, in ../lib, or \
             $SHMLINK_PRELOAD_LIB); build it with `cargo build -p shmlink-preload`"
        );
        return ExitCode::from(1);
    };
    if args.print_path {
        println!("{}", lib.display());
        return ExitCode::SUCCESS;
    }
    let Some((program, rest)) = args.cmd.split_first() else {
        eprintln!("shmlink run: no command given (shmlink run [OPTIONS] -- CMD ARGS…)");
        return ExitCode::from(2);
    };
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(program);
    cmd.args(rest).env("LD_PRELOAD", preload);
    if let Some(us) = args.spin_us {
        cmd.env("SHMLINK_SPIN_US", us.to_string());
    }
    if let Some(n) = args.ring_size {
        cmd.env("SHMLINK_RING_SIZE", n.to_string());
    }
    if args.debug {
        cmd.env("SHMLINK_LOG", "debug");
    }
    let list = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    for (var, ids) in [
        ("SHMLINK_ALLOW_UIDS", &args.users.allow_uids),
        ("SHMLINK_ALLOW_GIDS", &args.users.allow_gids),
        ("SHMLINK_EXPECT_UIDS", &args.users.expect_uids),
    ] {
        if !ids.is_empty() {
            cmd.env(var, list(ids));
        }
    }
    let e = cmd.exec();
    eprintln!("shmlink run: {}: {e}", PathBuf::from(program).display());
    ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
