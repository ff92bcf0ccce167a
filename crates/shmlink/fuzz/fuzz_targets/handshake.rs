//! The `shm:` handshake parser over arbitrary bytes (a hostile client's hello or a
//! hostile listener's answer).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shmlink::testing::fuzz_handshake(data));
