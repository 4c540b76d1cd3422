{{/*
How the gateway and the operator reach fleet pods: llama-server's own API key (`podApiKey`) and the
networks pod addresses may lie in (`podNetworks`).

"llamafleet.podApiKeyEnv" (dict "ctx" $ "name" "<ENV VAR>"): the env var naming the mounted key file.
"llamafleet.podApiKeyMount" (dict "ctx" $ "part" "mount"|"volume"): its volumeMount or its volume.
"llamafleet.podNetworksEnv" (dict "ctx" $ "name" "<ENV VAR>" "json" true|false): the networks, as a
JSON list (the operator's settings) or comma-separated (the router's).

The snapshot agents' manifest-signing key is not here: each agent derives it from its namespace's agent
token, which only the agent container mounts (never llama-server's, which writes the snapshot folder).
*/}}
{{- define "llamafleet.podApiKeyEnv" -}}
{{- if .ctx.Values.podApiKey.existingSecret -}}
- name: {{ .name }}
  value: /var/run/secrets/llamafleet/pod-api-key/api-key
{{- end }}
{{- end }}

{{- define "llamafleet.podApiKeyMount" -}}
{{- $k := .ctx.Values.podApiKey }}
{{- if $k.existingSecret }}
{{- if eq .part "mount" -}}
- {name: pod-api-key, mountPath: /var/run/secrets/llamafleet/pod-api-key, readOnly: true}
{{- else -}}
- name: pod-api-key
  secret:
    secretName: {{ $k.existingSecret }}
    items: [{key: {{ $k.existingSecretKey }}, path: api-key}]
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end }}

{{- define "llamafleet.podNetworksEnv" -}}
{{- with .ctx.Values.podNetworks -}}
- name: {{ $.name }}
  value: {{ ternary (toJson .) (join "," .) $.json | quote }}
{{- end }}
{{- end }}
