//! The shared library's soname: installed as libshmlink.so.0 (scripts/capi.sh), whatever
//! cargo names the file it builds.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libshmlink.so.0");
}
