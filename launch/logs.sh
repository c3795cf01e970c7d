#!/usr/bin/env bash
# Follows the log of a detached run (DETACH=1 launch/run.sh). Process 0 (worker 0) writes the metrics,
# progress and checkpoints messages; WORKER=all interleaves every worker's log.
set -euo pipefail
source "$(dirname "$0")/env.sh"

tpu_vm ssh "${TPU_NAME}" --worker="${WORKER:-0}" --command="tail -n 200 -F ~/${RUN_LOG}"
