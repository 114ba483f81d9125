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
