{{/* Whether a monitoring object renders: its `enabled` value, or with "auto", whether the cluster serves the
Prometheus Operator's API. Call with (dict "enabled" <value> "root" $). */}}
{{- define "cozygpu.monitoring" -}}
{{- if eq (toString .enabled) "auto" -}}
{{- .root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}
{{- else -}}
{{- toString .enabled -}}
{{- end -}}
{{- end -}}

{{- define "cozygpu.metricsScraper" -}}
{{ include "cozygpu.name" . }}-metrics-scraper
{{- end -}}
