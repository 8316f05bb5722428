{{/* Names, labels and the values every template derives from. */}}

{{- define "lmi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lmi.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<suffix>", within the 63 characters of a DNS label. */}}
{{- define "lmi.component" -}}
{{- printf "%s-%s" (include "lmi.fullname" .root | trunc (int (sub 62 (len .name))) | trimSuffix "-") .name -}}
{{- end -}}

{{- define "lmi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lmi.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The pods that serve HTTP: every server pod, or only the leaders of multi-node groups (LeaderWorkerSet
labels the leader worker-index 0); the Service, the router and the PodMonitor select these. */}}
{{- define "lmi.servingLabels" -}}
{{ include "lmi.selectorLabels" (dict "root" . "component" "server") }}
{{- if .Values.multiNode.enabled }}
leaderworkerset.sigs.k8s.io/worker-index: "0"
{{- end }}
{{- end -}}

{{/* What the autoscaler scales: the server Deployment, or the LeaderWorkerSet (one replica per group). */}}
{{- define "lmi.scaleTarget" -}}
{{- if .Values.multiNode.enabled -}}
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
{{- else -}}
apiVersion: apps/v1
kind: Deployment
{{- end }}
name: {{ include "lmi.component" (dict "root" . "name" "server") }}
{{- end -}}

{{- define "lmi.labels" -}}
{{ include "lmi.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: lmi-server
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "lmi.serverServiceAccount" -}}
{{- if .Values.server.serviceAccount.create -}}
{{- default (include "lmi.component" (dict "root" . "name" "server")) .Values.server.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.server.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "lmi.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Paths inside the server container. */}}
{{- define "lmi.modelDir" -}}/opt/ml/model{{- end -}}
{{- define "lmi.lmcacheFile" -}}/etc/lmi/lmcache/lmcache.yaml{{- end -}}
{{- define "lmi.apiKeysDir" -}}/etc/lmi/api-keys{{- end -}}

{{/* The API key Secret's name, or "" when no key is configured. */}}
{{- define "lmi.apiKeySecret" -}}
{{- if .Values.apiKeys.existingSecret -}}
{{- .Values.apiKeys.existingSecret -}}
{{- else if .Values.apiKeys.keys -}}
{{- include "lmi.component" (dict "root" . "name" "api-keys") -}}
{{- end -}}
{{- end -}}

{{/* The external shared tier's URL parts: scheme, host, port (a dict as YAML). */}}
{{- define "lmi.externalCache" -}}
{{- $u := urlParse .Values.sharedCache.external.url -}}
{{- $hostport := splitList ":" $u.host -}}
scheme: {{ $u.scheme }}
host: {{ first $hostport }}
port: {{ last $hostport }}
{{- end -}}

{{/* option.model_id as the server sees it. */}}
{{- define "lmi.modelId" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "pvc" -}}
{{- if $m.id -}}{{ printf "%s/%s" (trimSuffix "/" $m.pvc.mountPath) (trimPrefix "/" $m.id) }}{{- else -}}{{ $m.pvc.mountPath }}{{- end -}}
{{- else -}}
{{- $m.id -}}
{{- end -}}
{{- end -}}

{{/* The LMCache remote_url the replicas use: the in-release Valkey, the external URL, or the
     local TLS tunnel for rediss://. "" = no shared tier. */}}
{{- define "lmi.remoteUrl" -}}
{{- $sc := .Values.sharedCache -}}
{{- if eq $sc.mode "internal" -}}
{{- printf "redis://%s:%d" (include "lmi.component" (dict "root" . "name" "valkey")) (int $sc.internal.port) -}}
{{- else if eq $sc.mode "external" -}}
{{- $e := include "lmi.externalCache" . | fromYaml -}}
{{- if eq $e.scheme "rediss" -}}
{{- printf "redis://127.0.0.1:%d" (int $sc.external.tls.localPort) -}}
{{- else -}}
{{- printf "%s://%s:%v" $e.scheme $e.host $e.port -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "lmi.drainGrace" -}}
{{- $d := .Values.server.drain -}}
{{- $min := add (int $d.preStopSleepSeconds) (int $d.timeoutSeconds) -}}
{{- if kindIs "invalid" $d.terminationGracePeriodSeconds -}}
{{- add $min 30 -}}
{{- else if le (int $d.terminationGracePeriodSeconds) $min -}}
{{- fail (printf "server.drain.terminationGracePeriodSeconds=%v must exceed server.drain.preStopSleepSeconds + server.drain.timeoutSeconds (%d): Kubernetes kills the pod at the end of the grace period, cutting the drain short" $d.terminationGracePeriodSeconds $min) -}}
{{- else -}}
{{- $d.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* Cross-value checks that a JSON schema cannot express. */}}
{{- define "lmi.validate" -}}
{{- $v := .Values -}}
{{- if and (eq $v.model.source "pvc") (not $v.model.pvc.claimName) -}}
{{- fail "model.source=pvc needs model.pvc.claimName (the PersistentVolumeClaim holding the model)" -}}
{{- end -}}
{{- if and (has $v.model.source (list "hub" "s3")) (not $v.model.id) -}}
{{- fail (printf "model.source=%s needs model.id (%s)" $v.model.source (ternary "a hub id, e.g. Qwen/Qwen2.5-7B-Instruct" "an s3:// prefix, e.g. s3://my-bucket/models/qwen/" (eq $v.model.source "hub"))) -}}
{{- end -}}
{{- if and (eq $v.model.source "s3") (not (hasPrefix "s3://" $v.model.id)) -}}
{{- fail (printf "model.source=s3 needs model.id to start with s3://, got %q" $v.model.id) -}}
{{- end -}}
{{- if and (eq $v.sharedCache.mode "external") (not $v.sharedCache.external.url) -}}
{{- fail "sharedCache.mode=external needs sharedCache.external.url, e.g. redis://cache.internal:6379 or rediss://cache.internal:6379" -}}
{{- end -}}
{{- if and (ne $v.sharedCache.mode "none") (not $v.lmcache.enabled) -}}
{{- fail (printf "sharedCache.mode=%s needs lmcache.enabled=true (the shared tier is LMCache's); set sharedCache.mode=none to run without LMCache" $v.sharedCache.mode) -}}
{{- end -}}
{{- $disk := $v.lmcache.disk -}}
{{- if $disk.enabled -}}
{{- if not $v.lmcache.enabled -}}
{{- fail "lmcache.disk.enabled needs lmcache.enabled=true (the disk tier is LMCache's)" -}}
{{- end -}}
{{- if or (hasKey $v.lmcache.config "local_disk") (hasKey $v.lmcache.config "max_local_disk_size") -}}
{{- fail "lmcache.disk.enabled sets local_disk and max_local_disk_size itself: remove them from lmcache.config" -}}
{{- end -}}
{{- if and (eq $disk.volume "pvc") (not $disk.pvc.claimName) -}}
{{- fail "lmcache.disk.volume=pvc needs lmcache.disk.pvc.claimName (ReadWriteMany when several replicas share it)" -}}
{{- end -}}
{{- if and (eq $disk.volume "hostPath") (not $disk.hostPath.path) -}}
{{- fail "lmcache.disk.volume=hostPath needs lmcache.disk.hostPath.path (a directory on the node's NVMe)" -}}
{{- end -}}
{{- end -}}
{{- if and $v.metrics.podMonitor.enabled (not $v.metrics.public) (include "lmi.apiKeySecret" .) (not $v.metrics.podMonitor.bearerTokenSecret.name) -}}
{{- fail "metrics.podMonitor.enabled with API keys and metrics.public=false: give metrics.podMonitor.bearerTokenSecret (a Secret holding one key) or set metrics.public=true" -}}
{{- end -}}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas (%d) is above autoscaling.maxReplicas (%d)" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- end -}}

{{/* vllm-router's command-line arguments (the chart's tests parse them with vllm-router's own parser). */}}
{{- define "lmi.routerArgs" -}}
{{- $r := .Values.router -}}
{{- $h := $r.healthCheck -}}
- --host
- 0.0.0.0
- --port
- {{ $r.port | quote }}
- --service-discovery
- --selector
{{- range $k, $val := (include "lmi.servingLabels" . | fromYaml) }}
- {{ printf "%s=%s" $k $val }}
{{- end }}
- --service-discovery-port
- {{ .Values.server.port | quote }}
- --service-discovery-namespace
- {{ .Release.Namespace }}
- --policy
- {{ $r.policy }}
- --health-check-endpoint
- {{ $h.endpoint }}
- --health-check-interval-secs
- {{ $h.intervalSecs | quote }}
- --health-check-timeout-secs
- {{ $h.timeoutSecs | quote }}
- --health-failure-threshold
- {{ $h.failureThreshold | quote }}
- --health-success-threshold
- {{ $h.successThreshold | quote }}
- --request-timeout-secs
- {{ $r.requestTimeoutSecs | quote }}
- --prometheus-host
- 0.0.0.0
- --prometheus-port
- {{ $r.prometheusPort | quote }}
- --log-level
- {{ $r.logLevel }}
{{- range $r.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The label matchers that pick this release's replicas in Prometheus (the PodMonitor copies
     these pod labels onto every series: podTargetLabels). */}}
{{- define "lmi.promSelector" -}}
{{- printf "namespace=%q,app_kubernetes_io_instance=%q,app_kubernetes_io_component=\"server\"" .Release.Namespace .Release.Name -}}
{{- end -}}

{{/* Queue depth summed over the replicas: one query per queue. */}}
{{- define "lmi.queueQueries" -}}
vllm: {{ printf "sum(vllm:num_requests_waiting{%s})" (include "lmi.promSelector" .) | quote }}
admission: {{ printf "sum(lmi_queue_depth{%s})" (include "lmi.promSelector" .) | quote }}
{{- end -}}

{{/* The mount path of the persistent KV volume: where the server's auto plan looks, too. */}}
{{- define "lmi.kvCacheDir" -}}/mnt/kvcache{{- end -}}
