#!/usr/bin/env bash
# Tests the stock images images/build.sh built (hpp-bin/tests/images.rs): --version of every
# binary and the OCI labels; every command deploy/ and the operator's rendered pods run exists in
# its image; the CSI driver image serves a bind-mounted pool to the host's `hpp-csi-driver call`;
# the operator image renders the example CRs as the host build does; and KubeVirt's operator
# Deployment, its CSI and legacy DaemonSet containers and its mounter commands, with only the
# image changed (hpp-bin/tests/fixtures/kubevirt/), run as the kubelet would run them.
#
#   images/test.sh [--registry REG] [--tag TAG]     (same defaults as images/build.sh)
#
# Without podman the tests are skipped with a message, not failed.
set -euo pipefail
cd "$(dirname "$0")/.."

registry=${HPP_IMAGE_REGISTRY:-ghcr.io/hpp-project}
tag=${HPP_IMAGE_TAG:-latest}
while [ $# -gt 0 ]; do
    case "$1" in
        --registry) registry=$2; shift 2 ;;
        --registry=*) registry=${1#*=}; shift ;;
        --tag) tag=$2; shift 2 ;;
        --tag=*) tag=${1#*=}; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "images/test.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

if ! command -v podman >/dev/null; then
    echo "images/test.sh: SKIPPED: podman is not installed (apt-get install podman runc)"
    exit 0
fi
HPP_TEST_OPERATOR_IMAGE="$registry/hpp-operator:$tag" \
HPP_TEST_CSI_DRIVER_IMAGE="$registry/hpp-csi-driver:$tag" \
    cargo test --locked -p hpp-bin --test images -- --test-threads=2
