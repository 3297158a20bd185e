-- A table of the cluster's pods in ClickHouse, fed by a watchrelay topic.
--
-- Each key keeps the row of its highest watchrelay.version, which never goes back on a key
-- (etcd restores included); a DELETED, real or inferred, is that row with is_deleted = 1,
-- so `SELECT ... FROM pods FINAL` (or after merges, without FINAL) holds exactly the live
-- pods. Markers (BOOKMARK) and tombstones are skipped. Copy it, and change the broker, the
-- topic (`{cluster}.pods` by default, `{cluster}` the `clusterName`), the group and the table
-- names.

CREATE TABLE pods
(
    key String,
    namespace String,
    name String,
    uid String,
    resource_version String,
    version UInt128,
    is_deleted UInt8,
    object String,
    observed_at String
)
ENGINE = ReplacingMergeTree(version, is_deleted)
ORDER BY key;

-- The topic, read by ClickHouse's Kafka engine: each record's value as it is (plain JSON, or
-- JSON behind Confluent's 5-byte prefix with `schemaRegistry.wireFormat: confluent`), its key
-- as the virtual column _key. The engine's client (librdkafka) reads committed records only
-- by default, which `delivery: exactlyOnce` needs: keep `<kafka><isolation_level>` unset or
-- `read_committed` in the server's configuration.
CREATE TABLE pods_queue (raw String)
ENGINE = Kafka
SETTINGS kafka_broker_list = 'kafka:9092',
         kafka_topic_list = 'prod-eu-1.pods',
         kafka_group_name = 'clickhouse-pods',
         kafka_format = 'RawBLOB';

CREATE MATERIALIZED VIEW pods_mv TO pods AS
WITH if(startsWith(raw, unhex('00')), substring(raw, 6), raw) AS value
SELECT
    _key AS key,
    JSONExtractString(value, 'object', 'metadata', 'namespace') AS namespace,
    JSONExtractString(value, 'object', 'metadata', 'name') AS name,
    JSONExtractString(value, 'object', 'metadata', 'uid') AS uid,
    JSONExtractString(value, 'object', 'metadata', 'resourceVersion') AS resource_version,
    toUInt128(JSONExtractString(value, 'watchrelay', 'version')) AS version,
    JSONExtractString(value, 'type') = 'DELETED' AS is_deleted,
    JSONExtractRaw(value, 'object') AS object,
    JSONExtractString(value, 'watchrelay', 'observedAt') AS observed_at
FROM pods_queue
WHERE JSONExtractString(value, 'type') IN ('ADDED', 'MODIFIED', 'DELETED');
