//! Compiles the `floor-c` method's C ring (csrc/floor.c) into the bench.

fn main() {
    println!("cargo:rerun-if-changed=csrc/floor.c");
    cc::Build::new()
        .file("csrc/floor.c")
        .opt_level(2)
        .warnings(true)
        .compile("shmlink_bench_floor");
}
