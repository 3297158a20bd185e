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
}

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
}

impl KafkaConnect {
    /// `cfg` with the transactional settings for `id`: the id, and a delivery timeout within
    /// the transaction's (librdkafka refuses one above it).
    pub(crate) fn new(cfg: &KafkaConfig, id: &str) -> Self {
        let mut cfg = cfg.clone();
        let p = &mut cfg.properties;
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
