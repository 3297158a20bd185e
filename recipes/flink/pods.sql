-- Tables of the cluster's pods in Flink SQL, fed by a watchrelay topic.
--
-- Three ways to read the topic; pick one and drop the others (the third for records in
-- Confluent framing).
--
-- (a) `pods_changelog` is an upsert-kafka table: each record is the new row of its key (the
--     Kafka key, `namespace/name`) and a tombstone deletes it. Since a key's records, in
--     partition order, end in the cluster's state, the view `pods` (ADDED and MODIFIED rows
--     only) holds exactly the live pods, with or without tombstones: a DELETED record leaves
--     a row the view skips, and its tombstone, when the channel writes one, removes it.
--
-- (b) `pods_log` is an append-only kafka table: every record is a row. The view `pods_latest`
--     keeps each key's row of the highest watchrelay.version, which never goes back on a key
--     (etcd restores, resyncs, same-name recreates included), and drops the key if that row is
--     a DELETED: the live pods too, whatever order the records arrive in. Do not order by the
--     resourceVersion instead: after an etcd restore it goes back, and the view would keep an
--     edit the restore undid, or a deleted pod.
--
-- Markers (BOOKMARK records, keyed by their stream) and tombstones are skipped. The version is
-- an unsigned 128-bit integer written as a decimal string; it is read as a STRING and cast to
-- DECIMAL(38, 0), Flink's widest exact number, which holds every version the relay stamps (an
-- era of milliseconds since 1970 times 2^64, plus a resourceVersion); a larger one would fail
-- the query rather than be ranked wrong. Every table reads committed records only
-- ('properties.isolation.level' = 'read_committed'; Kafka's Java consumer reads uncommitted
-- ones by default): with `delivery: exactlyOnce` it never sees a record of an aborted
-- transaction, nor any of an open one; with `atLeastOnce` it changes nothing. Copy this file, and change the broker, the topic
-- (`{cluster}.pods` by default, `{cluster}` the `clusterName`), the group and the names.

-- (a) The topic as an upsert changelog. upsert-kafka always reads from the earliest offset.
CREATE TABLE pods_changelog (
    `key` STRING,
    `type` STRING,
    `object` ROW<metadata ROW<namespace STRING, name STRING, uid STRING, resourceVersion STRING>>,
    watchrelay ROW<version STRING, resourceVersion STRING, observedAt STRING, resync BOOLEAN, synthetic BOOLEAN>,
    PRIMARY KEY (`key`) NOT ENFORCED
) WITH (
    'connector' = 'upsert-kafka',
    'topic' = 'prod-eu-1.pods',
    'properties.bootstrap.servers' = 'kafka:9092',
    'properties.isolation.level' = 'read_committed',
    'key.format' = 'raw',
    'value.format' = 'json',
    'value.json.ignore-parse-errors' = 'false',
    'value.fields-include' = 'EXCEPT_KEY'
);

CREATE VIEW pods AS
SELECT
    `key`,
    `object`.metadata.namespace AS namespace,
    `object`.metadata.name AS name,
    `object`.metadata.uid AS uid,
    `object`.metadata.resourceVersion AS resource_version,
    CAST(watchrelay.version AS DECIMAL(38, 0)) AS version,
    watchrelay.observedAt AS observed_at
FROM pods_changelog
WHERE `type` IN ('ADDED', 'MODIFIED');

-- (b) The topic as an append-only log of every record, read from the start.
CREATE TABLE pods_log (
    `key` STRING,
    `type` STRING,
    `object` ROW<metadata ROW<namespace STRING, name STRING, uid STRING, resourceVersion STRING>>,
    watchrelay ROW<version STRING, resourceVersion STRING, observedAt STRING, resync BOOLEAN, synthetic BOOLEAN>
) WITH (
    'connector' = 'kafka',
    'topic' = 'prod-eu-1.pods',
    'properties.bootstrap.servers' = 'kafka:9092',
    'properties.isolation.level' = 'read_committed',
    'properties.group.id' = 'flink-pods',
    'scan.startup.mode' = 'earliest-offset',
    'key.format' = 'raw',
    'key.fields' = 'key',
    'value.format' = 'json',
    'value.json.ignore-parse-errors' = 'false',
    'value.fields-include' = 'EXCEPT_KEY'
);

-- Top-1 per key by version (the planner runs it as a Rank keeping one row per key), then the
-- keys whose last word is a DELETED are left out.
CREATE VIEW pods_latest AS
SELECT `key`, namespace, name, uid, resource_version, version, observed_at
FROM (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY `key` ORDER BY version DESC) AS row_num
    FROM (
        SELECT
            `key`,
            `type`,
            `object`.metadata.namespace AS namespace,
            `object`.metadata.name AS name,
            `object`.metadata.uid AS uid,
            `object`.metadata.resourceVersion AS resource_version,
            CAST(watchrelay.version AS DECIMAL(38, 0)) AS version,
            watchrelay.observedAt AS observed_at
        FROM pods_log
        WHERE `type` IN ('ADDED', 'MODIFIED', 'DELETED')
    )
)
WHERE row_num = 1 AND `type` <> 'DELETED';

-- (c) Records in Confluent framing (`schemaRegistry.wireFormat: confluent`) start with a zero
--     byte and a 4-byte schema id before the JSON, which the `json` format cannot skip: read
--     each value as bytes, drop the first five, and read the fields with JSON_VALUE. Flink's
--     SUBSTRING takes no bytes, so the value goes through ISO-8859-1 (one character a byte,
--     every byte one character) to drop them, then is read as the UTF-8 it is. A record
--     without the prefix (the DELETEDs that retract a stream's objects from a topic its channel
--     left carry no schema id) is read whole. The view `pods_framed_latest` is `pods_latest`
--     over it. Tombstones (null values) are skipped.
CREATE TABLE pods_framed (
    `key` STRING,
    `value` BYTES
) WITH (
    'connector' = 'kafka',
    'topic' = 'prod-eu-1.pods',
    'properties.bootstrap.servers' = 'kafka:9092',
    'properties.isolation.level' = 'read_committed',
    'properties.group.id' = 'flink-pods-framed',
    'scan.startup.mode' = 'earliest-offset',
    'key.format' = 'raw',
    'key.fields' = 'key',
    'value.format' = 'raw',
    'value.fields-include' = 'EXCEPT_KEY'
);

CREATE VIEW pods_framed_latest AS
SELECT `key`, namespace, name, uid, resource_version, version, observed_at
FROM (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY `key` ORDER BY version DESC) AS row_num
    FROM (
        SELECT
            `key`,
            JSON_VALUE(envelope, '$.type') AS `type`,
            JSON_VALUE(envelope, '$.object.metadata.namespace') AS namespace,
            JSON_VALUE(envelope, '$.object.metadata.name') AS name,
            JSON_VALUE(envelope, '$.object.metadata.uid') AS uid,
            JSON_VALUE(envelope, '$.object.metadata.resourceVersion') AS resource_version,
            CAST(JSON_VALUE(envelope, '$.watchrelay.version') AS DECIMAL(38, 0)) AS version,
            JSON_VALUE(envelope, '$.watchrelay.observedAt') AS observed_at
        FROM (
            SELECT
                `key`,
                DECODE(
                    ENCODE(
                        CASE
                            WHEN SUBSTRING(latin1 FROM 1 FOR 1) = CHR(0) THEN SUBSTRING(latin1 FROM 6)
                            ELSE latin1
                        END,
                        'ISO-8859-1'
                    ),
                    'UTF-8'
                ) AS envelope
            FROM (SELECT `key`, DECODE(`value`, 'ISO-8859-1') AS latin1 FROM pods_framed)
            WHERE latin1 IS NOT NULL
        )
    )
    WHERE `type` IN ('ADDED', 'MODIFIED', 'DELETED')
)
WHERE row_num = 1 AND `type` <> 'DELETED';
