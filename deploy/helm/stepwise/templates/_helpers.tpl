{{/* The application's name: the chart's, or nameOverride. */}}
{{- define "stepwise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of every object: fullnameOverride, else the release name when it contains the
application's name (release "stepwise-agent" -> "stepwise-agent"), else
"<release>-<name>" (release "a" -> "a-stepwise"). Two releases never share it. */}}
{{- define "stepwise.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "stepwise.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Namespace of every namespaced object. */}}
{{- define "stepwise.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Selector labels: the application and the release, so that two releases select disjoint
pods (the kustomize base carries the same pair for release "stepwise-agent"). */}}
{{- define "stepwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stepwise.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "stepwise.labels" -}}
{{ include "stepwise.selectorLabels" . }}
app.kubernetes.io/part-of: stepwise
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The ServiceAccount the pods run as. */}}
{{- define "stepwise.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stepwise.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference from (dict "image" <registry, repository, tag, digest> "global"
.Values.global "tag" <default tag>): global.imageRegistry replaces the registry; a digest
pins the image (the tag stays for readers). */}}
{{- define "stepwise.imageRef" -}}
{{- $registry := default .image.registry (.global | default dict).imageRegistry -}}
{{- $ref := printf "%s:%s" .image.repository (default .tag .image.tag) -}}
{{- if $registry -}}
{{- $ref = printf "%s/%s" $registry $ref -}}
{{- end -}}
{{- if .image.digest -}}
{{- $ref = printf "%s@%s" $ref .image.digest -}}
{{- end -}}
{{- $ref -}}
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

{{/* The agent's `listen` in agent.toml. With kubeRBACProxy only the proxy reaches it, on
the loopback. With listenAddress "hostIP" the file binds every address and STEPWISE_LISTEN
(the DaemonSet's env, from status.hostIP) overrides it. */}}
{{- define "stepwise.listen" -}}
{{- if .Values.kubeRBACProxy.enabled -}}
127.0.0.1:{{ .Values.kubeRBACProxy.upstreamPort }}
{{- else if eq .Values.listenAddress "hostIP" -}}
0.0.0.0:{{ .Values.port }}
{{- else -}}
{{ include "stepwise.host" . }}:{{ .Values.port }}
{{- end -}}
{{- end -}}

{{/* listenAddress as the host part of an address: $(STEPWISE_HOST_IP) for "hostIP" (the
kubelet expands it in env and args), brackets around IPv6. */}}
{{- define "stepwise.host" -}}
{{- if eq .Values.listenAddress "hostIP" -}}
$(STEPWISE_HOST_IP)
{{- else if contains ":" .Values.listenAddress -}}
[{{ .Values.listenAddress }}]
{{- else -}}
{{ .Values.listenAddress }}
{{- end -}}
{{- end -}}

{{/* Name of the port Prometheus scrapes: the agent's, or the proxy's. */}}
{{- define "stepwise.portName" -}}
{{- ternary "https" "http" .Values.kubeRBACProxy.enabled -}}
{{- end -}}

{{/* A probe of the agent container: through the proxy (HTTPS on `port`, its ignored paths)
with kubeRBACProxy, else as given. */}}
{{- define "stepwise.probe" -}}
{{- $p := deepCopy .probe -}}
{{- if and .root.Values.kubeRBACProxy.enabled $p.httpGet -}}
{{- $_ := set $p.httpGet "port" .root.Values.port -}}
{{- $_ := set $p.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- toYaml $p -}}
{{- end -}}

{{/* Refusals: combinations that would deploy something that cannot work. */}}
{{- define "stepwise.validate" -}}
{{- if and .Values.kubeRBACProxy.enabled .Values.markersOverTcp.enabled -}}
{{- fail "markersOverTcp cannot be used with kubeRBACProxy: the proxy would take the markers token for a Kubernetes token" -}}
{{- end -}}
{{- if and .Values.kubeRBACProxy.enabled .Values.podMonitor.enabled -}}
{{- fail "use the ServiceMonitor with kubeRBACProxy: a PodMonitor cannot send Prometheus's own service account token" -}}
{{- end -}}
{{- if and .Values.kubeRBACProxy.enabled (eq (int .Values.kubeRBACProxy.upstreamPort) (int .Values.port)) -}}
{{- fail "kubeRBACProxy.upstreamPort must differ from port (both bind in the node's network namespace)" -}}
{{- end -}}
{{- end -}}

{{/* Where the markers token Secret is mounted. */}}
{{- define "stepwise.tokenDir" -}}/etc/stepwise-token{{- end -}}
