# Settings shared by the launch scripts (sourced, not run). Override any of them in the environment, e.g.
#   TPU_NAME=my-run ACCELERATOR=v5p-16 ZONE=us-east5-a launch/create.sh
# shellcheck shell=bash

: "${TPU_NAME:=seed-jax}"                    # name of the TPU VM / pod slice
: "${ZONE:=us-east5-a}"                      # a zone that offers the accelerator (v5p: us-east5-a, v5e: us-west4-a)
: "${ACCELERATOR:=v5p-8}"                    # gcloud --accelerator-type: v5p-8, v5p-16, v5litepod-16, ...
: "${RUNTIME:=v2-alpha-tpuv5}"               # TPU software version: v2-alpha-tpuv5 (v5p), v2-alpha-tpuv5-lite (v5e)
: "${REMOTE_DIR:=seed_jax}"                  # checkout folder in each worker's home directory
: "${RUN_LOG:=seed_jax_run.log}"             # log file of a detached run, in each worker's home directory
: "${PROJECT:=$(gcloud config get-value project 2>/dev/null)}"

if [[ -z "${PROJECT}" ]]; then
  echo "no Google Cloud project: set PROJECT or run 'gcloud config set project ID'" >&2
  exit 1
fi

# gcloud TPU VM command with the common flags.
tpu_vm() {
  gcloud compute tpus tpu-vm "$@" --zone="${ZONE}" --project="${PROJECT}"
}

# Runs a shell command on every worker of the slice at once (each worker's output is streamed).
on_all_workers() {
  tpu_vm ssh "${TPU_NAME}" --worker=all --command="$1"
}
