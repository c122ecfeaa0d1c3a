{{/*
Names, labels and the pieces the router's and the workers' pods share.
Every template keeps to what tests/deploy/chart/render implements of Helm
(include, tpl, required, toYaml and Sprig).
*/}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object's name; short enough for "-prefill" and
"-decode" to fit Kubernetes' 63 characters. */}}
{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tandem.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tandem
{{- end }}

{{/* Labels of one component: (dict "root" $ "component" "router"). */}}
{{- define "tandem.componentLabels" -}}
{{ include "tandem.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tandem.componentSelector" -}}
{{ include "tandem.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The headless Service of a worker pool, and the host:port the router
dials (one worker per address the name resolves to). */}}
{{- define "tandem.poolService" -}}
{{ include "tandem.fullname" .root }}-{{ .pool }}
{{- end }}

{{- define "tandem.poolTarget" -}}
{{- $values := index .root.Values .pool -}}
{{ include "tandem.poolService" . }}.{{ .root.Release.Namespace }}.svc.{{ .root.Values.clusterDomain }}:{{ $values.port }}
{{- end }}

{{/* Whether the prefill pool exists ("true" or ""). */}}
{{- define "tandem.prefillEnabled" -}}
{{- if .Values.prefill.enabled }}true{{ end }}
{{- end }}

{{- define "tandem.image" -}}
{{- $repository := ternary .root.Values.image.cudaRepository .root.Values.image.repository (gt (int .gpus) 0) -}}
{{ $repository }}:{{ default .root.Chart.AppVersion .root.Values.image.tag }}
{{- end }}

{{/* The model's path inside the container: --model. */}}
{{- define "tandem.modelPath" -}}
{{- if .Values.model.path }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.path) }}
{{- else }}
{{- .Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* The model's volume. */}}
{{- define "tandem.modelVolume" -}}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required with model.source=pvc: name the claim that holds the model" .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
  hostPath:
    path: {{ required "model.hostPath.path is required with model.source=hostPath: the model's folder on the nodes" .Values.model.hostPath.path }}
    type: {{ .Values.model.hostPath.type }}
{{- else if eq .Values.model.source "initContainer" }}
  emptyDir:
    {{- with .Values.model.initContainer.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- else }}
{{- fail (printf "model.source is %q: it must be pvc, hostPath or initContainer" .Values.model.source) }}
{{- end }}
{{- end }}

{{- define "tandem.modelMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}

{{/* The init container that fills the model's emptyDir, if that is the
source. */}}
{{- define "tandem.modelInitContainers" -}}
{{- if eq .Values.model.source "initContainer" }}
{{- $init := .Values.model.initContainer }}
initContainers:
  - name: fetch-model
    image: {{ required "model.initContainer.image is required with model.source=initContainer" $init.image }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    {{- with $init.command }}
    command:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $init.args }}
    args:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    env:
      - name: MODEL_DIR
        value: {{ include "tandem.modelPath" . | quote }}
      {{- with $init.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- with $init.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: model
        mountPath: {{ .Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* Flags from a values map, --name=value each, in name order. YAML
numbers arrive as floats: whole ones are written as integers (not 1.6e+07). */}}
{{- define "tandem.flagArgs" -}}
{{- range $name, $value := . }}
{{- $text := toString $value }}
{{- if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
{{- $text = int64 $value | toString }}
{{- end }}
- {{ printf "--%s=%s" $name $text | quote }}
{{- end }}
{{- end }}

{{/* A preStop hook that sleeps, if asked for. */}}
{{- define "tandem.preStop" -}}
{{- if gt (int .) 0 }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ . }}
{{- end }}
{{- end }}

{{/* Probes on grpc.health.v1: (dict "port" 8200 "service" "" "tls" false
"startupSeconds" 600 "readyService" ""). Kubelet's gRPC probe speaks no TLS,
so a TLS listener is probed by a TCP connect. */}}
{{- define "tandem.probes" -}}
{{- if .tls }}
startupProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 5
  failureThreshold: {{ div .startupSeconds 5 }}
readinessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 5
livenessProbe:
  tcpSocket: {port: {{ .port }}}
  periodSeconds: 10
  failureThreshold: 3
{{- else }}
startupProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: 5
  failureThreshold: {{ div .startupSeconds 5 }}
readinessProbe:
  grpc:
    port: {{ .port }}
    {{- with .readyService }}
    service: {{ . }}
    {{- end }}
  periodSeconds: 5
livenessProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: 10
  failureThreshold: 3
{{- end }}
{{- end }}

{{/* A duration of the values (500ms, 2s, 1m, 1h) in seconds, as a
number; empty for an empty one. */}}
{{- define "tandem.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "ms" $d }}{{ divf (trimSuffix "ms" $d) 1000 }}
{{- else if hasSuffix "s" $d }}{{ trimSuffix "s" $d | float64 }}
{{- else if hasSuffix "m" $d }}{{ mulf (trimSuffix "m" $d) 60 }}
{{- else if hasSuffix "h" $d }}{{ mulf (trimSuffix "h" $d) 3600 }}
{{- end }}
{{- end }}

{{/* The label selector of the alert rules: alerts.selector, or this
release's series as the ServiceMonitor labels them: the namespace, and the
job of each Service it scrapes (FULLNAME-router, -prefill, -decode and
-planner; another release's FULLNAME-x-router does not match). */}}
{{- define "tandem.alertSelector" -}}
{{- if .Values.alerts.selector }}
{{- .Values.alerts.selector }}
{{- else }}
{{- $full := include "tandem.fullname" . }}
{{- printf "namespace=%q,job=~%q" .Release.Namespace (printf "%s-[a-z]+" $full) }}
{{- end }}
{{- end }}
