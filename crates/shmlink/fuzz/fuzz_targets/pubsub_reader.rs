//! A subscriber reading a topic whose shared memory holds arbitrary bytes that keep
//! changing (a hostile or broken publisher).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shmlink::testing::fuzz_pubsub_reader(data));
