//! The Kafka sink: one idempotent producer shared by every stream.
//!
//! Sends never wait for their delivery: each record carries its stream's acknowledgement
//! channel and sequence number, and librdkafka's delivery callback reports back, so the
//! producer batches freely while each stream acknowledges in order on its own.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use thiserror::Error;
use tokio::sync::mpsc;

use crate::config::KafkaConfig;
use crate::envelope::Record;

#[derive(Debug, Error)]
pub enum SinkError {
    #[error("cannot create the Kafka producer: {0}")]
    Create(#[source] KafkaError),
}

/// Why a record was not delivered.
#[derive(Debug)]
pub enum DeliveryError {
    /// The broker (or librdkafka) refused the record for its size; never worth a retry. Carries
    /// the value so the stream can send a reference instead.
    TooLarge { value: Vec<u8> },
    /// Anything else librdkafka gave up on after its own retries.
    Failed(String),
}

/// A delivery report for one record of one stream.
#[derive(Debug)]
pub struct Ack {
    pub seq: u64,
    pub sent_at: Instant,
    pub result: Result<(), DeliveryError>,
}

/// Where a delivery report goes.
pub struct Pending {
    pub tx: mpsc::UnboundedSender<Ack>,
    pub seq: u64,
    pub sent_at: Instant,
}

pub struct Context;

impl ClientContext for Context {}

impl ProducerContext for Context {
    type DeliveryOpaque = Box<Pending>;

    fn delivery(&self, result: &DeliveryResult<'_>, p: Box<Pending>) {
        let result = match result {
            Ok(_) => Ok(()),
            Err((e, msg)) if is_too_large(e) => Err(DeliveryError::TooLarge {
                value: msg.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            }),
            Err((e, _)) => Err(DeliveryError::Failed(e.to_string())),
        };
        // The stream may have stopped already; its replay from the checkpoint covers the record.
        let _ = p.tx.send(Ack {
            seq: p.seq,
            sent_at: p.sent_at,
            result,
        });
    }
}

fn is_too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidRecord)
    )
}

/// Result of handing a record to the producer.
#[derive(Debug)]
pub enum SendError {
    /// Refused at once for its size.
    TooLarge,
    Other(KafkaError),
}

#[derive(Clone)]
pub struct Sink {
    producer: ThreadedProducer<Context>,
}

/// The producer settings the relay relies on; `kafka.properties` may override any of them.
pub fn client_config(cfg: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .set("linger.ms", "5")
        // A record is retried until delivered; outages become backpressure, not loss. Shutdown
        // bounds the wait separately with flushTimeoutSeconds.
        .set("message.timeout.ms", "0")
        .set("queue.buffering.max.messages", "200000")
        .set("queue.buffering.max.kbytes", "262144")
        .set("client.id", "watchrelay");
    for (k, v) in &cfg.properties {
        c.set(k, v);
    }
    c
}

impl Sink {
    pub fn new(cfg: &KafkaConfig) -> Result<Self, SinkError> {
        let producer = client_config(cfg)
            .create_with_context(Context)
            .map_err(SinkError::Create)?;
        Ok(Self { producer })
    }

    /// Enqueues a record; waits only while librdkafka's queue is full (backpressure).
    pub async fn send(&self, rec: &Record, pending: Pending) -> Result<(), SendError> {
        let mut headers = OwnedHeaders::new_with_capacity(rec.headers.len());
        for (k, v) in &rec.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_str()),
            });
        }
        let mut record = BaseRecord::with_opaque_to(&rec.topic, Box::new(pending))
            .key(rec.key.as_bytes())
            .payload(&rec.value)
            .headers(headers);
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) if is_too_large(&e) => return Err(SendError::TooLarge),
                Err((e, _)) => return Err(SendError::Other(e)),
            }
        }
    }

    /// Waits for every queued record, up to `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer.flush(timeout)
    }
}
