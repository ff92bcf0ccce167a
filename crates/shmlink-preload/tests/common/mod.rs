//! Helpers shared by the preload's integration tests: where cargo put the preload library
//! and the `shmlink` binary, scratch directories, the C test programs, and waiting for a
//! child with a deadline.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// Every child is killed after this (a passing run takes well under a second; a failing
/// one up to the C programs' own read timeouts).
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// `target/debug` (or the profile's directory), where cargo puts the preload library
/// and the `shmlink` binary.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The preload library (`cargo build -p shmlink-preload` builds it).
pub fn preload_lib() -> PathBuf {
    let lib = target_dir().join("libshmlink_preload.so");
    assert!(
        lib.is_file(),
        "{} is missing: `cargo build -p shmlink-preload` builds it",
        lib.display()
    );
    lib
}

/// A scratch directory (mode 0755, so that a child of another uid may enter it),
/// removed on drop. Its name is short: rendezvous socket paths inside it must fit a
/// Unix socket address.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("slp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `tests/c/NAME.c` into `dir/NAME` (with `-pthread`); `None` after a skip
/// line where there is no C compiler.
pub fn compile(dir: &Path, name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = dir.join(name);
    let r = Command::new("cc")
        .args(["-O1", "-Wall", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .output();
    match r {
        Ok(o) if o.status.success() => Some(out),
        Ok(o) => panic!(
            "cc failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            shmlink_testkit::skip("cc", format!("no C compiler (cc: {e})"));
            None
        }
    }
}

/// Waits for `child` at most [`RUN_TIMEOUT`], killing it after.
pub fn finish(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + RUN_TIMEOUT;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "{what} did not finish in {RUN_TIMEOUT:?}; stdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
