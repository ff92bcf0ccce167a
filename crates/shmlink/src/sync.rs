//! The atomics the lock-free protocols use, from one place so that loom can replace them
//! (`RUSTFLAGS="--cfg loom" cargo test -p shmlink --lib loom`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
// A compiler-only barrier has no memory-model effect for loom to track.
pub(crate) use std::sync::atomic::compiler_fence;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(all(test, not(loom)))]
mod tests {
    /// The rest of the library takes its atomics from here, so the loom build models all
    /// of them (crossbeam's `primitive` module habit).
    #[test]
    fn atomics_come_only_from_this_module() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.file_name().unwrap() != "sync.rs" {
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
                }
            }
        }
    }
}
