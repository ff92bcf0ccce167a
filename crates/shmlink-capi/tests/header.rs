//! The committed header is what cbindgen makes of the source now: a change to an entry
//! point or its docs without `scripts/capi.sh header` fails here (and in CI).

use std::path::Path;

#[test]
fn committed_header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut fresh);
    let path = dir.join("include/shmlink.h");
    if std::env::var_os("SHMLINK_WRITE_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write include/shmlink.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/shmlink.h is stale: run `scripts/capi.sh header` and commit the result"
    );
}
