//! The C tests: programs written in C11 (tests/c/*.c and examples/*.c), compiled with
//! `-Wall -Wextra -Werror` under AddressSanitizer and UBSan against an *installed* copy
//! of the library (`scripts/capi.sh install target/capi/prefix --debug`, then
//! `pkg-config --cflags --libs shmlink`), each run as one test here. A program passes
//! when it exits 0; every one has a watchdog, and this harness kills it after a timeout.
//!
//! Without a C compiler or pkg-config the tests are reported as skipped
//! (`shmlink::testing::skip`, category `cc`), never as passed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn capi_dir() -> PathBuf {
    root().join("target/capi")
}

/// Installs the library once per test run; `Err` says why it cannot be done here.
fn prefix() -> Result<&'static Path, String> {
    static PREFIX: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PREFIX
        .get_or_init(|| {
            for tool in ["cc", "pkg-config"] {
                if Command::new(tool).arg("--version").output().is_err() {
                    return Err(format!("{tool} is not installed"));
                }
            }
            let prefix = capi_dir().join("prefix");
            let out = Command::new(root().join("scripts/capi.sh"))
                .arg("install")
                .arg(&prefix)
                .arg("--debug")
                .output()
                .expect("run scripts/capi.sh");
            assert!(out.status.success(), "scripts/capi.sh install failed: {}", text(&out));
            Ok(prefix)
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(Clone::clone)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `pkg-config ARGS shmlink` against the installed copy.
fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("shmlink")
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config");
    assert!(out.status.success(), "pkg-config {args:?} shmlink: {}", text(&out));
    String::from_utf8(out.stdout)
        .expect("pkg-config prints text")
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Compiles `source` (relative to the crate) into target/capi/bin; `None` when the
/// machine cannot (the test is then skipped).
fn compile(source: &str) -> Option<PathBuf> {
    let prefix = match prefix() {
        Ok(p) => p,
        Err(why) => {
            shmlink::testing::skip("cc", why);
            return None;
        }
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = crate_dir.join(source);
    let bin_dir = capi_dir().join("bin");
    std::fs::create_dir_all(&bin_dir).expect("create target/capi/bin");
    let name = Path::new(source).file_stem().unwrap().to_str().unwrap().to_owned();
    let bin = bin_dir.join(&name);
    let libdir = pkg_config(prefix, &["--variable=libdir"]).join("");
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .args(["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"])
        .arg("-fno-omit-frame-pointer")
        .args(pkg_config(prefix, &["--cflags"]))
        .arg("-I")
        .arg(crate_dir.join("tests/c"))
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .args(pkg_config(prefix, &["--libs"]))
        .arg(format!("-Wl,-rpath,{libdir}"))
        .output()
        .expect("run cc");
    assert!(out.status.success(), "compiling {source} failed:\n{}", text(&out));
    Some(bin)
}

/// A fresh rendezvous directory for one program.
fn shm_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shmlink-capi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Starts a compiled program with the sanitizers' settings.
fn spawn(bin: &Path, args: &[&str], dir: &Path) -> Child {
    Command::new(bin)
        .args(args)
        .env("SHMLINK_DIR", dir)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:exitcode=86")
        .env("LSAN_OPTIONS", format!("suppressions={}", lsan_supp().display()))
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the test program")
}

/// LeakSanitizer suppressions: allocations the Rust standard library keeps for the life
/// of the process (thread-local and global state), which LSan cannot tell from leaks.
fn lsan_supp() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/lsan.supp")
}

/// Waits for `child` at most `timeout`; kills it after that. Its output and status.
fn finish(mut child: Child, timeout: Duration, what: &str) -> Output {
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().expect("poll the test program").is_some() {
            return child.wait_with_output().expect("collect output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!("{what} did not finish within {timeout:?}:\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Compiles and runs one C test program; it must exit 0.
fn run_c(source: &str, args: &[&str], timeout: Duration) {
    let Some(bin) = compile(source) else { return };
    let dir = shm_dir(bin.file_name().unwrap().to_str().unwrap());
    let out = finish(spawn(&bin, args, &dir), timeout, source);
    let _ = std::fs::remove_dir_all(&dir);
    print!("{}", text(&out));
    assert!(out.status.success(), "{source} failed ({}):\n{}", out.status, text(&out));
}

#[test]
fn c_echo_over_shm_ux_tcp_with_zero_copy() {
    run_c("tests/c/echo.c", &[], Duration::from_secs(180));
}
