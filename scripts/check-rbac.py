#!/usr/bin/env python3
"""The chart's RBAC grants exactly what a configuration needs.

For each configuration file: render the chart with it, take the configuration the relay would
run with (from the rendered ConfigMap), ask `watchrelay rbac` what it needs, and compare with
the rendered ClusterRole, Roles and bindings: list and watch on exactly the needed resources in
exactly the needed scope, no `get` or write verb unless bound to the relay's own ConfigMap and
Lease by name (and `create`, which Kubernetes cannot limit by name).

    check-rbac.py WATCHRELAY_BIN CONFIG.yaml [CONFIG.yaml ...]
"""
import json
import os
import subprocess
import sys
import tempfile

import yaml

RELEASE, NAMESPACE = "relay", "watchrelay"


def render(config_file, work):
    values = os.path.join(work, "values.yaml")
    with open(config_file) as f:
        config = yaml.safe_load(f)
    config.pop("kubernetes", None)  # the chart runs in-cluster
    config.pop("http", None)
    config.get("checkpoint", {}).pop("namespace", None)  # the chart's: the release namespace
    with open(values, "w") as f:
        yaml.safe_dump({"config": config}, f)
    out = subprocess.run(
        ["helm", "template", RELEASE, "charts/watchrelay", "--namespace", NAMESPACE, "-f", values,
         "--no-hooks"],  # the relay's own RBAC; the preflight hook has its own, read only
        check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def needs(binary, docs, work):
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {}))
    path = os.path.join(work, "rendered.yaml")
    with open(path, "w") as f:
        f.write(cm["data"]["config.yaml"])
    env = dict(os.environ, KAFKA_SASL_PASSWORD=os.environ.get("KAFKA_SASL_PASSWORD", "example"))
    out = subprocess.run([binary, "rbac", "--config", path], check=True, capture_output=True,
                         text=True, env=env).stdout
    return json.loads(out)


def granted(docs):
    cluster, namespaced, own, errors = set(), {}, {}, []
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    bound = {(d["roleRef"]["kind"], d["metadata"].get("namespace"), d["roleRef"]["name"])
             for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    for key, role in roles.items():
        kind, ns, name = key
        if key not in bound:
            errors.append(f"{kind} {ns}/{name} is bound to nothing")
        for rule in role.get("rules", []):
            verbs = sorted(rule["verbs"])
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    if "resourceNames" in rule:
                        if verbs != ["get", "update"]:
                            errors.append(f"{kind} {name}: {verbs} on {res} by name")
                        for n in rule["resourceNames"]:
                            own.setdefault(ns, set()).add((group, res, n))
                    elif verbs == ["create"] and res in ("configmaps", "leases"):
                        pass
                    elif verbs != ["list", "watch"]:
                        errors.append(f"{kind} {name}: {verbs} on {group or 'core'}/{res}")
                    elif kind == "ClusterRole":
                        cluster.add((group, res))
                    else:
                        namespaced.setdefault(ns, set()).add((group, res))
    return cluster, namespaced, own, errors


def main():
    binary, configs = sys.argv[1], sys.argv[2:]
    failed = False
    for config_file in configs:
        with tempfile.TemporaryDirectory() as work:
            docs = render(config_file, work)
            want = needs(binary, docs, work)
            cluster, namespaced, own, errors = granted(docs)
            want_cluster = {tuple(r) for r in want["cluster"]}
            want_ns = {ns: {tuple(r) for r in rs} for ns, rs in want["namespaced"].items()}
            want_own = {ns: {tuple(r) for r in rs} for ns, rs in want["own"].items()}
            if cluster != want_cluster:
                errors.append(f"cluster-wide: granted {sorted(cluster)}, needed {sorted(want_cluster)}")
            if namespaced != want_ns:
                errors.append(f"per namespace: granted {namespaced}, needed {want_ns}")
            if own != want_own:
                errors.append(f"own objects: granted {own}, needed {want_own}")
            if errors:
                failed = True
                print(f"{config_file}: the chart's RBAC is not what the configuration needs:", file=sys.stderr)
                for e in errors:
                    print(f"  {e}", file=sys.stderr)
            else:
                print(f"{config_file}: RBAC matches ({len(cluster)} cluster-wide, "
                      f"{sum(map(len, namespaced.values()))} namespaced, {len(own.get(NAMESPACE, ()))} own)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
