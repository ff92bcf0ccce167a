//! Records the cargo profile directory this build writes to (`target/release` or
//! `target/debug`), the last place `shmlink run` looks for `libshmlink_preload.so`: after
//! `cargo install --path crates/shmlink-cli` (which builds in the workspace's target
//! directory), `cargo build --release -p shmlink-preload` puts the library there.
fn main() {
    // OUT_DIR is PROFILE_DIR/build/shmlink-cli-HASH/out.
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    let profile_dir = std::path::Path::new(&out)
        .ancestors()
        .nth(3)
        .map(|p| p.to_path_buf());
    if let Some(dir) = profile_dir {
        println!(
            "cargo:rustc-env=SHMLINK_BUILD_PROFILE_DIR={}",
            dir.display()
        );
    }
    println!("cargo:rerun-if-changed=build.rs");
}
