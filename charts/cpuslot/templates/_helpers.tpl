{{/* Names and labels. */}}

{{- define "cpuslot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cpuslot.fullname" -}}
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

{{- define "cpuslot.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cpuslot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cpuslot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{- define "cpuslot.labels" -}}
helm.sh/chart: {{ include "cpuslot.chart" . }}
{{ include "cpuslot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: cpuslot
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "cpuslot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cpuslot.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "cpuslot.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}

{{/* A CPU quantity as a string: --set admission.budget=2 gives a number. */}}
{{- define "cpuslot.quantity" -}}
{{- . | toString | quote -}}
{{- end -}}

{{/* The agent's configuration file (docs/agent.example.yaml format). */}}
{{- define "cpuslot.config" -}}
# cpuslot node agent configuration, rendered by the cpuslot chart from its
# values (docs/agent.example.yaml). Node name: env NODE_NAME.
apiVersion: agent.cpuslot.dev/v1alpha1
kind: AgentConfig
{{- /* BEGIN generated from internal/settings by `make settings-doc`; do not edit */}}
http: {{ printf "0.0.0.0:%d" (int .Values.metrics.port) | quote }}
debugPoolsRemote: {{ .Values.metrics.debugPoolsRemote }}
logLevel: {{ .Values.logLevel }}
reapInterval: {{ .Values.reapInterval | quote }}
maxContainers: {{ int .Values.maxContainers }}
pool:
  prewarm: {{ .Values.pool.prewarm | quote }}
  mode: {{ .Values.pool.mode }}
  limit: {{ .Values.pool.limit }}
  period: {{ .Values.pool.period | quote }}
  maxSlots: {{ int .Values.pool.maxSlots }}
  idleTimeout: {{ .Values.pool.idleTimeout | quote }}
  defaultWait: {{ .Values.pool.defaultWait | quote }}
  maxWait: {{ .Values.pool.maxWait | quote }}
  maxQuota: {{ include "cpuslot.quantity" .Values.pool.maxQuota }}
  maxActions: {{ int .Values.pool.maxActions }}
admission:
  budget: {{ include "cpuslot.quantity" .Values.admission.budget }}
  overcommit: {{ .Values.admission.overcommit }}
  lendRatio: {{ .Values.admission.lendRatio }}
  policy: {{ .Values.admission.policy }}
  minDegraded: {{ include "cpuslot.quantity" .Values.admission.minDegraded }}
limits:
  maxConnections: {{ int .Values.limits.maxConnections }}
  maxConnectionsPerContainer: {{ int .Values.limits.maxConnectionsPerContainer }}
  maxPendingHelloPerUID: {{ int .Values.limits.maxPendingHelloPerUID }}
  maxPendingHelloPerCgroup: {{ int .Values.limits.maxPendingHelloPerCgroup }}
  maxConnectionsPerProcess: {{ int .Values.limits.maxConnectionsPerProcess }}
  acceptRate: {{ int .Values.limits.acceptRate }}
  acceptBurst: {{ int .Values.limits.acceptBurst }}
  sharedAcceptRate: {{ int .Values.limits.sharedAcceptRate }}
  placementRate: {{ int .Values.limits.placementRate }}
  helloTimeout: {{ .Values.limits.helloTimeout | quote }}
  frameTimeout: {{ .Values.limits.frameTimeout | quote }}
kubernetes:
  containerdSocket: {{ .Values.kubernetes.containerdSocket | quote }}
  containerdNamespace: {{ .Values.kubernetes.containerdNamespace | quote }}
  podsDir: {{ .Values.kubernetes.podsDir | quote }}
  socketVolume: {{ .Values.kubernetes.socketVolume | quote }}
  select: {{ toJson .Values.kubernetes.select }}
  annotationCeilings:
    maxSlots: {{ int .Values.kubernetes.annotationCeilings.maxSlots }}
    prewarmSlots: {{ int .Values.kubernetes.annotationCeilings.prewarmSlots }}
    overcommit: {{ .Values.kubernetes.annotationCeilings.overcommit }}
    lendRatio: {{ .Values.kubernetes.annotationCeilings.lendRatio }}
    budget: {{ include "cpuslot.quantity" .Values.kubernetes.annotationCeilings.budget }}
  nri:
    enabled: {{ .Values.nri.enabled }}
    socket: {{ .Values.nri.socket | quote }}
    startTimeout: {{ .Values.nri.startTimeout | quote }}
{{- /* END generated */}}
{{- end -}}
