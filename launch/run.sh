#!/usr/bin/env bash
# Runs `python -m seed_jax.main` on every worker with the same arguments (SPMD: all workers run the same
# program; JAX joins them into one job). Arguments go to seed_jax.main unchanged, e.g.
#   launch/run.sh --config=configs/sciworld.py:paper --config.model.path=/models/Qwen2.5-7B-Instruct \
#                 --config.mesh.preset=v5p_8 --workdir=runs/sciworld-7b
# On a multi-host slice (v5p-16: --config.mesh.preset=v5p_16) each worker's process plays its share of the
# environments and supplies its rows of every device call; --workdir must be storage every worker sees.
# Foreground (default): every worker's output streams here; Ctrl-C stops the ssh sessions.
# DETACH=1: the run continues after you disconnect; follow it with launch/logs.sh.
set -euo pipefail
source "$(dirname "$0")/env.sh"

if [[ $# -eq 0 ]]; then
  echo "usage: $0 --config=configs/<env>.py[:variant] [--workdir=DIR] [--config.x=y ...]" >&2
  exit 2
fi
args="$(printf '%q ' "$@")"
main="cd ~/${REMOTE_DIR} && .venv/bin/python -m seed_jax.main ${args}--config.distributed.mode=on"
if [[ "${DETACH:-0}" == "1" ]]; then
  on_all_workers "nohup bash -c $(printf '%q' "${main}") > ~/${RUN_LOG} 2>&1 < /dev/null & echo started on \$(hostname)"
else
  on_all_workers "${main}"
fi
