{{/* Names and labels shared by every template. */}}

{{- define "ovserve.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The operator's name: <release>-ovserve-operator, or ovserve-operator when the release is "ovserve". */}}
{{- define "ovserve.fullname" -}}
{{- if eq .Release.Name .Chart.Name -}}
{{- printf "%s-operator" .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s-operator" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ovserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ovserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "ovserve.labels" -}}
{{ include "ovserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ovserve.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (.Values.operator.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "ovserve.serverImage" -}}
{{- printf "%s:%s" .Values.server.image.repository (.Values.server.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Resources the operator reaches that are cluster-scoped: granted by a ClusterRole in either mode. */}}
{{- define "ovserve.clusterScoped" -}}
customresourcedefinitions namespaces clusterkopfpeerings
{{- end -}}

{{/*
The rules of files/rbac-rules.yaml (a copy of operator/rbac.yaml), keeping in each rule only the
resources whose scope is .scope ("cluster", "namespaced" or "all"); rules left empty are dropped.
*/}}
{{- define "ovserve.rules" -}}
{{- $cluster := splitList " " (include "ovserve.clusterScoped" .root) -}}
{{- $rules := (.root.Files.Get "files/rbac-rules.yaml" | fromYaml).rules -}}
{{- range $rule := $rules -}}
{{- $keep := list -}}
{{- range $r := $rule.resources -}}
{{- $isCluster := has (first (splitList "/" $r)) $cluster -}}
{{- if or (eq $.scope "all") (eq $isCluster (eq $.scope "cluster")) -}}
{{- $keep = append $keep $r -}}
{{- end -}}
{{- end -}}
{{- if $keep }}
- apiGroups: {{ toJson $rule.apiGroups }}
  resources: {{ toJson $keep }}
  verbs: {{ toJson $rule.verbs }}
{{- end -}}
{{- end -}}
{{- end -}}
