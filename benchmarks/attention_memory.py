"""Memory of SmolLM2-135M's cache-less forward (hidden states) and of its training gradient at batch x seq, per
attention implementation: XLA's compiled temporary bytes (the peak working set of the program beyond its inputs
and outputs, from the compiler's buffer assignment, so it does not depend on the machine's load). Prints one
JSON line with the ratios against "blocked".

  python -m benchmarks.attention_memory [--batch 16] [--seq 4096]
"""
from __future__ import annotations

import argparse
import dataclasses

from benchmarks import common


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=4096)
  a = p.parse_args()
  import jax
  import jax.numpy as jnp
  from seed_jax.models import transformer as tf
  from seed_jax.models import load
  spec, _ = load.load_model("embedded")
  params = jax.eval_shape(lambda: tf.init_params(spec, 0))  # shapes only: nothing is allocated or run
  tokens = jax.ShapeDtypeStruct((a.batch, a.seq), jnp.int32)
  out = dict(bench="attention_memory", model="SmolLM2-135M", batch=a.batch, seq=a.seq, dtype="float32")
  for impl in ("blocked", "xla_blockwise"):
    s = dataclasses.replace(spec, attention=impl)
    fwd = lambda p, t, s=s: tf.forward(p, s, t, t, t)[0]
    grad = jax.grad(lambda p, t, s=s: jnp.sum(tf.forward(p, s, t, t, t, remat=True)[0]))
    mib = lambda f: round(jax.jit(f).lower(params, tokens).compile().memory_analysis().temp_size_in_bytes / 2**20)
    out[impl] = dict(forward_temp_mib=mib(fwd), gradient_temp_mib=mib(grad))
  for k in ("forward_temp_mib", "gradient_temp_mib"):
    out[k.replace("_mib", "_blocked_over_blockwise")] = round(out["blocked"][k] / out["xla_blockwise"][k], 2)
  common.emit(out)


if __name__ == "__main__":
  main()
