//! A resync's bookkeeping at scale: what a stream holds while it relists after a 410 with
//! `BENCH_MEMBERS` members (default 1,000,000), and which records a full and a delta resync
//! publish.
//!
//! A child process (so its memory is its own) builds the members as a restore does, then runs
//! the stream's resync bookkeeping ([`Announced`]) over a new state in which `BENCH_CHANGED`
//! per mille of the objects (default 20: 2%) changed since the position, 1% are new and 1% were
//! deleted: every listed object is checked against the members (replaced names, unchanged since
//! the position), then every member the state lacks is found. It reports the time, the records
//! each kind of resync publishes, and the peak RSS. List pages and records in flight are not
//! part of it: they are bounded by `listPageSize` and `maxInFlightPerStream` whatever the
//! cluster's size.
//!
//! Run with `cargo bench --bench resync` (no broker needed).

mod common;

use common::{env_or, identity, rss_kib};
use std::process::Command;
use std::time::Instant;

use watchrelay::event::{Identity, Meta};
use watchrelay::membership::{Known, Members};
use watchrelay::Announced;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("child") {
        return child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("child")
        .output()
        .expect("the child runs");
    assert!(
        out.status.success(),
        "the child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

fn child() {
    let n = env_or("BENCH_MEMBERS", 1_000_000) as u64;
    let changed = env_or("BENCH_CHANGED", 20) as u64;
    let position = 10 * n;
    let namespace = |i: u64| format!("team-{}", i % 100);
    let mut members = Members::default();
    for i in 0..n {
        let (uid, name) = identity(i);
        let known = Known {
            key: Some(format!("{}/{name}", namespace(i))),
            name,
            namespace: Some(namespace(i)),
            rv: (position - n + i).to_string(),
            topic: Some("prod.pods".into()),
        };
        members.restore_record(&uid, Some(&known));
    }
    members.finish_restore();
    let floor = rss_kib("VmRSS");

    let t = Instant::now();
    let mut announced = Announced::new(Some(&members));
    announced.since(&position.to_string());
    let (mut listed, mut replaced, mut delta) = (0u64, 0usize, 0u64);
    // The new state: the members but the deleted 1% (every 100th), 1% new objects.
    for i in (0..n).filter(|i| i % 100 != 0).chain(n..n + n / 100) {
        let (uid, name) = identity(i);
        let fresh = i % 1000 < changed || i >= n;
        let rv = if fresh {
            position + 1 + i
        } else {
            position - n + i
        };
        let meta = Meta::new(Identity {
            kind: "Pod",
            api_version: "v1",
            name: &name,
            namespace: Some(&namespace(i)),
            uid: &uid,
            resource_version: &rv.to_string(),
        });
        replaced += announced.add(&meta, &members).len();
        if !announced.unchanged(&meta, &members) {
            delta += 1;
        }
        listed += 1;
    }
    announced.end();
    let vanished = members.keys().filter(|k| announced.vanished(k)).count() as u64;
    let secs = t.elapsed().as_secs_f64();
    let peak = rss_kib("VmHWM");
    println!(
        "resync of {n} members: {listed} objects listed ({changed} per mille changed, 1% new, 1% deleted) in {secs:.2} s of bookkeeping; {replaced} replaced names",
    );
    println!(
        "records published: full {} (every object, {vanished} inferred DELETEDs, the end marker), delta {} ({} unchanged not published)",
        listed + vanished + 1,
        delta + vanished + 1,
        announced.skipped()
    );
    println!(
        "peak RSS {:.0} MiB (the members alone: {:.0} MiB)",
        peak as f64 / 1024.0,
        floor as f64 / 1024.0
    );
}
