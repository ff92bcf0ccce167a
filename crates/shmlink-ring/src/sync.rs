//! The atomics the lock-free protocols use, from one place so that loom can replace them
//! (`RUSTFLAGS="--cfg loom" cargo test -p shmlink-ring --release loom`): std's in a normal
//! build, loom's under `--cfg loom`. The rings and the shmlink library take their
//! protocol atomics only from here (a test checks both crates' sources).

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
// A compiler-only barrier has no memory-model effect for loom to track.
pub use std::sync::atomic::compiler_fence;
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(all(test, not(loom)))]
mod tests {
    /// The rest of the ring crate and the shmlink library take their atomics from here,
    /// so the loom build models all of them (crossbeam's `primitive` module habit).
    #[test]
    fn atomics_come_only_from_this_module() {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let library = here.join("../shmlink/src");
        assert!(
            library.is_dir(),
            "the check covers the library too, at {}",
            library.display()
        );
        let mut stack = vec![here.join("src"), library];
        let mut checked = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path != here.join("src/sync.rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let direct = text.lines().any(|l| {
                        l.contains(concat!("std::sync::", "atomic"))
                            && ["AtomicU32", "AtomicU64", "fence"]
                                .iter()
                                .any(|t| l.contains(t))
                    });
                    assert!(
                        !direct,
                        "{} uses std's protocol atomics directly; import them from crate::sync",
                        path.display()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 10, "only {checked} files found");
    }
}
