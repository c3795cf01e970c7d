"""Helpers shared by the scaling tests: weights drawn with numpy (no per-op XLA compiles, which cost seconds
per weight on a busy CPU) and a random mini-batch of step-samples."""
from __future__ import annotations

import numpy as np

from seed_jax import batch
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec


def numpy_params(spec: ModelSpec, seed: int = 0) -> dict:
  """fp32 weights like transformer.init_params (normal * 0.02; norms near 1; small biases), as numpy."""
  rng = np.random.default_rng(seed)

  def make(name, shape):
    if name.endswith("norm"):
      return (1 + 0.1 * rng.normal(size=shape)).astype(np.float32)
    scale = 0.1 if name in ("bq", "bk", "bv") else 0.02
    return (scale * rng.normal(size=shape)).astype(np.float32)

  shapes = tf.param_shapes(spec)
  out = {k: make(k, s) for k, s in shapes.items() if k != "layers"}
  out["layers"] = {k: make(k, s) for k, s in shapes["layers"].items()}
  return out


def random_minibatch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0) -> batch.MiniBatch:
  """Ragged left-padded prompts, right-padded responses, the last two rows padding (no response tokens)."""
  rng = np.random.default_rng(seed)
  pvalid = np.arange(prompt)[None] >= rng.integers(1, prompt, rows)[:, None]
  rmask = np.arange(response)[None] < rng.integers(1, response + 1, rows)[:, None]
  rmask[-2:] = False
  logp = lambda: ((-5 + 0.1 * rng.normal(size=(rows, response))) * rmask).astype(np.float32)
  return batch.MiniBatch(
      prompt_BP=rng.integers(0, vocab, (rows, prompt)).astype(np.int32), pvalid_BP=pvalid,
      resp_BR=rng.integers(0, vocab, (rows, response)).astype(np.int32), rmask_BR=rmask, old_logp_BR=logp(),
      adv_B=rng.normal(size=rows).astype(np.float32), ref_logp_BR=logp(), skill_logp_BR=logp(),
      opd_mask_B=rng.random(rows) < 0.5)
