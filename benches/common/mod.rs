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

use std::io::Write as _;
use std::process::Command;

/// The relay binary to measure: this build's, or `BENCH_RELAY_BIN` (another build, to compare
/// in the same sitting).
pub fn relay_bin() -> String {
    std::env::var("BENCH_RELAY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_watchrelay").to_string())
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

/// Stops a relay with SIGTERM (it drains and writes its checkpoint) and waits for it.
pub fn stop(mut relay: KillOnDrop) {
    let _ = Command::new("kill")
        .args(["-TERM", &relay.0.id().to_string()])
        .status();
    let _ = relay.0.wait();
}

/// Kills the relay if the benchmark fails half-way.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat, counted after the command name.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

pub fn scrape(port: u16) -> String {
    use std::io::Read;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

pub fn metric(port: u16, series: &str) -> Option<f64> {
    scrape(port)
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The simulator with `cfg`, served by a runtime of its own (one worker thread) in this
/// process; keep the runtime as long as the simulator.
pub fn start_sim(cfg: watchrelay_sim::SimConfig) -> (tokio::runtime::Runtime, watchrelay_sim::Sim) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sim")
        .enable_all()
        .build()
        .unwrap();
    let sim = rt
        .block_on(watchrelay_sim::Sim::start(cfg))
        .expect("simulator");
    (rt, sim)
}

/// A loopback port free now (for the relay's HTTP listener).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
