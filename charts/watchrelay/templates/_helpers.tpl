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

{{/* The configuration with chart-owned defaults filled in. */}}
{{- define "watchrelay.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $cp := default dict $cfg.checkpoint -}}
{{- $_ := set $cp "namespace" (default .Release.Namespace $cp.namespace) -}}
{{- $_ := set $cfg "checkpoint" $cp -}}
{{- $_ := set $cfg "http" (dict "listen" (printf "0.0.0.0:%v" .Values.metrics.port)) -}}
{{- toYaml $cfg -}}
{{- end -}}
