{{/* The chart's name, or nameOverride. */}}
{{- define "coreserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: fullnameOverride, else the release name (with the chart's name unless it holds it already). */}}
{{- define "coreserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels every object carries. */}}
{{- define "coreserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "coreserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The labels that find the server's pods (the Deployment's, Service's, budget's and ServiceMonitor's selectors). */}}
{{- define "coreserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coreserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/* The ServiceAccount the pods run as ("" for the namespace's default). */}}
{{- define "coreserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "coreserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository:tag, or repository@digest where a digest is given. */}}
{{- define "coreserve.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The storage a remote repository URL names ("s3", "gcs", "azure"), or "" for a claim. */}}
{{- define "coreserve.remoteKind" -}}
{{- $url := .Values.modelRepository.url | default "" }}
{{- if hasPrefix "s3://" $url }}s3
{{- else if hasPrefix "gs://" $url }}gcs
{{- else if hasPrefix "as://" $url }}azure
{{- end }}
{{- end }}

{{/*
Refuses what the schema cannot say with a clear message: the repository is a claim or a URL,
exactly one of them; credentials belong to the storage the URL names.
*/}}
{{- define "coreserve.validate" -}}
{{- $repository := .Values.modelRepository }}
{{- $claim := $repository.persistentVolumeClaim.claimName | default "" }}
{{- $url := $repository.url | default "" }}
{{- if and $url (not (regexMatch "^(s3|gs|as)://[^/]" $url)) }}
{{- fail (printf "modelRepository.url: %s is not a repository coreserve reads: s3://BUCKET/PATH (or s3://HOST:PORT/BUCKET/PATH), gs://BUCKET/PATH or as://ACCOUNT/CONTAINER/PATH" $url) }}
{{- end }}
{{- if and $claim $url }}
{{- fail (printf "modelRepository: both a claim (persistentVolumeClaim.claimName=%s) and a URL (url=%s) are set; give one: set persistentVolumeClaim.claimName to \"\" to read the URL" $claim $url) }}
{{- end }}
{{- if not (or $claim $url) }}
{{- fail "modelRepository: neither a claim (persistentVolumeClaim.claimName) nor a URL (url: s3://, gs:// or as://) is set; give one" }}
{{- end }}
{{- with .Values.autoscaling }}
{{- if and .enabled (lt (int .maxReplicas) (int .minReplicas)) }}
{{- fail (printf "autoscaling: maxReplicas (%d) is below minReplicas (%d)" (int .maxReplicas) (int .minReplicas)) }}
{{- end }}
{{- end }}
{{- $kind := include "coreserve.remoteKind" . }}
{{- range $storage := list "s3" "gcs" "azure" }}
{{- if and (index $repository $storage).secretName (ne $kind $storage) }}
{{- fail (printf "modelRepository.%s.secretName is set, but the repository is %s: credentials for %s are read only with a %s URL" $storage (ternary (printf "the URL %s" $url) (printf "the claim %s" $claim) (ne $url "")) $storage (get (dict "s3" "s3://" "gcs" "gs://" "azure" "as://") $storage)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Flags both the Deployment's and the KServe runtime's containers take after their own. */}}
{{- define "coreserve.commonArgs" -}}
- --exit-timeout-secs={{ .Values.server.exitTimeoutSecs }}
- --log-format={{ .Values.server.logFormat }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
