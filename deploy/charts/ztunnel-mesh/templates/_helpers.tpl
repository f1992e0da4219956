{{/*
Names, labels and addresses shared by the templates.
*/}}

{{/*
Labels of every object the chart creates.
*/}}
{{- define "ztunnel-mesh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: ztunnel-mesh
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
An image reference: the name as given when it contains "/" (Istio's
convention for a full reference), else [hub/]name:tag.
Called with (dict "root" $ "image" <name>).
*/}}
{{- define "ztunnel-mesh.image" -}}
{{- if contains "/" .image -}}
{{ .image }}
{{- else -}}
{{- $tag := toString (.root.Values.tag | default .root.Chart.AppVersion) -}}
{{- with .root.Values.hub }}{{ . }}/{{ end }}{{ .image }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/*
A pod's imagePullSecrets, from the Secret names in values.
*/}}
{{- define "ztunnel-mesh.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Scheduling of both DaemonSets (see values.yaml: they must share nodes).
*/}}
{{- define "ztunnel-mesh.nodeScheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The control plane's Service, host:port, as ztunnel dials it.
*/}}
{{- define "ztunnel-mesh.controlPlaneAddress" -}}
{{ .Values.controlPlane.serviceName }}.{{ .Release.Namespace }}.svc:15012
{{- end }}

{{/*
The cluster id: multiCluster.clusterName, else istiod's default.
*/}}
{{- define "ztunnel-mesh.clusterId" -}}
{{ .Values.multiCluster.clusterName | default "Kubernetes" }}
{{- end }}

{{/*
Names of cluster-scoped objects carry the release namespace, as Istio's do,
so that installs in two namespaces do not overwrite each other's roles.
Called with (list $ <base name>).
*/}}
{{- define "ztunnel-mesh.clusterScopedName" -}}
{{ index . 1 }}-{{ (index . 0).Release.Namespace }}
{{- end }}

{{/*
A DaemonSet's updateStrategy from values: rollingUpdate only with type
RollingUpdate. Helm merges a values file's updateStrategy into the
default's, so `type: OnDelete` alone would keep the default's
rollingUpdate, which the API server refuses beside OnDelete.
*/}}
{{- define "ztunnel-mesh.updateStrategy" -}}
{{- $type := .type | default "RollingUpdate" -}}
type: {{ $type }}
{{- if and (eq $type "RollingUpdate") .rollingUpdate }}
rollingUpdate:
  {{- toYaml .rollingUpdate | nindent 2 }}
{{- end }}
{{- end }}
