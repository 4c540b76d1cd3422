{{/*
What a LlamaFleet may ask of the cluster (admission.* values), for the operator (env, read by
OperatorSettings: lists as JSON) and for the ValidatingAdmissionPolicy (templates/admission.yaml).
The agent image defaults to this chart's own image repository, by any tag or digest.
*/}}
{{- define "llamafleet.agentImagePatterns" -}}
{{- $patterns := .Values.admission.agentImages }}
{{- if not $patterns }}
{{- $patterns = list (printf "%s([:@].*)?" (regexQuoteMeta .Values.image.repository)) }}
{{- end }}
{{- toJson $patterns }}
{{- end }}

{{- define "llamafleet.admissionEnv" -}}
{{- $a := .Values.admission -}}
- name: LLAMAFLEET_OPERATOR_ALLOWED_HOST_PATHS
  value: {{ toJson $a.hostPathPrefixes | quote }}
- name: LLAMAFLEET_OPERATOR_ALLOWED_IMAGES
  value: {{ toJson $a.images | quote }}
- name: LLAMAFLEET_OPERATOR_ALLOWED_AGENT_IMAGES
  value: {{ include "llamafleet.agentImagePatterns" . | quote }}
- name: LLAMAFLEET_OPERATOR_ALLOWED_EXTRA_ARGS
  value: {{ toJson $a.extraArgs | quote }}
- name: LLAMAFLEET_OPERATOR_ALLOW_CONTROL_PLANE
  value: {{ $a.controlPlane | quote }}
{{- end }}
