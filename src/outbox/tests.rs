//! The outbox alone, with the in-memory producer, on paused time: each test runs in
//! milliseconds whatever the timeouts it crosses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Failure, Limits, Outbox, OutboxError};
use crate::config::KeyTemplate;
use crate::config::OversizePolicy;
use crate::envelope::{Announcement, Route};
use crate::event::EventType;
use crate::event::{Identity, Meta};
use crate::membership::Change;
use crate::membership::{Members, Owner};
use crate::metrics::Metrics;
use crate::producer::Producer;
use crate::testing::{Memory, Order};

const MEMBERSHIP: &str = "watchrelay.test.membership";

fn route() -> Arc<Route> {
    Arc::new(Route {
        topic: "test.pods".into(),
        key: KeyTemplate::default(),
        dataschema: "#/components/schemas/WatchEvent".into(),
        source: "/clusters/test/api/v1/namespaces/shop/pods".into(),
        channel: "/api/v1/namespaces/{namespace}/pods".into(),
        operation_id: "watchNamespacedPods".into(),
        message: "WatchEvent".into(),
        cluster: "test".into(),
        namespace: Some("shop".into()),
        owner: None,
        schema: None,
        rendered: Default::default(),
    })
}

struct Bed {
    producer: Arc<Memory>,
    outbox: Outbox,
    metrics: Metrics,
}

const STREAM: &str = "watchNamespacedPods.shop";

/// An outbox over a fresh in-memory producer; `tweak` sets its limits.
fn bed(tweak: impl FnOnce(&mut Limits)) -> Bed {
    let mut limits = Limits {
        max_in_flight: 100,
        max_message_bytes: 1_000_000,
        oversize: OversizePolicy::Trim,
        dead_letter_topic: None,
        tombstones: false,
        membership_topic: None,
        owner: Owner::new("watchrelay", "watchrelay-checkpoints"),
    };
    tweak(&mut limits);
    let producer = Arc::new(Memory::new());
    let metrics = Metrics::new();
    let outbox = Outbox::new(
        STREAM,
        route(),
        producer.clone() as Arc<dyn Producer>,
        limits,
        None,
        Members::default(),
        &metrics,
        CancellationToken::new(),
    );
    Bed {
        producer,
        outbox,
        metrics,
    }
}

fn meta(name: &str, rv: u64) -> Meta {
    let uid = format!(
        "00000000-0000-4000-8000-{:012x}",
        name.bytes().fold(0u64, |h, b| h * 131 + u64::from(b))
    );
    Meta::new(Identity {
        kind: "Pod",
        api_version: "v1",
        name,
        namespace: Some("shop"),
        uid: &uid,
        resource_version: &rv.to_string(),
    })
}

fn object(m: &Meta, padding: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": m.name(), "namespace": m.namespace(), "uid": m.uid(), "resourceVersion": m.resource_version()},
        "spec": {"padding": "x".repeat(padding)}
    }))
    .unwrap()
}

impl Bed {
    /// Hands over `event_type` of `m` with `m`'s resourceVersion as the position.
    async fn send(
        &mut self,
        event_type: EventType,
        m: Meta,
        padding: usize,
    ) -> Result<(), OutboxError> {
        let change = match event_type {
            EventType::Deleted => Change::Leave {
                uid: m.uid().to_string(),
            },
            _ => Change::Announced,
        };
        let obj = object(&m, padding);
        let position = Some(m.resource_version().to_string());
        let a = Announcement::change(event_type, m, false);
        self.outbox
            .send(a, &obj, Instant::now(), position, Some(change))
            .await
    }

    /// Settles every report ready now; the first error ends it.
    async fn settle_ready(&mut self) -> Result<usize, OutboxError> {
        let mut n = 0;
        while let Ok(report) = tokio::time::timeout(Duration::ZERO, self.outbox.report()).await {
            self.outbox.settle(report).await?;
            n += 1;
        }
        Ok(n)
    }

    /// The producer delivered an object's join, two records of it, then its membership
    /// tombstone.
    fn assert_joined_announced_left(&self) {
        let log = self.log();
        let topics: Vec<&str> = log.iter().map(|(t, _, _)| t.as_str()).collect();
        assert_eq!(topics, [MEMBERSHIP, "test.pods", "test.pods", MEMBERSHIP]);
        assert!(log[3].2, "the last membership record is a tombstone");
    }

    /// What the producer delivered: (topic, key, whether a tombstone).
    fn log(&self) -> Vec<(String, String, bool)> {
        self.producer
            .log()
            .into_iter()
            .map(|r| (r.topic, r.key, r.tombstone))
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn the_checkpoint_moves_only_over_acknowledged_prefixes() {
    let mut b = bed(|_| {});
    b.producer.hold(true);
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        b.send(EventType::Added, meta(name, 10 + i as u64), 0)
            .await
            .unwrap();
    }
    assert_eq!(b.outbox.in_flight(), 3);
    // Acknowledged last to first: nothing moves until the first is in.
    b.producer.release(Order::Reversed);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let report = b.outbox.report().await;
        b.outbox.settle(report).await.unwrap();
        seen.push(b.outbox.checkpoint().map(str::to_string));
    }
    assert_eq!(seen, [None, None, Some("12".to_string())]);
    assert_eq!(b.outbox.in_flight(), 0);
    assert!(b
        .outbox
        .take_saved()
        .is_some_and(|s| s.rv.as_deref() == Some("12")));
}

#[tokio::test(start_paused = true)]
async fn an_object_joins_before_anything_announcing_it_is_sent_and_leaves_after_its_deleted() {
    let mut b = bed(|l| l.membership_topic = Some(MEMBERSHIP.into()));
    b.producer.hold(true);
    b.send(EventType::Added, meta("a", 10), 0).await.unwrap();
    // Only the join is with the producer; the ADDED waits behind it.
    assert_eq!(b.producer.held(), 1);
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    assert_eq!(
        b.producer.held(),
        1,
        "the ADDED goes once its join is acknowledged"
    );
    assert!(b.outbox.members().contains(meta("a", 10).uid()));
    assert_eq!(b.outbox.checkpoint(), None);
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    assert_eq!(b.outbox.checkpoint(), Some("10"));

    // A member's DELETED: it leaves once the DELETED is acknowledged, then its membership
    // tombstone goes.
    b.send(EventType::Deleted, meta("a", 11), 0).await.unwrap();
    assert!(b.outbox.members().contains(meta("a", 10).uid()));
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    assert!(!b.outbox.members().contains(meta("a", 10).uid()));
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    b.assert_joined_announced_left();
    assert_eq!(b.outbox.checkpoint(), Some("11"));
}

#[tokio::test(start_paused = true)]
async fn in_a_transaction_nothing_waits_for_a_join_and_a_deleted_reported_first_still_leaves() {
    let mut b = bed(|l| l.membership_topic = Some(MEMBERSHIP.into()));
    b.producer.transactional(true);
    b.producer.hold(true);
    b.send(EventType::Added, meta("a", 10), 0).await.unwrap();
    assert_eq!(b.producer.held(), 2, "the join and the ADDED, at once");
    b.send(EventType::Deleted, meta("a", 11), 0).await.unwrap();
    assert_eq!(b.producer.held(), 3);
    // One transaction's reports, the DELETED's first.
    b.producer.release(Order::Reversed);
    b.settle_ready().await.unwrap();
    assert!(!b.outbox.members().contains(meta("a", 10).uid()));
    assert_eq!(b.outbox.checkpoint(), Some("11"));
    assert_eq!(b.producer.held(), 1, "its tombstone, once its join is in");
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    b.assert_joined_announced_left();
}

#[tokio::test(start_paused = true)]
async fn a_deleted_is_followed_by_its_tombstone_and_the_checkpoint_waits_for_both() {
    let mut b = bed(|l| l.tombstones = true);
    b.producer.hold(true);
    b.send(EventType::Deleted, meta("a", 20), 0).await.unwrap();
    assert_eq!(b.producer.held(), 2);
    b.producer.release_first(1, Order::Sent);
    b.settle_ready().await.unwrap();
    assert_eq!(
        b.outbox.checkpoint(),
        None,
        "the tombstone is not acknowledged yet"
    );
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    assert_eq!(b.outbox.checkpoint(), Some("20"));
    let log = b.log();
    assert_eq!(log.len(), 2);
    assert_eq!((log[0].1.as_str(), log[0].2), ("shop/a", false));
    assert_eq!((log[1].1.as_str(), log[1].2), ("shop/a", true));
}

#[tokio::test(start_paused = true)]
async fn a_record_refused_for_size_at_send_is_replaced_by_its_reference_in_its_place() {
    let mut b = bed(|_| {});
    b.producer.refuse_larger_than(4_000, false);
    b.send(EventType::Added, meta("a", 30), 0).await.unwrap();
    b.send(EventType::Modified, meta("a", 31), 10_000)
        .await
        .unwrap();
    b.send(EventType::Modified, meta("a", 32), 0).await.unwrap();
    b.settle_ready().await.unwrap();
    assert_eq!(b.outbox.checkpoint(), Some("32"));
    let log = b.producer.log();
    assert_eq!(log.len(), 3, "every event keeps its place");
    assert!(log[1].value.len() < 4_000);
    let reference: serde_json::Value = serde_json::from_slice(&log[1].value).unwrap();
    assert_eq!(reference["object"]["metadata"]["resourceVersion"], "31");
}

#[tokio::test(start_paused = true)]
async fn a_batch_refused_for_size_replays_one_record_at_a_time_from_the_checkpoint() {
    let mut b = bed(|_| {});
    b.producer.refuse_larger_than(4_000, true);
    b.producer.hold(true);
    b.send(EventType::Added, meta("a", 40), 0).await.unwrap();
    b.send(EventType::Modified, meta("a", 41), 10_000)
        .await
        .unwrap();
    b.producer.release(Order::Sent);
    // The first is in; the second comes back refused, and may have been only the victim of
    // its batch: replay from the checkpoint, one at a time.
    let failed = b.settle_ready().await;
    assert_eq!(
        failed,
        Err(OutboxError::Failed {
            failure: Failure::BatchTooLarge,
            checkpoint: Some("40".into())
        })
    );
    b.send(EventType::Modified, meta("a", 41), 10_000)
        .await
        .unwrap();
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    // Alone, it is refused for itself: its reference goes in its place.
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    assert_eq!(b.outbox.checkpoint(), Some("41"));
    let log = b.producer.log();
    assert_eq!(log.len(), 2);
    assert!(log[1].value.len() < 4_000);
}

#[tokio::test(start_paused = true)]
async fn a_failed_delivery_rewinds_and_late_reports_of_what_was_forgotten_are_ignored() {
    let mut b = bed(|_| {});
    b.producer.hold(true);
    b.send(EventType::Added, meta("a", 50), 0).await.unwrap();
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    b.send(EventType::Added, meta("b", 51), 0).await.unwrap();
    b.send(EventType::Added, meta("c", 52), 0).await.unwrap();
    b.producer.fail_next(1);
    b.producer.release_first(1, Order::Sent);
    let failed = b.settle_ready().await;
    assert!(
        matches!(&failed, Err(OutboxError::Failed { failure: Failure::Produce(_), checkpoint }) if checkpoint.as_deref() == Some("50")),
        "{failed:?}"
    );
    let errors = |class: &str| {
        b.metrics
            .delivery_errors
            .with_label_values(&[STREAM, "delivery", class])
            .get()
    };
    assert_eq!((errors("retriable"), errors("permanent")), (1, 0));
    assert_eq!(b.outbox.in_flight(), 0);
    // The third's report arrives after the rewind: it moves nothing.
    b.producer.release(Order::Sent);
    b.settle_ready().await.unwrap();
    assert_eq!(b.outbox.checkpoint(), Some("50"));
}

#[tokio::test(start_paused = true)]
async fn a_drain_waits_until_its_deadline_and_says_what_stays_unacknowledged() {
    let mut b = bed(|_| {});
    b.producer.hold(true);
    b.send(EventType::Added, meta("a", 60), 0).await.unwrap();
    b.send(EventType::Added, meta("b", 61), 0).await.unwrap();
    b.producer.release_first(1, Order::Sent);
    let started = tokio::time::Instant::now();
    let left = b.outbox.drain(started + Duration::from_secs(30)).await;
    assert_eq!(left, 1);
    assert_eq!(b.outbox.checkpoint(), Some("60"));
    assert!(
        started.elapsed() >= Duration::from_secs(30),
        "it waited the whole budget"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_producer_queue_is_offered_the_record_again_ever_more_slowly() {
    let mut b = bed(|_| {});
    b.producer.hold(true);
    b.producer.capacity(1);
    b.send(EventType::Added, meta("a", 60), 0).await.unwrap();
    let waiting = tokio::time::timeout(
        Duration::from_secs(1),
        b.send(EventType::Added, meta("b", 61), 0),
    )
    .await;
    assert!(waiting.is_err(), "the queue stayed full");
    // 5, 10, 20, 40, 80, then every 100 ms: about 14 offers in a second, not 200.
    let offers = b.producer.refused_full();
    assert!((5..=20).contains(&offers), "{offers} offers in a second");
}
