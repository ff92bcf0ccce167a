//! The C tests: programs written in C11 (tests/c/*.c and examples/*.c), compiled with
//! `-Wall -Wextra -Werror` under AddressSanitizer and UBSan against an *installed* copy
//! of the library (`scripts/capi.sh install target/capi/prefix --debug`, then
//! `pkg-config --cflags --libs shmlink`), each run as one test here. A program passes
//! when it exits 0; every one has a watchdog, and this harness kills it after a timeout.
//!
//! Without a C compiler or pkg-config the tests are reported as skipped
//! (`shmlink_testkit::skip`, category `cc`), never as passed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
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
            assert!(
                out.status.success(),
                "scripts/capi.sh install failed: {}",
                text(&out)
            );
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
    assert!(
        out.status.success(),
        "pkg-config {args:?} shmlink: {}",
        text(&out)
    );
    String::from_utf8(out.stdout)
        .expect("pkg-config prints text")
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Compiles `source` (relative to the crate) into target/capi/bin; `None` when the
/// machine cannot (the test is then skipped).
fn compile(source: &str) -> Option<PathBuf> {
    compile_as(source, false)
}

/// [`compile`], against the shared library (`static_lib` false: ASan and UBSan on) or
/// the static one (`pkg-config --static`, `libshmlink.a` named explicitly so the linker
/// cannot pick the `.so`; no sanitizers, as a plain static build).
fn compile_as(source: &str, static_lib: bool) -> Option<PathBuf> {
    // Tests run in parallel and some share a program: compile each once.
    static BUILT: Mutex<Vec<(String, bool, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, bin)) = built
        .iter()
        .find(|(s, st, _)| s == source && *st == static_lib)
    {
        return Some(bin.clone());
    }
    let bin = compile_now(source, static_lib)?;
    built.push((source.to_owned(), static_lib, bin.clone()));
    Some(bin)
}

fn compile_now(source: &str, static_lib: bool) -> Option<PathBuf> {
    let prefix = match prefix() {
        Ok(p) => p,
        Err(why) => {
            shmlink_testkit::skip("cc", why);
            return None;
        }
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = crate_dir.join(source);
    let bin_dir = capi_dir().join("bin");
    std::fs::create_dir_all(&bin_dir).expect("create target/capi/bin");
    let name = Path::new(source).file_stem().unwrap().to_string_lossy();
    let bin = bin_dir.join(if static_lib {
        format!("{name}-static")
    } else {
        name.into_owned()
    });
    let libdir = pkg_config(prefix, &["--variable=libdir"]).join("");
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .args(pkg_config(prefix, &["--cflags"]))
        .arg("-I")
        .arg(crate_dir.join("tests/c"))
        .arg(&src)
        .arg("-o")
        .arg(&bin);
    if static_lib {
        let libs = pkg_config(prefix, &["--static", "--libs"]);
        cc.arg(Path::new(&libdir).join("libshmlink.a"))
            .args(libs.iter().filter(|l| *l != "-lshmlink"));
    } else {
        cc.args([
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
        ])
        .arg("-fno-omit-frame-pointer")
        .args(pkg_config(prefix, &["--libs"]))
        .arg(format!("-Wl,-rpath,{libdir}"));
    }
    let out = cc.output().expect("run cc");
    assert!(
        out.status.success(),
        "compiling {source} failed:\n{}",
        text(&out)
    );
    Some(bin)
}

/// A fresh rendezvous directory for one program.
fn shm_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shmlink-capi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Starts a compiled program with the sanitizers' settings (LeakSanitizer on, no
/// suppressions: a leak fails the program with exit status 86).
fn spawn(bin: &Path, args: &[&str], dir: &Path) -> Child {
    spawn_cmd(bin, args, dir)
        .spawn()
        .expect("start the test program")
}

/// The command [`spawn`] starts.
fn spawn_cmd(bin: &Path, args: &[&str], dir: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("SHMLINK_DIR", dir)
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:abort_on_error=0:exitcode=86",
        )
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
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
    run_c_env(source, args, &[], timeout);
}

/// [`run_c`] with more environment variables; its stdout and stderr (`None`: skipped).
fn run_c_env(
    source: &str,
    args: &[&str],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Option<Output> {
    let bin = compile(source)?;
    let dir = shm_dir(bin.file_name().unwrap().to_str().unwrap());
    let mut cmd = spawn_cmd(&bin, args, &dir);
    cmd.envs(env.iter().copied());
    let out = finish(
        cmd.spawn().expect("start the test program"),
        timeout,
        source,
    );
    let _ = std::fs::remove_dir_all(&dir);
    print!("{}", text(&out));
    assert!(
        out.status.success(),
        "{source} failed ({}):\n{}",
        out.status,
        text(&out)
    );
    Some(out)
}

#[test]
fn c_echo_over_shm_ux_tcp_with_zero_copy() {
    run_c("tests/c/echo.c", &[], Duration::from_secs(180));
}

#[test]
fn c_one_million_ordered_checksummed_messages() {
    run_c("tests/c/ordered.c", &[], Duration::from_secs(300));
}

#[test]
fn c_sizes_from_0_bytes_to_64_mib() {
    run_c("tests/c/sizes.c", &[], Duration::from_secs(300));
}

#[test]
fn c_poll_loop_over_64_nonblocking_connections() {
    run_c("tests/c/nonblocking.c", &[], Duration::from_secs(180));
}

#[test]
fn c_peer_death_is_econnreset_within_100_ms() {
    run_c("tests/c/peer_death.c", &[], Duration::from_secs(120));
}

#[test]
fn c_bad_arguments_are_einval_not_crashes() {
    run_c("tests/c/bad_args.c", &[], Duration::from_secs(120));
}

#[test]
fn c_version_macros_match_the_library() {
    run_c("tests/c/version.c", &[], Duration::from_secs(60));
}

#[test]
fn c_errors_name_c_setters_not_rust_calls() {
    run_c("tests/c/error_terms.c", &[], Duration::from_secs(60));
}

/// `SHMLINK_LOG=info`: the library's events on stderr, read at the first call. The same
/// program: its publisher refuses its own plain connect, and says why.
#[test]
fn c_shmlink_log_prints_refusal_reasons() {
    let env = [("SHMLINK_LOG", "info")];
    let Some(out) = run_c_env("tests/c/error_terms.c", &[], &env, Duration::from_secs(60)) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("shmlink: subscriber refused"))
        .unwrap_or_else(|| panic!("no refusal on stderr: {err}"));
    assert!(line.contains("reason="), "{line}");
}

#[test]
fn c_pubsub_fan_out_to_4_processes() {
    run_c("tests/c/pubsub.c", &[], Duration::from_secs(240));
}

/// examples/rust_peer, built once per run (`cargo test --test c` alone builds no
/// examples) into the target directory of this test binary.
fn rust_peer() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Command::new(env!("CARGO"))
            .args([
                "build",
                "-q",
                "-p",
                "shmlink-capi",
                "--example",
                "rust_peer",
            ])
            .current_dir(root())
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "building rust_peer failed: {}",
            text(&out)
        );
    });
    let exe = std::env::current_exe().expect("own path");
    let dir = exe.parent().and_then(Path::parent).expect("target/PROFILE");
    dir.join("examples/rust_peer")
}

/// Reads the first stdout line of a process that prints its bound address.
fn bound_addr(child: &mut Child) -> String {
    use std::io::BufRead;
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the bound address");
    line.trim().to_owned()
}

#[test]
fn c_client_to_rust_server() {
    let Some(bin) = compile("tests/c/interop_client.c") else {
        return;
    };
    let dir = shm_dir("interop-c-client");
    for addr in ["shm:interop", "tcp:127.0.0.1:0"] {
        let mut server = Command::new(rust_peer())
            .args(["server", addr])
            .env("SHMLINK_DIR", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rust_peer");
        let bound = bound_addr(&mut server);
        let client = finish(
            spawn(&bin, &[&bound], &dir),
            Duration::from_secs(120),
            "C client",
        );
        let server = finish(server, Duration::from_secs(30), "Rust server");
        print!("{}", text(&client));
        assert!(
            client.status.success(),
            "C client on {addr}: {}",
            text(&client)
        );
        assert!(
            server.status.success(),
            "Rust server on {addr}: {}",
            text(&server)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rust_client_to_c_echo_server() {
    let Some(bin) = compile("examples/echo_server.c") else {
        return;
    };
    let dir = shm_dir("interop-c-server");
    for addr in ["shm:interop", "ux:interop-c-server", "tcp:127.0.0.1:0"] {
        let addr = if addr.starts_with("ux:") {
            format!("{addr}-{}", std::process::id())
        } else {
            addr.to_owned()
        };
        let mut server = spawn(&bin, &[&addr], &dir);
        let bound = bound_addr(&mut server);
        let client = Command::new(rust_peer())
            .args(["client", &bound, "300"])
            .env("SHMLINK_DIR", &dir)
            .output()
            .expect("run rust_peer client");
        let server = finish(server, Duration::from_secs(60), "C echo server");
        print!("{}", text(&client));
        assert!(
            client.status.success(),
            "Rust client on {addr}: {}",
            text(&client)
        );
        assert!(
            server.status.success(),
            "C echo server on {addr}: {}",
            text(&server)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn c_examples_echo_client_and_server() {
    let (Some(server_bin), Some(client_bin)) = (
        compile("examples/echo_server.c"),
        compile("examples/echo_client.c"),
    ) else {
        return;
    };
    let dir = shm_dir("examples");
    let mut server = spawn(&server_bin, &["shm:example-echo"], &dir);
    let bound = bound_addr(&mut server);
    let client = finish(
        spawn(&client_bin, &[&bound, "hello", "world"], &dir),
        Duration::from_secs(60),
        "echo_client",
    );
    let server = finish(server, Duration::from_secs(30), "echo_server");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(client.status.success(), "echo_client: {}", text(&client));
    assert!(server.status.success(), "echo_server: {}", text(&server));
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        out.contains("connected over shm") && out.ends_with("hello\nworld\n"),
        "{out}"
    );
}

#[test]
fn static_library_links_and_serves() {
    let Some(bin) = compile_as("examples/echo_server.c", true) else {
        return;
    };
    let ldd = Command::new("ldd").arg(&bin).output().map(|o| text(&o));
    if let Ok(ldd) = ldd {
        assert!(
            !ldd.contains("libshmlink"),
            "linked the shared library: {ldd}"
        );
    }
    let dir = shm_dir("static");
    let mut server = spawn(&bin, &["shm:static-echo"], &dir);
    let bound = bound_addr(&mut server);
    let client = Command::new(rust_peer())
        .args(["client", &bound, "100"])
        .env("SHMLINK_DIR", &dir)
        .output()
        .expect("run rust_peer client");
    let server = finish(server, Duration::from_secs(60), "static echo_server");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(client.status.success(), "Rust client: {}", text(&client));
    assert!(
        server.status.success(),
        "static echo_server: {}",
        text(&server)
    );
}

#[test]
fn c_example_poll_server_with_rust_clients() {
    let Some(bin) = compile("examples/poll_server.c") else {
        return;
    };
    let dir = shm_dir("poll-example");
    const CLIENTS: usize = 8;
    let mut server = spawn(&bin, &["shm:poll-example", &CLIENTS.to_string()], &dir);
    let bound = bound_addr(&mut server);
    let clients: Vec<Child> = (0..CLIENTS)
        .map(|_| {
            Command::new(rust_peer())
                // Up to 1 MiB: echoes larger than half the ring leave their rest
                // pending in the non-blocking server (crates/shmlink/tests/wakeups.rs).
                .args(["client", &bound, "50"])
                .env("SHMLINK_DIR", &dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start rust_peer client")
        })
        .collect();
    for c in clients {
        let out = finish(c, Duration::from_secs(120), "Rust client");
        assert!(out.status.success(), "Rust client: {}", text(&out));
    }
    let server = finish(server, Duration::from_secs(30), "poll_server");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(server.status.success(), "poll_server: {}", text(&server));
}

#[test]
fn c_example_pubsub_two_subscribers() {
    let Some(bin) = compile("examples/pubsub.c") else {
        return;
    };
    let dir = shm_dir("pubsub-example");
    let subs: Vec<Child> = (0..2)
        .map(|_| spawn(&bin, &["sub", "shm:ticks"], &dir))
        .collect();
    let publisher = finish(
        spawn(&bin, &["pub", "shm:ticks", "2", "5"], &dir),
        Duration::from_secs(60),
        "publisher",
    );
    assert!(
        publisher.status.success(),
        "publisher: {}",
        text(&publisher)
    );
    for s in subs {
        let out = finish(s, Duration::from_secs(30), "subscriber");
        assert!(out.status.success(), "subscriber: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[path = "../../shmlink/src/transport/tls/test_pki.rs"]
mod test_pki;

#[test]
fn c_tls_with_certificate_files() {
    let pki = test_pki::pki();
    let dir = shm_dir("tls-files");
    std::fs::create_dir_all(&dir).expect("create the directory");
    let file = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).expect("write a PEM file");
        path.to_str().expect("UTF-8 path").to_owned()
    };
    let args = [
        file("ca.pem", &pki.ca),
        file("server.pem", &pki.server.cert),
        file("server.key", &pki.server.key),
        file("other-ca.pem", &pki.other_ca),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_c("tests/c/tls.c", &args, Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
}
