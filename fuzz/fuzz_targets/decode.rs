//! Any bytes as a watch line: the decoder must refuse it or read it as serde_json does
//! (`watchrelay::testing::conformance`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| watchrelay::testing::conformance::check(data));
