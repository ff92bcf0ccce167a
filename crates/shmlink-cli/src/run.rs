//! `shmlink run [OPTIONS] -- CMD ARGS…`: runs an unmodified TCP program in transparent
//! mode, with `libshmlink_preload.so` preloaded (see docs/transparent.md);
//! `shmlink run --print-path` prints where that library is.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
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
                  over the kernel as before. See docs/transparent.md.\n\n\
                  The library is looked for in $SHMLINK_PRELOAD_LIB, then next to this \
                  program, in ../lib/shmlink/ and ../lib/ of its installed tree \
                  (scripts/install.sh), then in the cargo target directory it was built in.",
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

/// Where `cargo build` put this program (see build.rs): the last place searched, for a
/// `shmlink` installed with `cargo install --path crates/shmlink-cli`.
const BUILD_PROFILE_DIR: Option<&str> = option_env!("SHMLINK_BUILD_PROFILE_DIR");

/// The places searched for the preload library, in order, when `$SHMLINK_PRELOAD_LIB` is
/// not set: next to this program (`target/release`, where cargo builds both), the
/// installed tree's `../lib/shmlink/` (scripts/install.sh) and `../lib/`, then the cargo
/// profile directory this program was built in.
fn candidates(exe_dir: Option<&Path>, build_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = exe_dir {
        out.push(dir.join(PRELOAD_LIB));
        out.push(dir.join("../lib/shmlink").join(PRELOAD_LIB));
        out.push(dir.join("../lib").join(PRELOAD_LIB));
    }
    if let Some(dir) = build_dir {
        let p = dir.join(PRELOAD_LIB);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Where the preload library is: `$SHMLINK_PRELOAD_LIB` if set (it must then exist),
/// else the first of [`candidates`] that is a file. `Err` is the message for the user,
/// naming every place searched and how to get the library.
fn library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("SHMLINK_PRELOAD_LIB").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "SHMLINK_PRELOAD_LIB={} is not a file; unset it to search the usual places",
                p.display()
            ))
        };
    }
    // /proc/self/exe: symbolic links already resolved, so a link in PATH to an installed
    // tree finds that tree's library.
    let exe = std::env::current_exe().ok();
    let list = candidates(
        exe.as_deref().and_then(Path::parent),
        BUILD_PROFILE_DIR.map(Path::new),
    );
    if let Some(p) = list.iter().find(|p| p.is_file()) {
        return Ok(p.canonicalize().unwrap_or_else(|_| p.clone()));
    }
    let searched: Vec<String> = list.iter().map(|p| format!("  {}", p.display())).collect();
    Err(format!(
        "{PRELOAD_LIB} not found; searched $SHMLINK_PRELOAD_LIB (unset) and\n{}\n\
         Install it with the rest of shmlink: scripts/install.sh PREFIX (from the source \
         tree; puts it in PREFIX/lib/shmlink/), or build it with \
         `cargo build --release -p shmlink-preload` and set SHMLINK_PRELOAD_LIB to \
         target/release/{PRELOAD_LIB}",
        searched.join("\n")
    ))
}

/// Runs `shmlink run`.
pub fn run(args: &RunCli) -> ExitCode {
    let lib = match library() {
        Ok(lib) => lib,
        Err(msg) => {
            eprintln!("shmlink run: {msg}");
            return ExitCode::from(1);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_order_is_next_to_the_program_then_the_installed_tree_then_the_build() {
        let list = candidates(
            Some(Path::new("/opt/sl/bin")),
            Some(Path::new("/src/target/release")),
        );
        let want: Vec<PathBuf> = [
            "/opt/sl/bin/libshmlink_preload.so",
            "/opt/sl/bin/../lib/shmlink/libshmlink_preload.so",
            "/opt/sl/bin/../lib/libshmlink_preload.so",
            "/src/target/release/libshmlink_preload.so",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(list, want);
        // Built and run in the same target directory: searched once.
        let same = candidates(Some(Path::new("/t/debug")), Some(Path::new("/t/debug")));
        assert_eq!(same.len(), 3);
    }
}
