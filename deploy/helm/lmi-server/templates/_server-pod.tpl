{{/* The server pod (metadata and spec, indented for a Deployment's template): one definition for the
Deployment and for both templates of the multi-node LeaderWorkerSet. */}}
{{- define "lmi.serverPod" }}
{{- $v := .Values -}}
{{- $s := $v.server -}}
{{- $keySecret := include "lmi.apiKeySecret" . -}}
{{- $tlsTunnel := false -}}
{{- if eq $v.sharedCache.mode "external" -}}
{{- $e := include "lmi.externalCache" . | fromYaml -}}
{{- $tlsTunnel = eq $e.scheme "rediss" -}}
{{- end }}
    metadata:
      labels:
        {{- include "lmi.labels" (dict "root" . "component" "server") | nindent 8 }}
        {{- with $s.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # One configuration for every replica: a change rolls them all.
        checksum/serving: {{ include (print $.Template.BasePath "/configmap-serving.yaml") . | sha256sum }}
        checksum/lmcache: {{ include (print $.Template.BasePath "/configmap-lmcache.yaml") . | sha256sum }}
        {{- with $s.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "lmi.serverServiceAccount" . }}
      terminationGracePeriodSeconds: {{ include "lmi.drainGrace" . }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $s.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $tlsTunnel }}
      {{- $t := $v.sharedCache.external.tls }}
      {{- $e := include "lmi.externalCache" . | fromYaml }}
      initContainers:
        # Native sidecar: starts before the server, stops after it. Plain RESP on 127.0.0.1 for
        # LMCache, TLS to the shared tier.
        - name: redis-tls-tunnel
          image: "{{ $t.image.repository }}:{{ $t.image.tag }}"
          imagePullPolicy: {{ $t.image.pullPolicy }}
          restartPolicy: Always
          args:
            - client
            - --listen=127.0.0.1:{{ $t.localPort }}
            - --target={{ $e.host }}:{{ $e.port }}
            {{- with $t.serverName }}
            - --override-server-name={{ . }}
            {{- end }}
            {{- if $t.caSecret }}
            - --cacert=/etc/lmi/redis-tls/ca/{{ $t.caKey }}
            {{- end }}
            {{- if $t.clientCertSecret }}
            - --cert=/etc/lmi/redis-tls/client/tls.crt
            - --key=/etc/lmi/redis-tls/client/tls.key
            {{- else }}
            - --disable-authentication
            {{- end }}
          resources:
            {{- toYaml $t.resources | nindent 12 }}
          {{- if or $t.caSecret $t.clientCertSecret }}
          volumeMounts:
            {{- if $t.caSecret }}
            - name: redis-tls-ca
              mountPath: /etc/lmi/redis-tls/ca
              readOnly: true
            {{- end }}
            {{- if $t.clientCertSecret }}
            - name: redis-tls-client
              mountPath: /etc/lmi/redis-tls/client
              readOnly: true
            {{- end }}
          {{- end }}
      {{- end }}
      containers:
        - name: lmi-server
          image: {{ include "lmi.image" . | quote }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args:
            - serve
            - --model-dir
            - {{ include "lmi.modelDir" . }}
            - --host
            - 0.0.0.0
            - --port
            - {{ $s.port | quote }}
          ports:
            - name: http
              containerPort: {{ $s.port }}
              protocol: TCP
          env:
            # Same hash seed in every replica (and in the cache server it starts): LMCache chunk keys match.
            - name: PYTHONHASHSEED
              value: {{ $v.hashSeed | quote }}
            {{- if eq $v.model.source "hub" }}
            - name: HF_HOME
              value: /var/cache/huggingface
            {{- with $v.model.hub.tokenSecret.name }}
            - name: HF_TOKEN
              valueFrom:
                secretKeyRef:
                  name: {{ . }}
                  key: {{ $v.model.hub.tokenSecret.key }}
            {{- end }}
            {{- end }}
            {{- if eq $v.model.source "s3" }}
            - name: SERVING_DOWNLOAD_DIR
              value: /var/cache/lmi-models
            {{- end }}
            {{- if and (eq $v.sharedCache.mode "external") $v.sharedCache.external.auth.secretName }}
            {{- $a := $v.sharedCache.external.auth }}
            - name: LMCACHE_RESP_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{ $a.secretName }}
                  key: {{ $a.passwordKey }}
            {{- with $a.usernameKey }}
            - name: LMCACHE_RESP_USERNAME
              valueFrom:
                secretKeyRef:
                  name: {{ $a.secretName }}
                  key: {{ . }}
            {{- end }}
            {{- end }}
            {{- with $s.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- if and (eq $v.model.source "s3") $v.model.s3.credentialsSecret }}
          envFrom:
            - secretRef:
                name: {{ $v.model.s3.credentialsSecret }}
          {{- end }}
          startupProbe:
            httpGet:
              path: {{ $s.probes.startup.path }}
              port: http
            periodSeconds: {{ $s.probes.startup.periodSeconds }}
            failureThreshold: {{ $s.probes.startup.failureThreshold }}
            timeoutSeconds: {{ $s.probes.startup.timeoutSeconds }}
          readinessProbe:
            httpGet:
              path: {{ $s.probes.readiness.path }}
              port: http
            periodSeconds: {{ $s.probes.readiness.periodSeconds }}
            failureThreshold: {{ $s.probes.readiness.failureThreshold }}
            timeoutSeconds: {{ $s.probes.readiness.timeoutSeconds }}
          livenessProbe:
            httpGet:
              path: {{ $s.probes.liveness.path }}
              port: http
            periodSeconds: {{ $s.probes.liveness.periodSeconds }}
            failureThreshold: {{ $s.probes.liveness.failureThreshold }}
            timeoutSeconds: {{ $s.probes.liveness.timeoutSeconds }}
          lifecycle:
            preStop:
              # Leave the router's and the Services' endpoint lists before SIGTERM starts the drain.
              exec:
                command: ["sleep", {{ $s.drain.preStopSleepSeconds | quote }}]
          resources:
            {{- $res := deepCopy $s.resources }}
            {{- if gt (int $s.gpu.count) 0 }}
            {{- $limits := default dict $res.limits }}
            {{- $_ := set $limits $s.gpu.resourceName (int $s.gpu.count) }}
            {{- $_ := set $res "limits" $limits }}
            {{- end }}
            {{- toYaml $res | nindent 12 }}
          {{- with $s.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: serving
              mountPath: {{ include "lmi.modelDir" . }}
              readOnly: true
            {{- if $v.lmcache.enabled }}
            - name: lmcache
              mountPath: {{ dir (include "lmi.lmcacheFile" .) }}
              readOnly: true
            {{- end }}
            {{- if $keySecret }}
            - name: api-keys
              mountPath: {{ include "lmi.apiKeysDir" . }}
              readOnly: true
            {{- end }}
            - name: dshm
              mountPath: /dev/shm
            {{- if and $v.lmcache.enabled $v.lmcache.disk.enabled }}
            - name: kvcache
              mountPath: {{ include "lmi.kvCacheDir" . }}
            {{- end }}
            {{- if eq $v.model.source "pvc" }}
            - name: model
              mountPath: {{ $v.model.pvc.mountPath }}
              readOnly: true
            {{- else if eq $v.model.source "hub" }}
            - name: hf-cache
              mountPath: /var/cache/huggingface
            {{- else if eq $v.model.source "s3" }}
            - name: model-download
              mountPath: /var/cache/lmi-models
            {{- end }}
            {{- with $s.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: serving
          configMap:
            name: {{ include "lmi.component" (dict "root" . "name" "serving") }}
        {{- if $v.lmcache.enabled }}
        - name: lmcache
          configMap:
            name: {{ include "lmi.component" (dict "root" . "name" "lmcache") }}
        {{- end }}
        {{- if $keySecret }}
        - name: api-keys
          secret:
            secretName: {{ $keySecret }}
            items:
              - key: {{ $v.apiKeys.key }}
                path: {{ $v.apiKeys.key }}
        {{- end }}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $s.shmSize }}
        {{- if and $v.lmcache.enabled $v.lmcache.disk.enabled }}
        {{- $disk := $v.lmcache.disk }}
        - name: kvcache
          {{- if eq $disk.volume "pvc" }}
          persistentVolumeClaim:
            claimName: {{ $disk.pvc.claimName }}
          {{- else if eq $disk.volume "hostPath" }}
          hostPath:
            path: {{ $disk.hostPath.path }}
            type: DirectoryOrCreate
          {{- else }}
          emptyDir:
            # a quarter over the tier's size: the server trims it every 30 s, the kubelet evicts at once
            sizeLimit: {{ add (int $disk.sizeGiB) (div (int $disk.sizeGiB) 4) 1 }}Gi
          {{- end }}
        {{- end }}
        {{- if eq $v.model.source "pvc" }}
        - name: model
          persistentVolumeClaim:
            claimName: {{ $v.model.pvc.claimName }}
            readOnly: true
        {{- else if eq $v.model.source "hub" }}
        - name: hf-cache
          emptyDir:
            sizeLimit: {{ $v.model.hub.cacheSizeLimit }}
        {{- else if eq $v.model.source "s3" }}
        - name: model-download
          emptyDir:
            sizeLimit: {{ $v.model.s3.downloadSizeLimit }}
        {{- end }}
        {{- if $tlsTunnel }}
        {{- with $v.sharedCache.external.tls.caSecret }}
        - name: redis-tls-ca
          secret:
            secretName: {{ . }}
        {{- end }}
        {{- with $v.sharedCache.external.tls.clientCertSecret }}
        - name: redis-tls-client
          secret:
            secretName: {{ . }}
        {{- end }}
        {{- end }}
        {{- with $s.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $s.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
