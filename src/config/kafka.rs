//! The librdkafka mapping of the `kafka` settings: the relay's defaults under the user's
//! properties, and the offline check of each property.

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;

use super::KafkaConfig;

/// Whether the Kafka client knows `key` and accepts `value` for it, offline. The error names
/// what is wrong and never contains the value (it may be a secret from the environment).
pub(crate) fn check_property(key: &str, value: &str) -> Result<(), String> {
    let mut c = ClientConfig::new();
    c.set(key, value);
    match c.create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(_, message, _, _)) => Err(redact(&message, value)),
        Err(e) => Err(redact(&e.to_string(), value)),
    }
}

/// `message` with every occurrence of `secret` masked.
pub(crate) fn redact(message: &str, secret: &str) -> String {
    if secret.is_empty() {
        message.to_string()
    } else {
        message.replace(secret, "<redacted>")
    }
}

impl KafkaConfig {
    /// The producer settings the relay relies on; `kafka.properties` may override any of them.
    pub fn client_config(&self) -> ClientConfig {
        config_of(settings(self))
    }

    /// The value of producer setting `key`: the user's, else the relay's default.
    pub fn producer_setting(&self, key: &str) -> Option<&str> {
        settings(self)
            .filter(|(k, _)| *k == key)
            .last()
            .map(|(_, v)| v)
    }

    /// The connection settings (`bootstrap.servers`, security) without the producer's own: for
    /// the admin client and the consumer reading the membership topic. Built from the settings,
    /// not copied from a producer's [`ClientConfig`], whose `config_map` masks secrets such as
    /// `sasl.password`.
    pub fn connection_config(&self) -> ClientConfig {
        config_of(settings(self).filter(|(k, _)| !PRODUCER_ONLY.contains(k)))
    }
}

fn config_of<'a>(settings: impl Iterator<Item = (&'a str, &'a str)>) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in settings {
        c.set(k, v);
    }
    c
}

/// The relay's defaults, then `kafka.properties` (a later setting wins).
fn settings(cfg: &KafkaConfig) -> impl Iterator<Item = (&str, &str)> {
    [
        ("bootstrap.servers", cfg.bootstrap_servers.as_str()),
        ("enable.idempotence", "true"),
        ("acks", "all"),
        ("compression.type", "lz4"),
        ("linger.ms", "5"),
        // A record is retried until delivered; outages become backpressure, not loss. Shutdown
        // bounds the wait separately with shutdownTimeoutSeconds.
        ("message.timeout.ms", "0"),
        ("queue.buffering.max.messages", "200000"),
        ("queue.buffering.max.kbytes", "262144"),
        ("client.id", "watchrelay"),
        // A metadata request for a missing topic must never create it with the broker's
        // defaults (`auto.create.topics.enable`, on in a stock Kafka): the membership topic
        // would not be compacted, a channel topic would get the default partition count. The
        // relay creates what it needs itself; this holds for the admin and consumer clients
        // too, which share these settings.
        ("allow.auto.create.topics", "false"),
    ]
    .into_iter()
    .chain(cfg.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// Producer-only settings left out of the admin and consumer clients.
const PRODUCER_ONLY: &[&str] = &[
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "compression.type",
    "compression.codec",
    "linger.ms",
    "queue.buffering.max.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "message.send.max.retries",
    "retries",
    "batch.num.messages",
    "batch.size",
    "partitioner",
];

#[cfg(test)]
mod tests {
    #[test]
    fn the_connection_keeps_secrets_and_leaves_the_producers_settings_out() {
        let cfg = crate::config::Config::parse(
            "clusterName: t\nkafka:\n  bootstrapServers: b:9092\n  oversize: trim\n  properties:\n    sasl.password: s3cret\n    linger.ms: \"20\"\ncheckpoint:\n  namespace: w\nchannels:\n  - operationId: watchNodes\n",
        )
        .unwrap();
        let connection = cfg.kafka.connection_config();
        assert_eq!(connection.get("sasl.password"), Some("s3cret"));
        assert_eq!(connection.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(connection.get("allow.auto.create.topics"), Some("false"));
        assert_eq!(connection.get("linger.ms"), None);
        let producer = cfg.kafka.client_config();
        assert_eq!(producer.get("linger.ms"), Some("20"));
        assert_eq!(producer.get("sasl.password"), Some("s3cret"));
    }
}
