{{/* Names. */}}
{{- define "llamafleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llamafleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llamafleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of one component. Selector labels are immutable on a Deployment, so they hold only name, instance
and component. `llamafleet.io/component` and `app.kubernetes.io/part-of: llamafleet` are the labels the
operator's per-fleet NetworkPolicy admits (core/llamafleet_core/labels.py): gateway and operator pods must
carry them, or they cannot reach llama-server and the agents.
Call with (dict "ctx" $ "component" "gateway").
*/}}
{{- define "llamafleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llamafleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "llamafleet.labels" -}}
{{ include "llamafleet.selectorLabels" . }}
llamafleet.io/component: {{ .component }}
app.kubernetes.io/part-of: llamafleet
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "llamafleet.chart" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Metadata block: name, namespace, labels, annotations.
(dict "ctx" $ "component" c "name" n ["namespace" ns | "cluster" true] ["labels" extra] ["annotations" extra])
*/}}
{{- define "llamafleet.metadata" -}}
name: {{ .name }}
{{- if not .cluster }}
namespace: {{ default .ctx.Release.Namespace .namespace }}
{{- end }}
labels:
  {{- include "llamafleet.labels" . | nindent 2 }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with merge (dict) (default dict .annotations) .ctx.Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "llamafleet.image" -}}
{{- $tag := default .ctx.Chart.AppVersion .image.tag }}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{- define "llamafleet.operatorName" -}}{{ include "llamafleet.fullname" . }}-operator{{- end }}
{{- define "llamafleet.gatewayName" -}}{{ include "llamafleet.fullname" . }}-gateway{{- end }}
{{- define "llamafleet.redisName" -}}{{ include "llamafleet.fullname" . }}-redis{{- end }}

{{- define "llamafleet.operatorServiceAccount" -}}
{{- default (include "llamafleet.operatorName" .) .Values.operator.serviceAccount.name }}
{{- end }}
{{- define "llamafleet.gatewayServiceAccount" -}}
{{- default (include "llamafleet.gatewayName" .) .Values.gateway.serviceAccount.name }}
{{- end }}

{{- define "llamafleet.agentTokenSecret" -}}
{{- default (printf "%s-agent-token" (include "llamafleet.fullname" .)) .Values.agentToken.existingSecret }}
{{- end }}

{{- define "llamafleet.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "llamafleet.fullname" .)) .Values.gateway.apiKeys.existingSecret }}
{{- end }}

{{/* Namespaces the operator reconciles (namespace scope): the list, or the release namespace. */}}
{{- define "llamafleet.watchNamespaces" -}}
{{- $list := .Values.operator.watchNamespaces | default (list .Release.Namespace) }}
{{- join "," (uniq $list) }}
{{- end }}

{{/* The Redis URL as an env var entry (name given): plain value, or from the user's Secret. */}}
{{- define "llamafleet.redisEnv" -}}
- name: {{ .name }}
{{- $v := .ctx.Values.redis }}
{{- if $v.enabled }}
  value: {{ printf "redis://%s.%s.svc:6379/0" (include "llamafleet.redisName" .ctx) .ctx.Release.Namespace | quote }}
{{- else if $v.external.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ $v.external.existingSecret }}
      key: {{ $v.external.existingSecretKey }}
{{- else if $v.external.url }}
  value: {{ $v.external.url | quote }}
{{- else }}
{{- fail "redis: set redis.enabled, or redis.external.url, or redis.external.existingSecret" }}
{{- end }}
{{- end }}

{{- define "llamafleet.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end }}
{{- define "llamafleet.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end }}

{{/* The operator's namespaced rules (see operator/rbac.yaml for why each is needed). */}}
{{- define "llamafleet.operatorRules" -}}
- apiGroups: ["llamafleet.io"]
  resources: ["llamafleets", "sharedprefixes"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["llamafleet.io"]
  resources: ["llamafleets/status", "sharedprefixes/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["llamafleet.io"]
  resources: ["llamafleets/finalizers", "sharedprefixes/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
