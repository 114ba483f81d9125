{{/* Name of every object. */}}
{{- define "stepwise.fullname" -}}
{{- default "stepwise-agent" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: the same as the kustomize base, so either can replace the other. */}}
{{- define "stepwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stepwise.fullname" . }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "stepwise.labels" -}}
{{ include "stepwise.selectorLabels" . }}
app.kubernetes.io/part-of: stepwise
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Labels of the Prometheus Operator objects: the common ones, prometheusLabels, then the object's own. */}}
{{- define "stepwise.monitoringLabels" -}}
{{ include "stepwise.labels" .root }}
{{- with .root.Values.prometheusLabels }}
{{ toYaml . }}
{{- end }}
{{- with .own }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The agent's `listen` in agent.toml. With listenAddress "hostIP" the file binds every
address and STEPWISE_LISTEN (the DaemonSet's env, from status.hostIP) overrides it. */}}
{{- define "stepwise.listen" -}}
{{- if eq .Values.listenAddress "hostIP" -}}
0.0.0.0:{{ .Values.port }}
{{- else if contains ":" .Values.listenAddress -}}
[{{ .Values.listenAddress }}]:{{ .Values.port }}
{{- else -}}
{{ .Values.listenAddress }}:{{ .Values.port }}
{{- end -}}
{{- end -}}

{{/* Where the markers token Secret is mounted. */}}
{{- define "stepwise.tokenDir" -}}/etc/stepwise-token{{- end -}}
