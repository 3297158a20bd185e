//! The tables tier: the recipes run on real engines over a topic the relay wrote through a
//! chaotic run against the simulator, with a schema registry: churn, a same-name recreate, a
//! crash (kill -9) with Kafka having written part of what was sent, a 410 with inferred
//! DELETEDs, a namespace leaving the selector, and etcd restores without and with a bumped
//! revision. The run's records are then written, in order and with their headers, to a topic of
//! a real broker, and:
//! - ClickHouse's engine (chDB) runs `recipes/clickhouse/pods.sql` over them;
//! - DuckDB runs `recipes/duckdb/pods.sql` over a dump of them, for the table now and as it
//!   was before the restores;
//! - Flink SQL runs two views of `recipes/flink/pods.sql` (over `upsert-kafka`, and the
//!   highest version per key) reading the topic;
//! - Apicurio Registry's own JSON Schema deserializer decodes every record, each against the
//!   schema whose id its headers carry.
//!
//! The recipes also run over records in Confluent's framing (`wireFormat: confluent`), Flink's
//! through its third view, of raw values.
//!
//! Each table must then hold exactly the cluster's pods: none missing, none extra, none stale (by
//! key, uid and resourceVersion). The same records in a table ordered by
//! `watchrelay.resourceVersion` instead of `watchrelay.version` must hold a stale row: the
//! version is what makes the table exact.
//!
//! Needs (`scripts/test.sh` provides them): `KAFKA_BOOTSTRAP_SERVERS`; `WATCHRELAY_REGISTRY_URL`,
//! an Apicurio Registry 3; `WATCHRELAY_TABLES_PYTHON`, a Python with chDB and DuckDB;
//! `WATCHRELAY_FLINK_CLASSPATH` and `WATCHRELAY_DECODER_CLASSPATH`, the Java programs under
//! `tests/tables/`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::bed::{Bed, Relay};
use common::view::{consumer_view_by, events, json, pods_by, version};
use watchrelay::producer::{Producer, Record};
use watchrelay::testing::{Memory, Order};
use watchrelay_sim::objects;

const NAMESPACES: [&str; 2] = ["a", "b"];

fn pod(bed: &Bed, ns: &str, name: &str) {
    bed.sim
        .create("pods", Some(ns), objects::pod(ns, name))
        .unwrap();
}

fn touch(bed: &Bed, ns: &str, name: &str, n: u32) {
    bed.sim
        .merge_patch(
            "pods",
            Some(ns),
            name,
            serde_json::json!({"metadata": {"labels": {"n": n.to_string()}}}),
        )
        .unwrap();
}

/// The cluster's pods in scope, as `key -> uid@resourceVersion`.
fn cluster(bed: &Bed) -> BTreeMap<String, String> {
    let in_scope: Vec<&str> = NAMESPACES
        .into_iter()
        .filter(|ns| {
            bed.sim
                .get("namespaces", None, ns)
                .is_some_and(|n| n["metadata"]["labels"]["relay"].as_str() == Some("yes"))
        })
        .collect();
    pods_by(&bed.sim, &in_scope, |_| true, version)
}

async fn converged(bed: &Bed, producer: &Memory) {
    common::bed::eventually(
        || consumer_view_by(&events(producer), version) == cluster(bed),
        || {
            format!(
                "the consumer never held the cluster's pods\nconsumer {:?}\ncluster  {:?}",
                consumer_view_by(&events(producer), version),
                cluster(bed)
            )
        },
    )
    .await;
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (scripts/test.sh sets it)"))
}

/// `key,uid,resource_version` lines as `key -> uid@rv`.
fn rows(out: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8(out.to_vec())
        .unwrap()
        .lines()
        .map(|line| {
            let cols: Vec<&str> = line.split(',').map(|c| c.trim_matches('"')).collect();
            (cols[0].to_string(), format!("{}@{}", cols[1], cols[2]))
        })
        .collect()
}

fn run(what: &str, cmd: &mut std::process::Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out.stdout
}

/// The live rows of the ClickHouse recipe's table over `records`, as `key -> uid@rv`, the table
/// ordered by `by` (`version` or `resourceVersion`).
fn clickhouse(records: &[Record], by: &str) -> BTreeMap<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("records.jsonl");
    let mut lines = String::new();
    for r in records {
        let value = (!r.tombstone).then(|| String::from_utf8(r.value.clone()).unwrap());
        lines.push_str(&serde_json::json!({"key": r.key, "value": value}).to_string());
        lines.push('\n');
    }
    std::fs::write(&file, lines).unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    rows(&run(
        "chDB",
        std::process::Command::new(env("WATCHRELAY_TABLES_PYTHON"))
            .arg(format!("{root}/tests/tables/clickhouse.py"))
            .arg(format!("{root}/recipes/clickhouse/pods.sql"))
            .arg(&file)
            .arg(by),
    ))
}

/// The live rows of the DuckDB recipe's `pods_as_of(as_of)` (`now`: `pods`) over a dump of
/// `records` as `kcat -J` writes one, ordered by `by`, as `key -> uid@rv`.
fn duckdb(records: &[Record], as_of: &str, by: &str) -> BTreeMap<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pods.jsonl");
    let mut lines = String::new();
    for r in records {
        let payload = (!r.tombstone).then(|| String::from_utf8(r.value.clone()).unwrap());
        lines.push_str(&serde_json::json!({"key": r.key, "payload": payload}).to_string());
        lines.push('\n');
    }
    std::fs::write(&file, lines).unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    rows(&run(
        "DuckDB",
        std::process::Command::new(env("WATCHRELAY_TABLES_PYTHON"))
            .arg(format!("{root}/tests/tables/duckdb_recipe.py"))
            .arg(format!("{root}/recipes/duckdb/pods.sql"))
            .arg(&file)
            .arg(as_of)
            .arg(by),
    ))
}

/// The live rows of the Flink recipe's `view` reading `topic` (`by`: the column the
/// highest-version view orders by), as `key -> uid@rv`.
fn flink(topic: &str, view: &str, by: &str) -> BTreeMap<String, String> {
    let root = env!("CARGO_MANIFEST_DIR");
    rows(&run(
        "Flink",
        std::process::Command::new("java")
            // C1 only and the serial collector: half the CPU of the defaults for a short job.
            .args([
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-Xmx1g",
                "-cp",
            ])
            .arg(env("WATCHRELAY_FLINK_CLASSPATH"))
            .arg("FlinkRecipe")
            .arg(format!("{root}/recipes/flink/pods.sql"))
            .arg(env("KAFKA_BOOTSTRAP_SERVERS"))
            .arg(topic)
            .arg(view)
            .arg(by),
    ))
}

/// How many records of `topic` Apicurio's JSON Schema deserializer decoded (it fails on any
/// record it cannot decode or that does not validate against its schema).
fn decoded(topic: &str) -> usize {
    let out = run(
        "the registry's deserializer",
        std::process::Command::new("java")
            .arg("-cp")
            .arg(env("WATCHRELAY_DECODER_CLASSPATH"))
            .arg("watchrelay.Decode")
            .arg(env("KAFKA_BOOTSTRAP_SERVERS"))
            .arg(topic)
            .arg(env("WATCHRELAY_REGISTRY_URL")),
    );
    let out = String::from_utf8(out).unwrap();
    out.trim()
        .strip_prefix("decoded ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the deserializer said {out:?}"))
}

/// Writes `records` to a new one-partition topic of the broker, in order, with their headers,
/// in a committed transaction, as `delivery: exactlyOnce` does; then, in a transaction it
/// aborts, a DELETED of every object that a later version than its last record's carries (what
/// a relay whose transaction was aborted may have written). A reader that reads committed, as
/// the recipes do, never sees those. Its name.
fn publish(records: &[Record]) -> String {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
    let topic = format!(
        "tables-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", env("KAFKA_BOOTSTRAP_SERVERS"))
        .set("transactional.id", &topic)
        .create()
        .unwrap();
    let timeout = std::time::Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();
    let send = |key: &str, value: Option<&[u8]>, headers: OwnedHeaders| {
        let mut record = BaseRecord::<str, [u8]>::to(&topic)
            .key(key)
            .partition(0)
            .headers(headers);
        if let Some(value) = value {
            record = record.payload(value);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    };
    producer.begin_transaction().unwrap();
    for r in records {
        let mut headers = OwnedHeaders::new();
        for (key, value) in r.headers.iter() {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        send(&r.key, (!r.tombstone).then_some(&r.value[..]), headers);
    }
    producer.commit_transaction(timeout).unwrap();
    let mut last = BTreeMap::new();
    for r in records.iter().filter(|r| !r.tombstone) {
        if let Ok(serde_json::Value::Object(v)) = serde_json::from_slice(&r.value) {
            last.insert(&r.key, v);
        }
    }
    producer.begin_transaction().unwrap();
    for (key, mut v) in last {
        let Some(later) = v
            .get("watchrelay")
            .and_then(|w| w["version"].as_str())
            .and_then(|n| n.parse::<u128>().ok())
            .map(|n| (n + 1).to_string())
        else {
            continue;
        };
        v["watchrelay"]["version"] = later.into();
        v.insert("type".into(), "DELETED".into());
        let value = serde_json::to_vec(&v).unwrap();
        send(key, Some(&value), OwnedHeaders::new());
    }
    producer.flush(timeout).unwrap();
    producer.abort_transaction(timeout).unwrap();
    topic
}

/// A simulator whose namespaces are all labelled in scope, with `pods` pods each.
async fn labelled(pods: u32) -> Bed {
    let bed = Bed::in_memory(watchrelay_sim::SimConfig::default(), &NAMESPACES).await;
    for ns in NAMESPACES {
        bed.label(ns, true);
        for i in 0..pods {
            pod(&bed, ns, &format!("p{i}"));
        }
    }
    bed
}

/// The pods of the labelled namespaces to topic `pods`, with tombstones, their schema in the
/// registry; `registry` adds settings under `schemaRegistry`.
fn registered(bed: &Bed, registry: &str) -> watchrelay::config::Config {
    bed.config_with(
        "  - operationId: watchNamespacedPods\n    namespaceSelector: relay=yes\n    topic: pods\n    tombstones: true\n",
        "",
        &format!(
            "schemaRegistry:\n  url: {}/apis/ccompat/v7\n{registry}",
            env("WATCHRELAY_REGISTRY_URL")
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engines_table_holds_exactly_the_clusters_pods_after_chaos() {
    let bed = labelled(6).await;
    let producer = Arc::new(Memory::new());
    let cfg = registered(&bed, "");
    let start = || Relay::start_with(&bed, cfg.clone(), Some(producer.clone()));
    let relay = start();
    relay.wait_up(2).await;
    for n in 0..3 {
        touch(&bed, "a", "p0", n);
    }
    // A same-name recreate.
    bed.sim.delete("pods", Some("a"), "p1").unwrap();
    pod(&bed, "a", "p1");
    converged(&bed, &producer).await;

    // A crash mid-churn: Kafka wrote half of what was sent.
    producer.hold(true);
    touch(&bed, "a", "p2", 1);
    touch(&bed, "b", "p2", 1);
    bed.sim.delete("pods", Some("b"), "p3").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let written = producer.held() / 2;
    producer.release_first(written, Order::Sent);
    relay.kill().await;
    producer.purge();
    producer.hold(false);

    // While it is down, deletions past the history window: a 410, then inferred DELETEDs.
    bed.sim.delete("pods", Some("a"), "p4").unwrap();
    bed.sim.delete("pods", Some("b"), "p4").unwrap();
    bed.sim.compact();
    let relay = start();
    relay.wait_up(2).await;
    converged(&bed, &producer).await;

    // A namespace leaves the selector: its pods leave the table.
    bed.label("b", false);
    converged(&bed, &producer).await;
    // What the table held then, for a table as of that moment.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let (then, at) = (cluster(&bed), watchrelay::envelope::now_rfc3339());
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;

    // etcd restores, without then with a bumped revision, each undoing changes after its
    // snapshot.
    for bump in [None, Some(1000)] {
        let snapshot = bed.sim.snapshot();
        touch(&bed, "a", "p5", 9);
        bed.sim.delete("pods", Some("a"), "p2").unwrap();
        pod(&bed, "a", "late");
        converged(&bed, &producer).await;
        // The relay wrote its ConfigMap past the snapshot: what tells it a bumped restore.
        bed.wait_pods_covered("watchNamespacedPods.a", "a").await;
        bed.sim.restore(&snapshot, bump);
        converged(&bed, &producer).await;
    }
    relay.stop().await;

    let want = cluster(&bed);
    let records = events(&producer);
    let topic = engines_hold(&records, &want);
    assert_eq!(
        duckdb(&records, &at, "version"),
        then,
        "DuckDB, as of before the restores"
    );
    // Ordered by resourceVersion, each keeps an edit a restore undid.
    assert_ne!(clickhouse(&records, "resourceVersion"), want, "ClickHouse");
    assert_ne!(duckdb(&records, "now", "resourceVersion"), want, "DuckDB");
    assert_ne!(
        flink(&topic, "pods_latest", "resourceVersion"),
        want,
        "Flink"
    );
}

/// Each engine's table over `records` holds exactly `want` (`key -> uid@rv`), and every record
/// decodes through the registry; the topic the records were written to.
fn engines_hold(records: &[Record], want: &BTreeMap<String, String>) -> String {
    assert_eq!(&clickhouse(records, "version"), want, "ClickHouse");
    assert_eq!(&duckdb(records, "now", "version"), want, "DuckDB");
    let topic = publish(records);
    assert_eq!(
        &flink(&topic, "pods", "version"),
        want,
        "Flink upsert-kafka"
    );
    assert_eq!(
        &flink(&topic, "pods_latest", "version"),
        want,
        "Flink, each key's highest watchrelay.version"
    );
    let values = records.iter().filter(|r| !r.tombstone).count();
    assert!(records
        .iter()
        .filter(|r| !r.tombstone)
        .all(|r| r.headers.get_bytes("apicurio.value.contentId").is_some()));
    assert_eq!(decoded(&topic), values, "every record decodes");
    topic
}

/// The recipes read records in Confluent's framing (`schemaRegistry.wireFormat: confluent`,
/// which the tables page recommends with a Confluent Schema Registry): ClickHouse and DuckDB as
/// they read plain JSON, Flink through its view of raw values; their tables hold exactly the
/// cluster's pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recipes_read_records_in_confluent_framing() {
    let bed = labelled(4).await;
    let producer = Arc::new(Memory::new());
    let cfg = registered(&bed, "  wireFormat: confluent\n");
    let relay = Relay::start_with(&bed, cfg, Some(producer.clone()));
    relay.wait_up(2).await;
    touch(&bed, "a", "p0", 1);
    bed.sim.delete("pods", Some("b"), "p1").unwrap();
    bed.label("b", false);
    converged(&bed, &producer).await;
    relay.stop().await;
    let mut records = events(&producer);
    assert!(
        records
            .iter()
            .filter(|r| !r.tombstone)
            .all(|r| r.value.first() == Some(&0)),
        "every record in Confluent's framing"
    );
    // A DELETED without the prefix, as a retraction from a topic its channel left is written
    // (it has no schema id): read whole, it still deletes.
    let last = |i: usize, records: &[Record]| {
        records[i + 1..]
            .iter()
            .all(|r| r.tombstone || r.key != records[i].key)
    };
    let deleted = (0..records.len())
        .rev()
        .find(|&i| {
            !records[i].tombstone && json(&records[i])["type"] == "DELETED" && last(i, &records)
        })
        .expect("a key whose last record is a DELETED");
    records[deleted].value.drain(..5);
    let want = cluster(&bed);
    assert_eq!(clickhouse(&records, "version"), want, "ClickHouse");
    assert_eq!(duckdb(&records, "now", "version"), want, "DuckDB");
    let topic = publish(&records);
    assert_eq!(
        flink(&topic, "pods_framed_latest", "version"),
        want,
        "Flink, over raw values"
    );
}

/// The same engines over a sharded release: two replicas over two namespaces of different
/// shards. The second joins mid-churn and takes a shard over while the first's records stall
/// (those of the moved shard are purged at the handover, never landing after the new owner's);
/// same-name recreates on both sides of the handover; then the first is killed (kill -9) and,
/// a pod of its namespace deleted and the history compacted meanwhile, the second takes its
/// shard over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engines_table_holds_exactly_the_clusters_pods_across_a_handover() {
    use common::bed::{shard_of, sharded};
    use watchrelay::testing::{Lane, MemoryGroup};
    let in_shard = |k| {
        (0..)
            .map(|i| format!("team-{i}"))
            .find(|ns| shard_of(2, ns) == k)
            .unwrap()
    };
    let (n0, n1) = (in_shard(0), in_shard(1));
    let bed = Bed::in_memory_serving(true, &[&n0, &n1]).await;
    for ns in [&n0, &n1] {
        for i in 0..4 {
            pod(&bed, ns, &format!("p{i}"));
        }
    }
    let cfg = sharded(
        bed.config_with(
            &format!("  - operationId: watchNamespacedPods\n    namespaces: [{n0}, {n1}]\n    topic: pods\n    tombstones: true\n"),
            "",
            &format!(
                "schemaRegistry:\n  url: {}/apis/ccompat/v7\n",
                env("WATCHRELAY_REGISTRY_URL")
            ),
        ),
        2,
    );
    let memory = Arc::new(Memory::new());
    let group = MemoryGroup::default();
    let cluster = || pods_by(&bed.sim, &[&n0, &n1], |_| true, version);
    let converged = || async {
        common::bed::eventually(
            || consumer_view_by(&events(&memory), version) == cluster(),
            || "the consumer never held the cluster's pods".to_string(),
        )
        .await
    };
    let lane_a = Lane::new(memory.clone());
    let a = Relay::start_on_lane(&bed, cfg.clone(), lane_a.clone(), &group);
    converged().await;
    // A same-name recreate under the first owner.
    bed.sim.delete("pods", Some(&n1), "p1").unwrap();
    pod(&bed, &n1, "p1");
    converged().await;

    // The first replica's records stall; changes on both shards queue behind them.
    lane_a.hold_to(Some("pods"));
    touch(&bed, &n0, "p0", 1);
    touch(&bed, &n1, "p0", 1);
    bed.sim.delete("pods", Some(&n1), "p2").unwrap();
    common::bed::eventually(|| lane_a.held() > 0, || "nothing queued".into()).await;
    // The second replica joins and takes a shard over; its changes go on.
    let b = Relay::start_on_lane(&bed, cfg.clone(), Lane::new(memory.clone()), &group);
    common::bed::eventually(
        || {
            touch(&bed, &n1, "p3", 2);
            events(&memory)
                .iter()
                .any(|r| r.headers.get("ce_ownerepoch").is_some_and(|e| e != "1"))
        },
        || "no shard was handed over".into(),
    )
    .await;
    // The shard the second replica took, and the namespace the first kept.
    let taken = events(&memory)
        .iter()
        .find(|r| r.headers.get("ce_ownerepoch").is_some_and(|e| e != "1"))
        .and_then(|r| r.headers.get("ce_shard").map(str::to_string))
        .unwrap();
    let (kept, moved) = if taken == "0" { (&n1, &n0) } else { (&n0, &n1) };
    // A same-name recreate under the new owner.
    bed.sim.delete("pods", Some(moved), "p0").unwrap();
    pod(&bed, moved, "p0");
    lane_a.release();
    converged().await;

    // The first replica crashes; while its shard has no owner, its namespace's pods change and
    // the history is compacted: the next owner resumes past a gap.
    a.kill().await;
    bed.sim.delete("pods", Some(kept), "p3").unwrap();
    touch(&bed, kept, "p2", 3);
    bed.sim.compact();
    converged().await;
    b.stop().await;

    engines_hold(&events(&memory), &cluster());
}
