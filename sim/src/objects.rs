//! Realistic objects for tests, churn and benchmarks. A pod is about 4 KB of JSON including
//! `metadata.managedFields`, like pods of a typical Deployment.

use serde_json::{json, Value};

fn managed_fields(manager: &str) -> Value {
    json!([
        {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-11-01T10:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
            "f:ownerReferences": {".": {}, "k:{\"uid\":\"5e1a7f0c-2b7d-4d8e-9a35-0c1f6e2d7b11\"}": {}}},
          "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
            "f:ports": {".": {}, "k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}, "f:protocol": {}}},
            "f:resources": {".": {}, "f:limits": {".": {}, "f:memory": {}}, "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
            "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
            "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {}, "f:securityContext": {},
            "f:terminationGracePeriodSeconds": {}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-11-01T10:00:05Z", "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"ContainersReady\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
            "k:{\"type\":\"Initialized\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
            "k:{\"type\":\"Ready\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}},
            "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {".": {}, "k:{\"ip\":\"10.244.1.17\"}": {".": {}, "f:ip": {}}}, "f:startTime": {}}}}
    ])
}

/// An active Namespace `name`, with no labels yet.
pub fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {}}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
}

/// A running Pod of a Deployment's ReplicaSet, managedFields included: about 4 KB.
pub fn pod(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns, "generateName": "web-7d4b9c8f6d-",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d", "app.kubernetes.io/part-of": "storefront"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-01T09:59:58Z", "prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d", "uid": "5e1a7f0c-2b7d-4d8e-9a35-0c1f6e2d7b11", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": managed_fields("kube-controller-manager")
        },
        "spec": {
            "containers": [{
                "name": "app", "image": "registry.example.com/storefront/web:1.27.3", "imagePullPolicy": "IfNotPresent",
                "ports": [{"containerPort": 8080, "protocol": "TCP", "name": "http"}],
                "env": [{"name": "LOG_LEVEL", "value": "info"}, {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "resources": {"limits": {"memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"
            }],
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "nodeName": "node-3", "securityContext": {}, "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-01T10:00:00Z"},
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-01T10:00:05Z"},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-01T10:00:05Z"},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-01T10:00:00Z"}],
            "hostIP": "10.0.0.13", "hostIPs": [{"ip": "10.0.0.13"}], "podIP": "10.244.1.17", "podIPs": [{"ip": "10.244.1.17"}],
            "startTime": "2026-11-01T10:00:00Z", "qosClass": "Burstable",
            "containerStatuses": [{"name": "app", "ready": true, "started": true, "restartCount": 0, "image": "registry.example.com/storefront/web:1.27.3",
                "imageID": "registry.example.com/storefront/web@sha256:4f53e2564790c8e7856ec08e384732aa38dc43c52f02952483e3f003afbf23db",
                "containerID": "containerd://9b1a2f3e4d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5a6f7e8d9c0b1a",
                "state": {"running": {"startedAt": "2026-11-01T10:00:03Z"}}, "lastState": {}}]
        }
    })
}

/// A Deployment of three ready replicas, as `kubectl apply` left it.
pub fn deployment(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}, "annotations": {"deployment.kubernetes.io/revision": "3"}, "managedFields": managed_fields("kubectl-client-side-apply")},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": name}}, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:2.4.1", "ports": [{"containerPort": 8080}]}]}}},
        "status": {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3, "observedGeneration": 3,
            "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}, {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}
    })
}

/// An `events.k8s.io/v1` Event: the scheduler assigning a Pod to a node.
pub fn event(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": "2026-11-01T10:00:00.000000Z", "reportingController": "default-scheduler", "reportingInstance": "default-scheduler-control-plane",
        "action": "Binding", "reason": "Scheduled", "type": "Normal", "note": format!("Successfully assigned {ns}/{name} to node-3"),
        "regarding": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns}
    })
}

/// An EndpointSlice of Service `web` with two ready endpoints.
pub fn endpointslice(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.17"], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": "node-3", "targetRef": {"kind": "Pod", "name": "web-1", "namespace": ns}},
                      {"addresses": ["10.244.2.9"], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": "node-1", "targetRef": {"kind": "Pod", "name": "web-2", "namespace": ns}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    })
}

/// A ready Linux Node of four CPUs and 16 GiB; cluster-scoped.
pub fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m6i.xlarge", "topology.kubernetes.io/zone": "eu-west-1a"}},
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": format!("aws:///eu-west-1a/i-{name}")},
        "status": {"capacity": {"cpu": "4", "memory": "16131832Ki", "pods": "110"}, "allocatable": {"cpu": "3920m", "memory": "15214328Ki", "pods": "110"},
            "conditions": [{"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"}, {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
                           {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "containerRuntimeVersion": "containerd://2.0.0", "osImage": "Debian GNU/Linux 12 (bookworm)", "architecture": "amd64"}}
    })
}

/// A ClusterIP Service on port 80, selecting the pods labelled `app: <name>`.
pub fn service(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"type": "ClusterIP", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
            "clusterIP": "10.96.12.34", "clusterIPs": ["10.96.12.34"], "ipFamilies": ["IPv4"], "sessionAffinity": "None"},
        "status": {"loadBalancer": {}}
    })
}

/// An Ingress for host `<name>.example.com` with TLS, routing to Service `name`.
pub fn ingress(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ingressClassName": "nginx", "tls": [{"hosts": [format!("{name}.example.com")], "secretName": format!("{name}-tls")}],
            "rules": [{"host": format!("{name}.example.com"), "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": name, "port": {"number": 80}}}}]}}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}
    })
}

/// A NetworkPolicy admitting the ingress controller's namespace to the `web` pods.
pub fn networkpolicy(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}], "ports": [{"protocol": "TCP", "port": 8080}]}]}
    })
}

/// A Gateway API Gateway with one HTTP listener on port 80.
pub fn gateway(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"gatewayClassName": "eg", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80, "allowedRoutes": {"namespaces": {"from": "Same"}}}]},
        "status": {"addresses": [{"type": "IPAddress", "value": "203.0.113.20"}]}
    })
}

/// A Gateway API HTTPRoute for `<name>.example.com`, to Service `name`.
pub fn httproute(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [format!("{name}.example.com")],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [{"name": name, "port": 80}]}]}
    })
}

/// A ConfigMap with a single entry.
pub fn configmap(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"key": "value"}})
}

/// An object for any built-in resource key (`pods`, `deployments.apps`, ...), for churn.
pub fn for_resource(resource: &str, ns: Option<&str>, name: &str) -> Option<Value> {
    let ns_or = ns.unwrap_or("default");
    Some(match resource {
        "pods" => pod(ns_or, name),
        "deployments.apps" => deployment(ns_or, name),
        "events.events.k8s.io" => event(ns_or, name),
        "endpointslices.discovery.k8s.io" => endpointslice(ns_or, name),
        "nodes" => node(name),
        "services" => service(ns_or, name),
        "ingresses.networking.k8s.io" => ingress(ns_or, name),
        "networkpolicies.networking.k8s.io" => networkpolicy(ns_or, name),
        "gateways.gateway.networking.k8s.io" => gateway(ns_or, name),
        "httproutes.gateway.networking.k8s.io" => httproute(ns_or, name),
        "configmaps" => configmap(ns_or, name),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pod_is_about_four_kilobytes() {
        let n = serde_json::to_vec(&super::pod("default", "web-7d4b9c8f6d-x2x7k"))
            .unwrap()
            .len();
        assert!((3500..5000).contains(&n), "{n} bytes");
    }
}
