-- Several resource kinds of several clusters in one DuckDB table, from dumps of several
-- watchrelay topics: every release's topics (pods, deployments, nodes, ...) of every cluster.
--
-- Each dump is what `kcat -C -b BROKER -t TOPIC -e -J -X isolation.level=read_committed >
-- dumps/TOPIC.jsonl` writes (committed records only), one JSON object a record, its Kafka key
-- as `key` and its value as the string `payload` (null for a tombstone); any number of dumps,
-- records in any order. A row is an object: its cluster (`watchrelay.cluster`, the release's
-- clusterName), its kind and its key. Each keeps its record of the highest watchrelay.version
-- (DuckDB's unsigned 128-bit integer), which never goes back on a key; a row whose highest
-- record is a DELETED is gone. Values in Confluent's framing
-- (`schemaRegistry.wireFormat: confluent`) are read from their sixth character. Markers
-- (BOOKMARK records) and tombstones are skipped. Copy this file and change the dumps' path.

CREATE OR REPLACE TABLE records AS
SELECT key,
       CASE WHEN starts_with(payload, chr(0)) THEN payload[6:] ELSE payload END AS payload
FROM read_json('dumps/*.jsonl',
               format = 'newline_delimited',
               columns = {key: 'VARCHAR', payload: 'VARCHAR'});

CREATE OR REPLACE VIEW changes AS
SELECT
    payload ->> '$.watchrelay.cluster' AS cluster,
    -- The kind, from the object (an inferred DELETED of an unknown kind names its channel).
    coalesce(payload ->> '$.object.kind', payload ->> '$.watchrelay.channel') AS kind,
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

CREATE OR REPLACE VIEW objects AS
SELECT cluster, kind, key, namespace, name, uid, resource_version, version, observed_at, object
FROM (
    SELECT *
    FROM changes
    QUALIFY row_number() OVER (PARTITION BY cluster, kind, key ORDER BY version DESC) = 1
)
WHERE type <> 'DELETED';
