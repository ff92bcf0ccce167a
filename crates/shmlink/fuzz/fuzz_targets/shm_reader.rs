//! A receiving `shm:` connection over a ring whose control block and contents are
//! arbitrary bytes that keep changing (a hostile peer writing shared memory).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shmlink::testing::fuzz_shm_reader(data));
