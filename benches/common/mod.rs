//! What the benchmarks share: real-looking object identities and the process's memory.
#![allow(dead_code, reason = "each benchmark uses a different part")]

/// Object `i`'s uid (a random-looking UUID) and name (as a ReplicaSet names pods), the same for
/// the same `i` in every run.
pub fn identity(i: u64) -> (String, String) {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b) = (mix(2 * i + 1), mix(2 * i + 2));
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    );
    (uid, format!("web-{:010x}-{:05x}", a >> 24, b & 0xfffff))
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`: the peak).
pub fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// An environment variable as a number, or `default`.
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
