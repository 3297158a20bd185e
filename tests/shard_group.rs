//! The shard group's client failing beyond repair: a sharded replica whose group client
//! reports a fatal error (a Kafka consumer fenced as a static member) fails `/healthz`, so the
//! platform restarts it, instead of standing in the group owning nothing while it looks healthy.
//! The relay runs in-process against the simulator with the group and producer in memory.

mod common;

use std::sync::Arc;

use common::bed::{eventually, Relay};
use common::stream::{bed, config, create};
use watchrelay::testing::{Memory, MemoryGroup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_error_of_the_shard_groups_client_fails_health() {
    let bed = bed(true).await;
    let producer = Arc::new(Memory::new());
    create(&bed, (0..3).map(|i| format!("p{i}")));
    let cfg = common::bed::sharded(config(&bed, ""), 2);
    let group = MemoryGroup::default();
    let relay = Relay::start_in(&bed, cfg, producer.clone(), &group);
    relay.wait_up(1).await;
    assert!(relay.registry.health().is_ok());
    group.fail_fatally("FencedInstanceId: fenced by another member with the same instance id");
    eventually(
        || {
            relay
                .registry
                .health()
                .is_err_and(|e| e.contains("shard group") && e.contains("FencedInstanceId"))
        },
        || format!("health: {:?}", relay.registry.health()),
    )
    .await;
    relay.stop().await;
}
