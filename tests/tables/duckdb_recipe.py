"""Runs recipes/duckdb/pods.sql on DuckDB over a dump of a topic, and prints the live rows of
`pods` (or of `pods_as_of(T)`) as `key,uid,resource_version` lines.

usage: duckdb_recipe.py RECIPE DUMP [AS_OF [resourceVersion]]

DUMP holds one JSON object a line, {"key": ..., "payload": ...} (payload null for a
tombstone), as `kcat -J` writes them. AS_OF is an RFC 3339 time, or `now`. With
`resourceVersion`, each key keeps its highest watchrelay.resourceVersion instead of its highest
watchrelay.version: what a table without the version would hold.
"""

import sys

import duckdb

recipe, dump = sys.argv[1], sys.argv[2]
as_of = sys.argv[3] if len(sys.argv) > 3 else "now"
by_rv = len(sys.argv) > 4 and sys.argv[4] == "resourceVersion"

sql = open(recipe).read().replace("'pods.jsonl'", "'" + dump.replace("'", "''") + "'")
if by_rv:
    old = "CAST(payload ->> '$.watchrelay.version' AS UHUGEINT)"
    assert sql.count(old) == 1, "the recipe's version column was not found"
    sql = sql.replace(old, "CAST(payload ->> '$.watchrelay.resourceVersion' AS UHUGEINT)")

db = duckdb.connect()
db.execute(sql)
if as_of == "now":
    rows = db.execute("SELECT key, uid, resource_version FROM pods ORDER BY key").fetchall()
else:
    rows = db.execute(
        "SELECT key, uid, resource_version FROM pods_as_of(?::TIMESTAMPTZ) ORDER BY key",
        [as_of],
    ).fetchall()
for key, uid, rv in rows:
    print(f"{key},{uid},{rv}")
