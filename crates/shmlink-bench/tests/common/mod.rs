//! Helpers of the `shmlink-bench` tests (`bench.rs`, `pubsub.rs`): the binary, a
//! directory per test, one test at a time running processes, a test per method
//! ([`method_tests!`]), and iceoryx2's files.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

/// `method_tests! { every, METHODS; test => "name", ... }`: a test per method that runs
/// `exercise("name")` (the test file's), with the attributes written before it (an
/// `#[ignore = "why"]`), and `every`, which fails if a method of `METHODS` has no test.
macro_rules! method_tests {
    ($every:ident, $methods:expr; $($(#[$attr:meta])* $test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            $(#[$attr])*
            fn $test() {
                exercise($name);
            }
        )*

        #[test]
        fn $every() {
            let tested = [$($name),*];
            for m in $methods {
                assert!(tested.contains(&m.name()), "no test for {}", m.name());
            }
        }
    };
}

pub const BIN: &str = env!("CARGO_BIN_EXE_shmlink-bench");

/// A directory of this test's own (rendezvous files, reports), removed on drop.
pub struct Dir(pub PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh `shmlink-{suite}-test-{test}-{pid}` in the temporary directory.
pub fn dir(suite: &str, test: &str) -> Dir {
    let d = std::env::temp_dir().join(format!(
        "shmlink-{suite}-test-{test}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// One test at a time runs processes: busy-polling ends starve each other when more of
/// them than CPUs run at once, and the machine may be measuring something else.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `shmlink-bench ARGS` in `d` (a run without output flags writes bench-results/ there),
/// with `env` set, one test at a time.
pub fn shmlink_bench(d: &Dir, args: &[&str], env: &[(&str, &str)]) -> Output {
    let _serial = serial();
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("SHMLINK_DIR", &d.0).current_dir(&d.0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run shmlink-bench")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// iceoryx2's files: its shared memory (`iox2_*` in /dev/shm) and its node and service
/// files (under its default root, /tmp/iceoryx2).
pub fn iceoryx2_files() -> BTreeSet<PathBuf> {
    let mut files = BTreeSet::new();
    for (dir, prefix) in [
        ("/dev/shm", "iox2_"),
        ("/tmp/iceoryx2/nodes", ""),
        ("/tmp/iceoryx2/services", ""),
    ] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                files.insert(e.path());
            }
        }
    }
    files
}
