//! What a [`Transactional`](super::Transactional) producer drives: instances of a producer
//! under its `transactional.id` ([`Client`]), each built by a [`Connect`], which also reads a
//! settled transaction's outcome back. Kafka's are librdkafka's ([`KafkaConnect`]); the test
//! doubles keep transactions in memory (`testing::Transactions`).

use std::sync::Arc;
use std::time::Duration;

use super::books::Witness;
use crate::config::KafkaConfig;
use crate::producer::kafka::{TxnError, Unread};
use crate::producer::{Kafka, Producer};

/// One instance (one epoch) of a producer under a transactional id: its records go into the
/// open transaction. Each call blocks.
pub(crate) trait Client: Producer {
    /// Fences every earlier instance under the id and settles what it left open (committed if
    /// its commit had reached the coordinator, else aborted).
    fn init_transactions(&self, timeout: Duration) -> Result<(), TxnError>;
    fn begin_transaction(&self) -> Result<(), TxnError>;
    /// Waits for every record handed over to be acknowledged, then commits.
    fn commit_transaction(&self, timeout: Duration) -> Result<(), TxnError>;
    fn abort_transaction(&self, timeout: Duration) -> Result<(), TxnError>;
}

/// Where a transactional producer's instances come from, and how it learns a settled
/// transaction's outcome.
pub(crate) trait Connect: Send + Sync {
    /// A new instance under the id, not yet initialized; its reports are served on the current
    /// runtime. The error never contains a property's value.
    fn client(&self) -> Result<Arc<dyn Client>, String>;

    /// Whether the record written at `witness` committed, once its transaction is settled (see
    /// [`crate::producer::kafka::committed_at`]); blocks up to `timeout`.
    fn committed_at(&self, witness: &Witness, timeout: Duration) -> Result<bool, Unread>;

    /// How long a commit may wait for its records, and then its request, before its outcome is
    /// learnt from a new instance: less than the client's own timeout of the commit's request,
    /// after which it would send it again.
    fn commit_timeout(&self) -> Duration;

    /// What the records waiting for the next transaction may take, in bytes, while one is
    /// committed: an instance's own queue bound (`queue.buffering.max.kbytes`).
    fn queue_bytes(&self) -> usize;
}

/// The least of a replica's producer queue bounds a shard's transactional producer is given
/// (a replica bound under it is given whole): in KiB (and twice `kafka.maxMessageBytes`), and
/// in records.
const QUEUE_KBYTES_MIN: usize = 1024;
const QUEUE_MESSAGES_MIN: usize = 1000;

/// What connects a transactional id.
pub(crate) type ConnectId = dyn Fn(&str) -> Arc<dyn Connect> + Send + Sync;

/// How a term's transactional producers connect, given their id: Kafka's, or a test double's.
#[derive(Clone)]
pub struct TxnSource(pub(crate) Arc<ConnectId>);

impl std::fmt::Debug for TxnSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TxnSource")
    }
}

impl Client for Kafka {
    fn init_transactions(&self, timeout: Duration) -> Result<(), TxnError> {
        Kafka::init_transactions(self, timeout)
    }

    fn begin_transaction(&self) -> Result<(), TxnError> {
        Kafka::begin_transaction(self)
    }

    fn commit_transaction(&self, timeout: Duration) -> Result<(), TxnError> {
        Kafka::commit_transaction(self, timeout)
    }

    fn abort_transaction(&self, timeout: Duration) -> Result<(), TxnError> {
        Kafka::abort_transaction(self, timeout)
    }
}

/// librdkafka producers with a `transactional.id`, and `read_committed` readers of outcomes.
pub(crate) struct KafkaConnect {
    cfg: KafkaConfig,
    commit_timeout: Duration,
    queue_bytes: usize,
}

impl KafkaConnect {
    /// `cfg` with the transactional settings for `id`: the id, a delivery timeout within the
    /// transaction's (librdkafka refuses one above it), and a `shares`th of the producer's
    /// queue bounds (`queue.buffering.max.kbytes` and `.messages`), so that the `shares`
    /// producers a replica may run (one a shard) hold together what its one producer would.
    pub(crate) fn new(cfg: &KafkaConfig, id: &str, shares: u32) -> Self {
        let share = |key: &str, floor: usize| {
            let replica = cfg
                .producer_setting(key)
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(floor);
            (replica / shares.max(1) as usize).max(floor.min(replica))
        };
        // librdkafka never takes a record larger than its whole queue.
        let largest = (2 * cfg.max_message_bytes).div_ceil(1024);
        let kbytes = share("queue.buffering.max.kbytes", QUEUE_KBYTES_MIN.max(largest));
        let messages = share("queue.buffering.max.messages", QUEUE_MESSAGES_MIN);
        let mut cfg = cfg.clone();
        let p = &mut cfg.properties;
        p.insert("queue.buffering.max.kbytes".into(), kbytes.to_string());
        p.insert("queue.buffering.max.messages".into(), messages.to_string());
        p.insert("transactional.id".into(), id.into());
        let timeout = p
            .entry("transaction.timeout.ms".into())
            .or_insert_with(|| "60000".into())
            .clone();
        p.insert("message.timeout.ms".into(), timeout);
        let commit_timeout = commit_timeout(&cfg);
        Self {
            cfg,
            commit_timeout,
            queue_bytes: kbytes * 1024,
        }
    }
}

impl Connect for KafkaConnect {
    fn client(&self) -> Result<Arc<dyn Client>, String> {
        Ok(Kafka::start(&self.cfg)?)
    }

    fn committed_at(&self, w: &Witness, timeout: Duration) -> Result<bool, Unread> {
        crate::producer::kafka::committed_at(&self.cfg, &w.topic, w.partition, w.offset, timeout)
    }

    fn commit_timeout(&self) -> Duration {
        self.commit_timeout
    }

    fn queue_bytes(&self) -> usize {
        self.queue_bytes
    }
}

/// How long a commit may wait for its records, and then its request: [`super::CALL_TIMEOUT`],
/// or less than librdkafka's own timeout of the commit's request (`socket.timeout.ms`), after
/// which it would send the request again.
fn commit_timeout(cfg: &KafkaConfig) -> Duration {
    let socket = cfg
        .properties
        .get("socket.timeout.ms")
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(60), Duration::from_millis);
    super::CALL_TIMEOUT.min(socket / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(properties: &str, shares: u32) -> (String, String, usize) {
        let cfg = crate::config::Config::parse(&format!(
            "clusterName: t\nkafka:\n  bootstrapServers: b:9092\n  oversize: trim\n{properties}checkpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n"
        ))
        .unwrap();
        let connect = KafkaConnect::new(&cfg.kafka, "id", shares);
        let p = &connect.cfg.properties;
        (
            p["queue.buffering.max.kbytes"].clone(),
            p["queue.buffering.max.messages"].clone(),
            connect.queue_bytes(),
        )
    }

    #[test]
    fn a_shards_producer_holds_its_share_of_the_replicas_queue() {
        // The relay's defaults (256 MiB, 200,000 records) over 64 shards, or one producer.
        assert_eq!(bounds("", 64), ("4096".into(), "3125".into(), 4096 * 1024));
        assert_eq!(
            bounds("", 1),
            ("262144".into(), "200000".into(), 262144 * 1024)
        );
        // The user's bounds are the replica's; a share never goes under the floor (twice the
        // largest record, 1,000,000 bytes by default), nor over the whole.
        let set = "  properties:\n    queue.buffering.max.kbytes: \"8192\"\n    queue.buffering.max.messages: \"500\"\n";
        assert_eq!(bounds(set, 64), ("1954".into(), "500".into(), 1954 * 1024));
        // Room for two of the largest records, whatever the share.
        let large = "  maxMessageBytes: 4194304\n";
        assert_eq!(bounds(large, 64).0, "8192");
    }
}
