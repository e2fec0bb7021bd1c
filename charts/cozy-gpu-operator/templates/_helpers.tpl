{{- define "cozygpu.name" -}}
{{- default .Chart.Name .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cozygpu.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cozygpu.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The operator's username: its own writes skip its validating webhooks (docs/admission.md). */}}
{{- define "cozygpu.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "cozygpu.name" . }}
{{- end -}}

{{- define "cozygpu.certManager" -}}
{{- if eq (toString .Values.certManager.enabled) "auto" -}}
{{- .Capabilities.APIVersions.Has "cert-manager.io/v1" -}}
{{- else -}}
{{- .Values.certManager.enabled -}}
{{- end -}}
{{- end -}}

{{- define "cozygpu.tlsSecret" -}}
{{ include "cozygpu.name" . }}-webhook-tls
{{- end -}}

{{/* The container's ports, named once: the Deployment, its environment and the NetworkPolicy read them here. */}}
{{- define "cozygpu.webhookPort" -}}
9443
{{- end -}}

{{- define "cozygpu.httpPort" -}}
8080
{{- end -}}
