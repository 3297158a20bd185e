"""Runs recipes/duckdb/objects.sql on DuckDB over a directory of topic dumps, and prints the
live rows of `objects` as `cluster,kind,key,uid,resource_version` lines.

usage: duckdb_objects.py RECIPE DUMPS_DIR

DUMPS_DIR holds `*.jsonl` files, one JSON object a line, {"key": ..., "payload": ...} (payload
null for a tombstone), as `kcat -J` writes them.
"""

import sys

import duckdb

recipe, dumps = sys.argv[1], sys.argv[2]
sql = open(recipe).read()
old = "'dumps/*.jsonl'"
assert sql.count(old) == 1, "the recipe's dump path was not found"
sql = sql.replace(old, "'" + dumps.rstrip("/").replace("'", "''") + "/*.jsonl'")

db = duckdb.connect()
db.execute(sql)
rows = db.execute(
    "SELECT cluster, kind, key, uid, resource_version FROM objects ORDER BY cluster, kind, key"
).fetchall()
for row in rows:
    print(",".join(row))
