#!/usr/bin/env python3
"""The chart refuses what the relay refuses: for each rule the binary enforces that the values
schema encodes, a release's values breaking it are refused by `helm template` (the schema),
and the configuration the chart renders from them without the schema is refused by
`watchrelay check-config`. Either side alone passing a case fails this check, so the schema and
the binary cannot drift apart. Usage: check-schema-agrees.py WATCHRELAY_BIN"""
import copy
import subprocess
import sys
import tempfile

import yaml

BIN = sys.argv[1]
CHART = "charts/watchrelay"
PODS = {"operationId": "watchNamespacedPods", "allNamespaces": True}

# (rule, values over the chart's defaults)
CASES = [
    ("clusterName is a DNS label", {"config": {"clusterName": "Prod_EU"}}),
    ("watchTimeoutSeconds at least 1", {"config": {"kubernetes": {"watchTimeoutSeconds": 0}}}),
    ("listPageSize at least 1", {"config": {"kubernetes": {"listPageSize": 0}}}),
    ("maxConcurrentSyncs at least 1", {"config": {"kubernetes": {"maxConcurrentSyncs": 0}}}),
    ("watchIdleTimeoutSeconds at least 1", {"config": {"kubernetes": {"watchIdleTimeoutSeconds": 0}}}),
    ("backoffInitialMs at least 1", {"config": {"kubernetes": {"backoffInitialMs": 0}}}),
    ("checkpoint.intervalMs at least 1", {"config": {"checkpoint": {"intervalMs": 0}}}),
    ("shutdownTimeoutSeconds covers its reserves", {"config": {"shutdownTimeoutSeconds": 5}}),
    ("shards a power of two", {"replicaCount": 3, "config": {"leaderElection": {"enabled": False}, "sharding": {"enabled": True, "shards": 3}}}),
    ("exactly one of operationId and path", {"config": {"channels": [dict(PODS, path="/api/v1/namespaces/{namespace}/pods")]}}),
    ("eventTypes are object changes", {"config": {"channels": [dict(PODS, eventTypes=["BOOKMARK"])]}}),
    ("one scope per channel", {"config": {"channels": [dict(PODS, namespaces=["a"])]}}),
    ("a namespaced channel names its scope", {"config": {"channels": [{"operationId": "watchNamespacedDeployments"}]}}),
    ("a Secrets channel chooses its watchStrategy", {"config": {"channels": [{"path": "/api/v1/namespaces/{namespace}/secrets", "namespaces": ["a"]}]}}),
    ("topics' partitions at least 1", {"config": {"kafka": {"topics": {"partitions": 0}}}}),
    ("a channel's partitions at least 1", {"config": {"channels": [dict(PODS, partitions=0)]}}),
]


def helm(values_file, *extra):
    return subprocess.run(
        ["helm", "template", "wr", CHART, "--namespace", "watchrelay", "-f", values_file, *extra],
        capture_output=True, text=True)


def merge(base, over):
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def main():
    failures = []
    with tempfile.TemporaryDirectory() as work:
        # The control: the release the cases start from passes both, so a refusal is the rule's.
        for rule, values in [("control", {})] + CASES:
            before = len(failures)
            # A release as users install it: identity given (the chart requires it).
            values = merge({"config": {"clusterName": "prod", "kafka": {"bootstrapServers": "kafka:9092"}}}, values)
            path = f"{work}/values.yaml"
            with open(path, "w") as f:
                yaml.safe_dump(values, f)
            accepted = helm(path).returncode == 0
            if accepted != (rule == "control"):
                failures.append(f"{rule}: the chart's schema {'accepts' if accepted else 'refuses'} {values}")
            rendered = helm(path, "--skip-schema-validation")
            if rendered.returncode != 0:
                failures.append(f"{rule}: the chart does not render without its schema: {rendered.stderr}")
                continue
            config = next(d["data"]["config.yaml"] for d in yaml.safe_load_all(rendered.stdout)
                          if d and d.get("kind") == "ConfigMap" and "config.yaml" in d.get("data", {}))
            with open(f"{work}/config.yaml", "w") as f:
                f.write(config)
            checked = subprocess.run([BIN, "check-config", f"{work}/config.yaml"], capture_output=True, text=True)
            if (checked.returncode == 0) != (rule == "control"):
                failures.append(f"{rule}: check-config disagrees with the schema on {values}: {checked.stderr}")
            if len(failures) == before:
                print(f"  {rule}: {'accepted' if rule == 'control' else 'refused'} by both")
    if failures:
        sys.exit("\n".join(failures))


main()
