//! Retiring a large stream: how long the relay takes, and how much memory it holds, to retract
//! every object of a stream whose channel was removed from the configuration.
//!
//! 1. A fresh membership topic is filled with the records of `BENCH_MEMBERS` objects (default
//!    1,000,000) of one stream, `watchNamespacedPods.team-0`, announced on `prod.pods`. Not timed.
//! 2. The real `watchrelay` binary starts against the simulator with a configuration that no
//!    longer has that channel: it restores the membership, then retires the stream (an
//!    inferred DELETED per object on `prod.pods`, then its membership tombstone) before it
//!    starts anything. Timed from the start of the process to the last DELETED counted in its
//!    own metric; its restore time is read from its metric too; its peak RSS from `/proc`.
//!
//! Run with scripts/bench.sh retire (it starts a broker) or set KAFKA_BOOTSTRAP_SERVERS.

mod common;

use std::time::{Duration, Instant};

use common::{env_or, fill_membership, free_port, metric, peak_rss_kib};

fn main() {
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP_SERVERS")
        .expect("KAFKA_BOOTSTRAP_SERVERS is not set: run scripts/bench.sh retire");
    let members = env_or("BENCH_MEMBERS", 1_000_000);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let topic = format!("bench.membership.{stamp}");
    let t = Instant::now();
    let (records, bytes) = fill_membership(&bootstrap, &topic, members, 1, 0);
    println!(
        "filled {topic}: {members} members of one stream, {records} records, {:.1} MB, in {:.1} s",
        bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    create_topic(&bootstrap, "prod.pods");

    let (_rt, sim) = common::start_sim(watchrelay_sim::SimConfig::default());
    sim.create(
        "namespaces",
        None,
        watchrelay_sim::objects::namespace("watchrelay"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let port = free_port();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "clusterName: bench\nkubernetes:\n  kubeconfig: {}\nkafka:\n  bootstrapServers: {bootstrap}\n  oversize: trim\n\
             checkpoint:\n  namespace: watchrelay\n  membership:\n    topic: {topic}\nhttp:\n  listen: 127.0.0.1:{port}\n\
             channels:\n  - operationId: watchNodes\n    topic: nodes\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    create_topic(&bootstrap, "nodes");
    let started = Instant::now();
    let relay = common::spawn_relay(&config);
    let pid = relay.0.id();
    // Done once every DELETED is on `prod.pods` (the stream's metrics go with it once retired).
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "bench-retire")
        .create()
        .unwrap();
    let published = || -> usize {
        use rdkafka::consumer::Consumer as _;
        (0..3)
            .map(|p| {
                consumer
                    .fetch_watermarks("prod.pods", p, Duration::from_secs(5))
                    .map_or(0, |(_, high)| high as usize)
            })
            .sum()
    };
    let before = published();
    let mut peak = 0;
    loop {
        peak = peak.max(peak_rss_kib(pid));
        if published() >= before + members {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "the relay did not retire {members} members"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = started.elapsed().as_secs_f64();
    let restore = metric(port, "watchrelay_membership_restore_seconds").unwrap_or(0.0);
    peak = peak.max(peak_rss_kib(pid));
    common::stop(relay);
    println!(
        "retired {members} members in {secs:.1} s from the process's start (of which the restore {restore:.1} s, the retraction {:.1} s, {:.0} DELETEDs/s); peak RSS {:.0} MiB",
        secs - restore,
        members as f64 / (secs - restore).max(1e-9),
        peak as f64 / 1024.0
    );
}

fn create_topic(bootstrap: &str, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let new = NewTopic::new(topic, 3, TopicReplication::Fixed(1));
    // Already there from an earlier run: fine.
    let _ = futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new()));
}
