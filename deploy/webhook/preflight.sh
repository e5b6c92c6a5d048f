#!/bin/sh
# Checks what deploy/webhook/ needs before anything is applied, so a missing prerequisite
# leaves nothing half-installed (a ValidatingWebhookConfiguration with failurePolicy Fail but
# no certificate would refuse every HostPathProvisioner write with an x509 error).
#   deploy/webhook/preflight.sh && kubectl apply -k deploy/webhook/
set -eu
missing=""
for crd in certificates.cert-manager.io issuers.cert-manager.io; do
  kubectl get crd "$crd" >/dev/null 2>&1 || missing="$missing $crd"
done
if [ -n "$missing" ]; then
  echo "deploy/webhook/ needs cert-manager, which is not installed (missing CRDs:$missing)." >&2
  echo "Install cert-manager (https://cert-manager.io/docs/installation/) and run this again," >&2
  echo "or run without the webhook: deploy/ alone is a complete install (see docs/user-guide.md," >&2
  echo "\"Without cert-manager\")." >&2
  exit 1
fi
if ! kubectl get deployment -n hostpath-provisioner hostpath-provisioner-operator >/dev/null 2>&1; then
  echo "deploy/webhook/ registers a webhook the operator serves: apply deploy/ first" >&2
  echo "(kubectl apply -k deploy/)." >&2
  exit 1
fi
echo "cert-manager and the operator are present: kubectl apply -k deploy/webhook/"
