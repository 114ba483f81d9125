{{/* The kube-rbac-proxy sidecar (kubeRBACProxy.enabled): TLS on `port` in front of the
agent, which then listens on 127.0.0.1:kubeRBACProxy.upstreamPort only. Every request but
the probes' (/healthz, /readyz) must carry a Kubernetes bearer token allowed to GET its path
(a SubjectAccessReview: Prometheus needs `nonResourceURLs: ["/metrics"], verbs: ["get"]`,
as kube-prometheus-stack grants it). */}}
{{- define "stepwise.kubeRBACProxy" -}}
{{- $p := .Values.kubeRBACProxy -}}
- name: kube-rbac-proxy
  image: {{ include "stepwise.imageRef" (dict "image" $p.image "global" .Values.global "tag" "") | quote }}
  imagePullPolicy: {{ $p.image.pullPolicy }}
  args:
    - --secure-listen-address={{ include "stepwise.host" . }}:{{ .Values.port }}
    - --upstream=http://127.0.0.1:{{ $p.upstreamPort }}/
    - --ignore-paths=/healthz,/readyz
    {{- if $p.tls.secretName }}
    - --tls-cert-file=/etc/kube-rbac-proxy-tls/{{ $p.tls.certKey }}
    - --tls-private-key-file=/etc/kube-rbac-proxy-tls/{{ $p.tls.keyKey }}
    {{- end }}
    {{- with $p.extraArgs }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if eq .Values.listenAddress "hostIP" }}
  env:
    - name: STEPWISE_HOST_IP
      valueFrom:
        fieldRef:
          fieldPath: status.hostIP
  {{- end }}
  ports:
    - name: https
      containerPort: {{ .Values.port }}
      protocol: TCP
  resources:
    {{- toYaml $p.resources | nindent 4 }}
  securityContext:
    {{- toYaml $p.securityContext | nindent 4 }}
  volumeMounts:
    - name: kube-rbac-proxy-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- if $p.tls.secretName }}
    - name: kube-rbac-proxy-tls
      mountPath: /etc/kube-rbac-proxy-tls
      readOnly: true
    {{- end }}
{{- end -}}

{{/* The proxy's volumes: the service account token, projected as the kubelet would
automount it but for this container only, and the TLS Secret. */}}
{{- define "stepwise.kubeRBACProxyVolumes" -}}
- name: kube-rbac-proxy-token
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                apiVersion: v1
                fieldPath: metadata.namespace
{{- with .Values.kubeRBACProxy.tls.secretName }}
- name: kube-rbac-proxy-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0400
{{- end }}
{{- end -}}
