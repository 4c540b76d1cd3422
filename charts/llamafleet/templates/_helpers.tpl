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

{{/*
The Secret the operator writes into each fleet namespace, holding that namespace's agent token (derived
from the master above: llamafleet_core/agent_tokens.py). Fleet pods mount it; they never see the master.
*/}}
{{- define "llamafleet.fleetTokenSecret" -}}
{{- printf "%s-fleet-agent-token" (include "llamafleet.fullname" .) }}
{{- end }}

{{/* The membership signing key (key `key`): the operator's and the gateway's only. */}}
{{- define "llamafleet.membershipKeySecret" -}}
{{- default (printf "%s-membership-key" (include "llamafleet.fullname" .)) .Values.membershipKey.existingSecret }}
{{- end }}

{{/* The membership key's volume (part `volume`) or mount (part `mount`), for the operator and the gateway. */}}
{{- define "llamafleet.membershipKeyMount" -}}
{{- if eq .part "mount" }}
- {name: membership-key, mountPath: /var/run/secrets/llamafleet/membership-key, readOnly: true}
{{- else }}
- name: membership-key
  secret:
    secretName: {{ include "llamafleet.membershipKeySecret" .ctx }}
    items: [{key: key, path: key}]
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "llamafleet.redisAuthSecret" -}}
{{- default (printf "%s-redis-auth" (include "llamafleet.fullname" .)) .Values.redis.auth.existingSecret }}
{{- end }}

{{- define "llamafleet.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "llamafleet.fullname" .)) .Values.gateway.apiKeys.existingSecret }}
{{- end }}

{{/* Namespaces the operator reconciles (namespace scope): the list, or the release namespace. */}}
{{- define "llamafleet.watchNamespaces" -}}
{{- $list := .Values.operator.watchNamespaces | default (list .Release.Namespace) }}
{{- join "," (uniq $list) }}
{{- end }}

{{/*
The Redis URL as env var entries (name given): plain value, or from the user's Secret. The bundled Redis's
password comes from its Secret into LLAMAFLEET_REDIS_PASSWORD, and the URL refers to it as
$(LLAMAFLEET_REDIS_PASSWORD): the kubelet expands it, so the password is in no ConfigMap, argument or
pod spec. With TLS the URL is rediss:// and names the CA the container mounts (llamafleet.redisTlsMount).
*/}}
{{- define "llamafleet.redisEnv" -}}
{{- $v := .ctx.Values.redis -}}
{{- if and $v.enabled $v.auth.enabled -}}
- name: LLAMAFLEET_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "llamafleet.redisAuthSecret" .ctx }}
      key: {{ $v.auth.existingSecretKey }}
{{ end -}}
- name: {{ .name }}
{{- if $v.enabled }}
  {{- $auth := ternary ":$(LLAMAFLEET_REDIS_PASSWORD)@" "" $v.auth.enabled }}
  {{- $scheme := ternary "rediss" "redis" $v.tls.enabled }}
  {{- $query := ternary "?ssl_ca_certs=/var/run/secrets/llamafleet/redis-tls/ca.crt" "" $v.tls.enabled }}
  value: {{ printf "%s://%s%s.%s.svc:6379/0%s" $scheme $auth (include "llamafleet.redisName" .ctx) .ctx.Release.Namespace $query | quote }}
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

{{/* The bundled Redis's CA for clients, when it serves TLS: a volumeMount and a volume (pick one with "part"). */}}
{{- define "llamafleet.redisTlsMount" -}}
{{- $v := .ctx.Values.redis }}
{{- if and $v.enabled $v.tls.enabled }}
{{- if eq .part "mount" -}}
- {name: redis-tls, mountPath: /var/run/secrets/llamafleet/redis-tls, readOnly: true}
{{- else -}}
- name: redis-tls
  secret:
    secretName: {{ $v.tls.existingSecret }}
    items: [{key: ca.crt, path: ca.crt}]
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end }}

{{- define "llamafleet.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end }}
{{- define "llamafleet.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end }}

{{/*
The operator's Secret rules: it writes each fleet namespace's agent-token Secret (reconcile/tokens.py), so
`get` and `patch` on that one name only; `create` cannot be limited by name (the name is not in the request
URL), and lets it read nothing.
*/}}
{{- define "llamafleet.operatorSecretRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "patch"]
  resourceNames: [{{ include "llamafleet.fleetTokenSecret" . | quote }}]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
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

{{- /* metrics.prometheus as a JSON list of one NetworkPolicyPeer (only the selectors given), or "". */ -}}
{{- define "llamafleet.metricsPeers" -}}
{{- $p := .Values.metrics.prometheus }}
{{- $peer := dict }}
{{- with $p.namespaceSelector }}{{ $_ := set $peer "namespaceSelector" . }}{{ end }}
{{- with $p.podSelector }}{{ $_ := set $peer "podSelector" . }}{{ end }}
{{- if $peer }}{{ list $peer | toJson }}{{ end }}
{{- end }}

{{- /* The Secrets the chart generates because the values give none, as `- value: what` lines (secrets.yaml). */ -}}
{{- define "llamafleet.generatedSecrets" -}}
{{- if not (or .Values.agentToken.existingSecret .Values.agentToken.value) }}
- agentToken.existingSecret: the master agent token (Secret key `token`)
{{- end }}
{{- if not (or .Values.membershipKey.existingSecret .Values.membershipKey.value) }}
- membershipKey.existingSecret: the fleet membership signing key (key `key`)
{{- end }}
{{- $r := .Values.redis }}
{{- if and $r.enabled $r.auth.enabled (not $r.auth.existingSecret) }}
- redis.auth.existingSecret: the bundled Redis's password (key `password`)
{{- end }}
{{- $k := .Values.gateway.apiKeys }}
{{- if and .Values.gateway.enabled $k.enabled (not $k.existingSecret) (not $k.keys) }}
- gateway.apiKeys.existingSecret: the gateway's API keys (key `api-keys`, one name:key line each)
{{- end }}
{{- end }}

{{- /* Annotations of a generated Secret (the argument: whether it is generated), as YAML. */ -}}
{{- define "llamafleet.keepGenerated" -}}
{{- if . }}helm.sh/resource-policy: keep{{ end }}
{{- end }}
