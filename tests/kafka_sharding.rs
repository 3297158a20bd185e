//! Scale-out: replicas share the shards through Kafka's consumer group. Replicas join, leave
//! cleanly and crash under churn; every shard keeps one owner at a time, and the consumer's view
//! of every key ends equal to the cluster.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::bed::{eventually, Bed, Relay};
use common::kafka::{self, Msg};
use common::view::{kafka_view, pods};
use watchrelay::config::{Config, GroupProtocol, ShardingConfig};
use watchrelay_sim::ChurnSpec;

const SHARDS: u32 = 8;

fn owned(replicas: &[&Relay]) -> Vec<i64> {
    replicas
        .iter()
        .map(|r| r.metrics.shards_owned.get())
        .collect()
}

/// Waits until `replicas` own every shard between them, each at least one.
async fn wait_spread(replicas: &[&Relay]) {
    eventually(
        || {
            let o = owned(replicas);
            o.iter().sum::<i64>() == i64::from(SHARDS) && o.iter().all(|&n| n > 0)
        },
        || format!("the shards were never spread: {:?}", owned(replicas)),
    )
    .await;
}

/// How long until `replicas` own every shard between them again.
async fn takeover(replicas: &[&Relay]) -> Duration {
    let start = Instant::now();
    wait_spread(replicas).await;
    start.elapsed()
}

fn sharded(cfg: &Config, protocol: GroupProtocol) -> Config {
    let mut cfg = cfg.clone();
    cfg.checkpoint.name = kafka::unique("relay");
    cfg.sharding = ShardingConfig {
        enabled: true,
        shards: SHARDS,
        topic: Some(kafka::unique("shards")),
        session_timeout_ms: 6000,
        ownership_deadline_ms: 3000,
        group_protocol: protocol,
    };
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_shards_over_the_classic_protocol() {
    replicas_share_the_shards_and_handovers_lose_nothing(GroupProtocol::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_shards_over_the_consumer_protocol() {
    replicas_share_the_shards_and_handovers_lose_nothing(GroupProtocol::Consumer).await;
}

async fn replicas_share_the_shards_and_handovers_lose_nothing(protocol: GroupProtocol) {
    let namespaces: Vec<String> = (0..12).map(|i| format!("team-{i}")).collect();
    let names: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let bed = Bed::new(&names).await;
    let topic = kafka::unique("sharded");
    kafka::create_topics(&[&topic], 3).await;
    let cfg = sharded(
        &bed.config(
            &format!(
                "  - operationId: watchNamespacedPods\n    namespaces: [{}]\n    topic: {topic}\n",
                names.join(", ")
            ),
            "",
        ),
        protocol,
    );

    let a = Relay::start(&bed, cfg.clone());
    wait_spread(&[&a]).await;
    a.wait_up(names.len()).await;
    let churn = bed.sim.start_churn(ChurnSpec {
        rate_per_sec: 150.0,
        namespaces: namespaces.clone(),
        resources: vec!["pods".into()],
        max_objects_per_kind: 8,
        total_events: None,
    });

    // Scale 1 -> 3: the shards spread, each moving one handed over.
    let b = Relay::start(&bed, cfg.clone());
    let c = Relay::start(&bed, cfg.clone());
    let scale_up = takeover(&[&a, &b, &c]).await;

    // A clean stop hands its shards over.
    b.stop().await;
    let clean = takeover(&[&a, &c]).await;

    // Every task of a replica dropped where it stands: nothing drained, no final position
    // written. Its group threads then leave at once, so the takeover does not wait out the
    // session as a killed process's would.
    c.kill().await;
    let crash = takeover(&[&a]).await;

    // And one joins again.
    let d = Relay::start(&bed, cfg.clone());
    let rejoin = takeover(&[&a, &d]).await;
    churn.stop().await;
    eprintln!("{protocol:?} takeovers: scale 1->3 {scale_up:?}, clean stop {clean:?}, crash {crash:?}, join {rejoin:?}");

    // Every key's last record is the cluster's.
    let expected = pods(&bed.sim, &names, |_| true);
    let bootstrap = kafka::bootstrap();
    let read_topic = topic.clone();
    let msgs: Vec<Msg> = tokio::task::spawn_blocking(move || {
        kafka::read_until(&bootstrap, &read_topic, Duration::from_secs(90), |m| {
            kafka_view(m) == expected
        })
    })
    .await
    .unwrap();
    let expected = pods(&bed.sim, &names, |_| true);
    assert_eq!(
        kafka_view(&msgs),
        expected,
        "the consumer's view differs from the cluster"
    );

    // Every record names its shard and owner epoch, and its shard is its namespace's.
    for m in &msgs {
        let ns = m.value["object"]["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default();
        let shard: u32 = m.headers["ce_shard"].parse().unwrap();
        assert_eq!(
            shard,
            cfg.sharding.shard_of(ns),
            "record of {ns} in the wrong shard"
        );
        assert!(m.headers["ce_ownerepoch"].parse::<u64>().unwrap() >= 1);
    }
    // Per key, owner epochs never go down in partition order.
    let mut epochs: BTreeMap<(i32, String), u64> = BTreeMap::new();
    let mut sorted: Vec<&Msg> = msgs.iter().collect();
    sorted.sort_by_key(|m| (m.partition, m.offset));
    let mut late = 0;
    for m in sorted {
        let Some(key) = &m.key else { continue };
        let epoch: u64 = m.headers["ce_ownerepoch"].parse().unwrap();
        let last = epochs.entry((m.partition, key.clone())).or_insert(0);
        if epoch < *last {
            late += 1;
        }
        *last = (*last).max(epoch);
    }
    let changes = bed.journal("pods", None).len();
    eprintln!(
        "records {} for {changes} changes ({:.2} per change); records behind a newer epoch on their key: {late}",
        msgs.len(),
        msgs.len() as f64 / changes.max(1) as f64
    );
    assert_eq!(
        late, 0,
        "a deposed owner's record landed after its successor's"
    );

    a.stop().await;
    d.stop().await;
}
