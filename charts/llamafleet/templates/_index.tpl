{{- /*
The prefix of every Redis key the gateway and the operator write (index, leases, membership): one value
for both, so the operator's membership and warming are what the gateway reads. Releases sharing one Redis
get different ones by default (the release name).
*/ -}}
{{- define "llamafleet.indexPrefix" -}}
{{- default .Release.Name .Values.redis.keyPrefix -}}
{{- end }}

{{- /* A map as `key<sep>value` pairs joined by commas, sorted by key (the router's list settings). */ -}}
{{- define "llamafleet.pairs" -}}
{{- $out := list }}
{{- range $k, $v := .map }}{{ $out = append $out (printf "%s%s%s" $k $.sep $v) }}{{ end }}
{{- join "," $out -}}
{{- end }}
