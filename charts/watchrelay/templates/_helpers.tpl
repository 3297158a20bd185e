{{- define "watchrelay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "watchrelay.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "watchrelay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "watchrelay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "watchrelay.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The checkpoint ConfigMap's name: derived from the release, so two releases in one namespace never share it. */}}
{{- define "watchrelay.checkpointName" -}}
{{- default (printf "%s-checkpoints" (include "watchrelay.fullname" .)) (.Values.config.checkpoint).name -}}
{{- end -}}

{{/* The leader Lease's name, likewise. */}}
{{- define "watchrelay.leaseName" -}}
{{- default (printf "%s-leader" (include "watchrelay.fullname" .)) (.Values.config.leaderElection).name -}}
{{- end -}}

{{/* The configuration with chart-owned defaults filled in. */}}
{{- define "watchrelay.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $cp := default dict $cfg.checkpoint -}}
{{- if and $cp.namespace (ne $cp.namespace .Release.Namespace) -}}
{{- fail "config.checkpoint.namespace must be the release namespace (the chart grants access to the ConfigMap there); leave it unset" -}}
{{- end -}}
{{- $_ := set $cp "namespace" .Release.Namespace -}}
{{- $_ := set $cp "name" (include "watchrelay.checkpointName" .) -}}
{{- $_ := set $cfg "checkpoint" $cp -}}
{{- if ($cfg.sharding).enabled -}}
{{- /* Sharding replaces leader election: every replica relays its shards, and the Lease is
only parked, so no replica of an older version leads again. */ -}}
{{- $_ := set $cfg "leaderElection" (dict "enabled" false "name" (include "watchrelay.leaseName" .)) -}}
{{- else if ($cfg.leaderElection).enabled -}}
{{- $_ := set $cfg.leaderElection "name" (include "watchrelay.leaseName" .) -}}
{{- end -}}
{{- $_ := set $cfg "http" (dict "listen" (printf "0.0.0.0:%v" .Values.metrics.port)) -}}
{{- toYaml $cfg -}}
{{- end -}}


{{/* Egress of the relay's pods and of its preflight check: DNS, the API server, the Kafka
brokers and the schema registry (when configured), nothing else. */}}
{{- define "watchrelay.egress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
- to:
    - ipBlock:
        cidr: {{ .Values.networkPolicy.apiServer.cidr }}
  ports:
    {{- range .Values.networkPolicy.apiServer.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
- to:
    - ipBlock:
        cidr: {{ .Values.networkPolicy.kafka.cidr }}
  ports:
    {{- $ports := list }}
    {{- range splitList "," .Values.config.kafka.bootstrapServers }}
    {{- $hostPort := splitList ":" (trim .) }}
    {{- /* A broker named without a port listens on Kafka's default, as the relay assumes. */}}
    {{- $ports = append $ports (ternary (last $hostPort) "9092" (gt (len $hostPort) 1)) }}
    {{- end }}
    {{- range $ports | uniq }}
    - port: {{ . | atoi }}
      protocol: TCP
    {{- end }}
{{- with .Values.config.schemaRegistry }}
{{- if .url }}
{{- $url := urlParse .url }}
{{- $hostPort := splitList ":" $url.host }}
# The schema registry ({{ $url.host }}): its port, or its scheme's.
- to:
    - ipBlock:
        cidr: {{ $.Values.networkPolicy.schemaRegistry.cidr }}
  ports:
    - port: {{ ternary (last $hostPort) (ternary "443" "80" (eq $url.scheme "https")) (gt (len $hostPort) 1) | atoi }}
      protocol: TCP
{{- end }}
{{- end }}
{{- end -}}
