"""Packed rows' blockwise attention on XLA:CPU, each choice side by side with the one it replaced, in one process
(alternating runs, medians), SmolLM2-135M's shapes (9 query heads over 3 kv heads of 64, 30 layers), rows packed
with step-samples of 395-484 tokens as one ScienceWorld update measured them:

- `rows`: one layer's attention (models/attention.blockwise_causal_attention, tiles of 128) over the re-score's
  rows (8 x 896 in two segments, 4 x 1920 in four) and an update micro-batch's (2 x 896), forward and forward +
  backward, with spec.PACKED_ROWS_PER_STEP rows per step against all rows at once;
- `remat`: the gradient of the 30-layer packed forward over one update micro-batch (2 x 896) under remat, the
  attention's output and lse kept (attention.SAVED_UNDER_REMAT) against recomputed.

  python -m benchmarks.packed_attention [--runs 5]
"""
from __future__ import annotations

import argparse

import numpy as np

from benchmarks import common

SHAPES = {"rescore_8x896": (8, 896, 2), "rescore_4x1920": (4, 1920, 4), "update_2x896": (2, 896, 2)}


def packed_segments(rows: int, length: int, per_row: int, seed: int = 0):
  """(segment ids, positions) [rows, length]: `per_row` sequences of 395-484 tokens from the left, then padding."""
  rng = np.random.default_rng(seed)
  seg, pos = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.int32)
  for r in range(rows):
    start = 0
    for s in range(per_row):
      n = min(int(rng.integers(395, 485)), length - start)
      seg[r, start:start + n], pos[r, start:start + n] = s + 1, np.arange(n)
      start += n
  return seg, pos


def alternate(fns: dict, runs: int) -> dict[str, float]:
  """Median seconds of each blocking thunk, the thunks run in turn `runs` times (after one warm call each)."""
  for f in fns.values():
    f()
  times = {k: [] for k in fns}
  for _ in range(runs):
    for k, f in fns.items():
      times[k] += common.timed(f, 1)
  return {k: common.median(v) for k, v in times.items()}


def bench_rows(spec, runs: int) -> dict:
  import jax
  import jax.numpy as jnp
  from seed_jax.models import attention
  from seed_jax.models.spec import PACKED_BLOCK, PACKED_ROWS_PER_STEP
  K, G, h = spec.n_kv_heads, spec.n_heads // spec.n_kv_heads, spec.head_dim
  out = {}
  for name, (B, T, per_row) in SHAPES.items():
    seg = jnp.asarray(packed_segments(B, T, per_row)[0])
    keys = jax.random.split(jax.random.key(B * T), 3)
    q, k, v = (jax.random.normal(key, shape) for key, shape in zip(keys, ((B, T, K, G, h), (B, T, K, h), (B, T, K, h))))
    attend = lambda r: (lambda q, k, v: attention.blockwise_causal_attention(q, k, v, seg, block=PACKED_BLOCK,
                                                                            rows_per_step=r))
    fns = {}
    for r in (0, PACKED_ROWS_PER_STEP):
      fwd = jax.jit(attend(r))
      grad = jax.jit(jax.grad(lambda q, k, v, f=attend(r): jnp.sum(f(q, k, v) ** 2), (0, 1, 2)))
      fns[f"forward_rows{r}"] = lambda f=fwd: jax.block_until_ready(f(q, k, v))
      fns[f"forward_backward_rows{r}"] = lambda f=grad: jax.block_until_ready(f(q, k, v))
    t = alternate(fns, runs)
    out[name] = {k: round(v * 1e3, 1) for k, v in t.items()}
    for kind in ("forward", "forward_backward"):
      out[name][f"{kind}_all_over_steps"] = round(t[f"{kind}_rows0"] / t[f"{kind}_rows{PACKED_ROWS_PER_STEP}"], 3)
  return out


def bench_remat(spec, runs: int) -> dict:
  import jax
  import jax.numpy as jnp
  from seed_jax.models import attention
  from seed_jax.models import transformer as tf
  spec = spec.for_packed_rows()
  params = tf.init_params(spec, 0)
  B, T, per_row = SHAPES["update_2x896"]
  seg, pos = (jnp.asarray(x) for x in packed_segments(B, T, per_row))
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, spec.vocab_size, (B, T)), jnp.int32)
  loss = lambda p: jnp.mean(tf.forward(p, spec, tokens, pos, seg, remat=True)[0] ** 2)
  fns, saved = {}, attention.SAVED_UNDER_REMAT
  for name, names in (("attention_saved", saved), ("attention_recomputed", ())):
    attention.SAVED_UNDER_REMAT = names  # read when the gradient is traced (here, by `lower`)
    grad = jax.jit(jax.grad(loss)).lower(params).compile()
    fns[name] = lambda g=grad: jax.block_until_ready(g(params))
  attention.SAVED_UNDER_REMAT = saved
  t = alternate(fns, runs)
  return dict({f"{k}_s": round(v, 3) for k, v in t.items()},
              recomputed_over_saved=round(t["attention_recomputed"] / t["attention_saved"], 3))


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--runs", type=int, default=5)
  a = p.parse_args()
  from seed_jax.models import load
  spec, _ = load.load_model("embedded")  # config.model.attention="auto": packed rows as the pipeline runs them
  load_start = common.load_avg()
  out = dict(bench="packed_attention", cpu=common.cpu_model(), model="SmolLM2-135M", runs=a.runs,
             matmul_peak_gflops=round(common.matmul_peak_gflops(), 1))
  out["rows_ms"] = bench_rows(spec, a.runs)
  out["remat_update_micro_batch"] = bench_remat(spec, max(3, a.runs // 2))
  out["load_avg"] = dict(start=load_start, end=common.load_avg())
  common.emit(out)


if __name__ == "__main__":
  main()
