"""Runs recipes/clickhouse/pods.sql on ClickHouse's engine (chDB) over records read from a
topic, and prints the live rows of its table as `key,uid,resource_version` lines.

usage: clickhouse.py RECIPE RECORDS [resourceVersion]

RECORDS holds one JSON object a line, {"key": ..., "value": ...} (value null for a
tombstone), in partition order. The recipe's Kafka table becomes a Null table the records are
inserted into, so its materialized view fills the table as the Kafka engine would. With
`resourceVersion`, the table keeps each key's highest watchrelay.resourceVersion instead of
its highest watchrelay.version: what a table without the version would hold.
"""

import json
import re
import sys

from chdb import session

recipe, records = sys.argv[1], sys.argv[2]
by_rv = len(sys.argv) > 3 and sys.argv[3] == "resourceVersion"

sql = open(recipe).read()
sql = re.sub(r"--[^\n]*", "", sql)
sql, n = re.subn(
    r"CREATE TABLE pods_queue \(raw String\)\s*ENGINE = Kafka.*?;",
    "CREATE TABLE pods_queue (raw String, _key String) ENGINE = Null;",
    sql,
    flags=re.S,
)
assert n == 1, "the recipe's Kafka table was not found"
if by_rv:
    sql, n = re.subn(r"'watchrelay', 'version'", "'watchrelay', 'resourceVersion'", sql)
    assert n == 1

s = session.Session()
s.query("CREATE DATABASE IF NOT EXISTS k")
s.query("USE k")
for statement in filter(str.strip, sql.split(";")):
    s.query(statement)

rows = []
with open(records) as f:
    for line in f:
        r = json.loads(line)
        # A tombstone reaches the Kafka engine as an empty value.
        rows.append({"_key": r["key"], "raw": r["value"] or ""})
for i in range(0, len(rows), 1000):
    batch = "\n".join(json.dumps(row) for row in rows[i : i + 1000])
    s.query("INSERT INTO pods_queue FORMAT JSONEachRow " + batch)

out = s.query(
    "SELECT key, uid, resource_version FROM pods FINAL WHERE NOT is_deleted ORDER BY key",
    "CSV",
)
print(str(out), end="")
