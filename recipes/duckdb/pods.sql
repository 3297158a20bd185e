-- The cluster's pods in DuckDB, from a dump of a watchrelay topic: now, or as they were at any
-- moment the topic covers.
--
-- The dump is what `kcat -C -b BROKER -t TOPIC -e -J -X isolation.level=read_committed >
-- pods.jsonl` writes: committed records only (librdkafka's default, which `delivery:
-- exactlyOnce` needs), one JSON object a record, its Kafka key as `key` and its value as the
-- string `payload` (null for a tombstone).
-- Records may come in any order (several partitions, several dumps): each key keeps its record
-- of the highest watchrelay.version, which never goes back on a key (etcd restores, resyncs,
-- same-name recreates included), read as DuckDB's unsigned 128-bit integer. A key whose
-- highest record is a DELETED is gone. Markers (BOOKMARK records) and tombstones are skipped.
--
-- `pods_as_of(t)` is the same table from the records the relay had read by time `t`
-- (`watchrelay.observedAt`): the cluster's pods as the relay saw them then, for an audit.
-- Copy this file and change the dump's path.

-- A value in Confluent's framing (`schemaRegistry.wireFormat: confluent`: a zero byte and the
-- 4-byte schema id before the JSON) is read from its sixth character.
CREATE OR REPLACE TABLE records AS
SELECT key,
       CASE WHEN starts_with(payload, chr(0)) THEN payload[6:] ELSE payload END AS payload
FROM read_json('pods.jsonl',
               format = 'newline_delimited',
               columns = {key: 'VARCHAR', payload: 'VARCHAR'});

CREATE OR REPLACE VIEW changes AS
SELECT
    key,
    payload ->> '$.type' AS type,
    payload ->> '$.object.metadata.namespace' AS namespace,
    payload ->> '$.object.metadata.name' AS name,
    payload ->> '$.object.metadata.uid' AS uid,
    payload ->> '$.object.metadata.resourceVersion' AS resource_version,
    CAST(payload ->> '$.watchrelay.version' AS UHUGEINT) AS version,
    CAST(payload ->> '$.watchrelay.observedAt' AS TIMESTAMPTZ) AS observed_at,
    payload ->> '$.object' AS object
FROM records
WHERE payload IS NOT NULL
  AND payload ->> '$.type' IN ('ADDED', 'MODIFIED', 'DELETED');

CREATE OR REPLACE MACRO pods_as_of(t) AS TABLE
SELECT key, namespace, name, uid, resource_version, version, observed_at, object
FROM (
    SELECT *
    FROM changes
    WHERE observed_at <= t
    QUALIFY row_number() OVER (PARTITION BY key ORDER BY version DESC) = 1
)
WHERE type <> 'DELETED';

CREATE OR REPLACE VIEW pods AS
SELECT * FROM pods_as_of('infinity'::TIMESTAMPTZ);
