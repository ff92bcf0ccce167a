//! Generates the prost message structs of `proto/echo.proto` into `OUT_DIR` with protox
//! (a protobuf compiler in Rust: no `protoc` binary needed) and tonic-prost-build. Only
//! the messages: the service's server and client glue is in `src/echo.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/echo.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_fds(descriptors)?;
    Ok(())
}
