#!/usr/bin/env bash
# Copies the committed project (git HEAD) to every worker and installs it there: Java 17 for the
# simulators, a virtualenv with requirements.txt, and JAX for TPU at the version the project pins.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$(dirname "$0")/.."

archive="$(mktemp -t seed_jax.XXXXXX.tar.gz)"
trap 'rm -f "${archive}"' EXIT
git archive --format=tar.gz -o "${archive}" HEAD
tpu_vm scp "${archive}" "${TPU_NAME}:seed_jax.tar.gz" --worker=all

jax_version="$(sed -n 's/^jax==\([0-9.]*\).*/\1/p' requirements.txt)"
jax_pin="jax[tpu]${jax_version:+==${jax_version}}"
on_all_workers "set -e
  sudo apt-get update -qq && sudo apt-get install -y -qq openjdk-17-jre-headless python3-venv
  rm -rf ~/${REMOTE_DIR} && mkdir -p ~/${REMOTE_DIR} && tar -xzf ~/seed_jax.tar.gz -C ~/${REMOTE_DIR}
  cd ~/${REMOTE_DIR} && python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements.txt
  .venv/bin/pip install -q '${jax_pin}' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html
  .venv/bin/python -c 'import jax; print(jax.process_index(), jax.device_count(), jax.devices()[0].device_kind)'"
