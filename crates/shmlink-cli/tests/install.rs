//! The one install command: `scripts/install.sh PREFIX` (a release build) into a scratch
//! prefix, then `scripts/install-check.sh PREFIX` uses the installed copy as a user would:
//! a C program built with pkg-config (shared and static), the soname and split debug
//! info, the installed `shmlink run` finding the installed preload library and moving a
//! real TCP program pair (python3) to shared memory, the manual page and completions.
//!
//! Skipped (category `install`) without cc, pkg-config, python3 or binutils' objcopy.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The environment of the nested release build: the user's, without what `cargo test`
/// adds for its tests (`CARGO_PKG_*`, `OUT_DIR`, `LD_LIBRARY_PATH`, ...), some of which
/// build scripts watch, so that it reuses the release builds made outside the tests.
fn build_env() -> Vec<(String, String)> {
    const KEEP: [&str; 11] = [
        "PATH",
        "HOME",
        "USER",
        "LANG",
        "TMPDIR",
        "CARGO_HOME",
        "CARGO_TARGET_DIR",
        "CARGO_TERM_COLOR",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "SHMLINK_REQUIRE",
    ];
    std::env::vars()
        .filter(|(k, _)| KEEP.contains(&k.as_str()))
        .collect()
}

#[test]
fn the_installed_tree_serves_c_programs_and_shmlink_run_finds_its_preload() {
    for (tool, arg) in [
        ("cc", "--version"),
        ("pkg-config", "--version"),
        ("python3", "--version"),
        ("objcopy", "--version"),
    ] {
        if !have(tool, arg) {
            shmlink_testkit::skip("install", format!("{tool} is not installed"));
            return;
        }
    }
    let prefix = root().join("target/install-test/prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let out = Command::new(root().join("scripts/install.sh"))
        .arg(&prefix)
        .env_clear()
        .envs(build_env())
        .output()
        .expect("run scripts/install.sh");
    assert!(
        out.status.success(),
        "scripts/install.sh failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = prefix.canonicalize().unwrap();
    // Nothing of the source tree's builds may help the installed copy.
    let check = Command::new(root().join("scripts/install-check.sh"))
        .arg(&prefix)
        .env_remove("SHMLINK_PRELOAD_LIB")
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("PKG_CONFIG_PATH")
        .output()
        .expect("run scripts/install-check.sh");
    let stdout = String::from_utf8_lossy(&check.stdout);
    let stderr = String::from_utf8_lossy(&check.stderr);
    eprintln!("{stdout}");
    assert!(check.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("checks passed"), "{stdout}");
    // The installed command alone, moved away from its tree, says where it searched.
    let alone = root().join("target/install-test/alone");
    std::fs::create_dir_all(&alone).unwrap();
    let exe = alone.join("shmlink");
    std::fs::copy(prefix.join("bin/shmlink"), &exe).unwrap();
    let out = Command::new(&exe)
        .args(["run", "--", "true"])
        .env_remove("SHMLINK_PRELOAD_LIB")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // The build directory of this release build is the last place searched, and has the
    // library: the copy finds it there (the `cargo install --path` case).
    let built = root().join("target/release/libshmlink_preload.so");
    if built.is_file() && std::env::var_os("CARGO_TARGET_DIR").is_none() {
        assert!(out.status.success(), "{stderr}");
    }
    let wrong = Command::new(&exe)
        .args(["run", "--", "true"])
        .env("SHMLINK_PRELOAD_LIB", "/nonexistent/libshmlink_preload.so")
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1), "{wrong:?}");
    assert!(
        String::from_utf8_lossy(&wrong.stderr)
            .contains("SHMLINK_PRELOAD_LIB=/nonexistent/libshmlink_preload.so is not a file"),
        "{wrong:?}"
    );
    let _ = std::fs::remove_dir_all(&alone);
    let _ = std::fs::remove_dir_all(&prefix);
}
