{{/*
Names and labels shared by every template. The shipped manifests
(deploy/manifests/dra-quota.yaml) are release "dra-quota" in namespace
dra-quota-system, so the full name there is "dra-quota".
*/}}

{{- define "dra-quota.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dra-quota.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The webhook Service: the certificate names <service>.<namespace>.svc. */}}
{{- define "dra-quota.serviceName" -}}
{{- printf "%s-webhook" (include "dra-quota.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dra-quota.serviceAccountName" -}}
{{- default (include "dra-quota.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "dra-quota.secretName" -}}
{{- default (printf "%s-webhook-tls" (include "dra-quota.fullname" .)) .Values.certificates.secretName }}
{{- end }}

{{- define "dra-quota.leaseName" -}}
{{- printf "%s-controller" (include "dra-quota.fullname" .) }}
{{- end }}

{{- define "dra-quota.adminAccessConfigMap" -}}
{{- printf "%s-admin-access" (include "dra-quota.fullname" .) }}
{{- end }}

{{/* The user name our own requests carry (the webhooks' not-dra-quota-itself conditions). */}}
{{- define "dra-quota.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "dra-quota.serviceAccountName" .) }}
{{- end }}

{{- define "dra-quota.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "dra-quota.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Pods' labels, also the Deployment's, Service's and PDB's selector. */}}
{{- define "dra-quota.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-quota.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{/* No image is published: refuse to render without one the user chose, rather than
install Pods that can never start behind webhooks that wait for them. */}}
{{- define "dra-quota.image" -}}
{{- $repository := required "image.repository is required: no dra-quota image is published; build the Dockerfile, push it where the cluster can pull it and set image.repository (and image.tag or image.digest): docs/install.md" .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Namespaces a webhook sees: $ = root context, which = "governed", "ungoverned" or
"any". Never the configured exclusions nor our own namespace; only namespaces carrying
webhooks.optInLabel when it is set (a staged rollout); governed ones (the leader's label
draquota.io/governed=true) or the rest for the fail-closed / fail-open pairs. */}}
{{- define "dra-quota.namespaceSelector" -}}
{{- $root := index . 0 }}{{ $which := index . 1 -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ append $root.Values.webhooks.excludeNamespaces $root.Release.Namespace | uniq | toJson }}
    {{- with $root.Values.webhooks.optInLabel }}
    - {key: {{ . }}, operator: Exists}
    {{- end }}
    {{- if eq $which "governed" }}
    - {key: draquota.io/governed, operator: In, values: ["true"]}
    {{- else if eq $which "ungoverned" }}
    - {key: draquota.io/governed, operator: NotIn, values: ["true"]}
    {{- end }}
{{- end }}

{{/* clientConfig of one webhook: $ = root context, path = /validate or /admit. */}}
{{- define "dra-quota.clientConfig" -}}
{{- $root := index . 0 }}{{ $path := index . 1 -}}
clientConfig:
  service:
    namespace: {{ $root.Release.Namespace }}
    name: {{ include "dra-quota.serviceName" $root }}
    path: {{ $path }}
    port: 443
  {{- if eq $root.Values.certificates.mode "files" }}
  caBundle: {{ required "certificates.files.caBundle: the PEM CA of the serving certificate is required with certificates.mode=files" $root.Values.certificates.files.caBundle | b64enc }}
  {{- end }}
{{- end }}

{{/* Metadata annotations of the webhook configurations (cert-manager's CA injection). */}}
{{- define "dra-quota.webhookAnnotations" -}}
{{- if eq .Values.certificates.mode "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "dra-quota.fullname" .) }}
{{- end }}
{{- end }}

{{/* An allowlist as the ConfigMap holds it (the ValidatingAdmissionPolicy splits on commas). */}}
{{- define "dra-quota.names" -}}
{{- join ", " . | quote }}
{{- end }}
