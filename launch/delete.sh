#!/usr/bin/env bash
# Deletes the TPU VM / pod slice (billing stops). Copy results off the workers first, e.g.
#   gcloud compute tpus tpu-vm scp --recurse "$TPU_NAME:~/seed_jax/runs" . --worker=0 --zone="$ZONE"
set -euo pipefail
source "$(dirname "$0")/env.sh"

tpu_vm delete "${TPU_NAME}" --quiet
