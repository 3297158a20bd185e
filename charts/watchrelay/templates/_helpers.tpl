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
