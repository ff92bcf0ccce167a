//! A subscriber's side of the subscribe handshake against a hostile publisher: the
//! answer, its numbers and the descriptors that come with it are arbitrary.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shmlink::testing::fuzz_pubsub_handshake(data));
