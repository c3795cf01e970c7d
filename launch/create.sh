#!/usr/bin/env bash
# Creates the TPU VM (one host) or pod slice (several hosts) named $TPU_NAME.
#   launch/create.sh            # on-demand capacity
#   SPOT=1 launch/create.sh     # spot capacity (cheaper; may be preempted)
set -euo pipefail
source "$(dirname "$0")/env.sh"

extra=()
if [[ "${SPOT:-0}" == "1" ]]; then
  extra+=(--spot)
fi
tpu_vm create "${TPU_NAME}" --accelerator-type="${ACCELERATOR}" --version="${RUNTIME}" ${extra[@]+"${extra[@]}"}
tpu_vm describe "${TPU_NAME}" --format="value(state,acceleratorType,networkEndpoints.len())"
