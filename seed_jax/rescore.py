"""Log-probs and entropies of given responses under one or several prompt contexts, in one batched forward.

`rescore` stacks C contexts into C*B rows of one `response_logprobs` forward (models/logprobs.py, the core the
update step also differentiates); `Rescorer` is its host wrapper: ragged ids in, bucketed row batches out.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from seed_jax.buckets import CompileCounter, TokenCount, bucket, pow2_sizes
from seed_jax.models.logprobs import response_logprobs
from seed_jax.models.spec import ModelSpec

log = logging.getLogger(__name__)


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "chunk", "with_entropy"))
def rescore(params, prompt_CBP, pvalid_CBP, resp_BR, rmask_BR, temperature, *, spec: ModelSpec, dtype, chunk: int,
            with_entropy: bool = True):
  """The same responses under C contexts (e.g. ordinary and skill-augmented prompts) in ONE forward pass
  over the C*B stacked rows. Returns logp_CBR and entropy_CBR (0 on padding)."""
  C, B, Pn = prompt_CBP.shape
  tile = lambda x: jnp.broadcast_to(x[None], (C,) + x.shape).reshape((C * B,) + x.shape[1:])
  logp, ent = response_logprobs(params, spec, prompt_CBP.reshape(C * B, Pn), pvalid_CBP.reshape(C * B, Pn),
                                tile(resp_BR), tile(rmask_BR), temperature, dtype=dtype, chunk=chunk,
                                with_entropy=with_entropy)
  return logp.reshape(C, B, -1), ent.reshape(C, B, -1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RescorerConfig:
  """max_rows, vocab_chunk and dtype have their defaults in config.rescore (configs/base.py) only."""
  max_rows: int  # rows (contexts x samples) per forward; more run as several passes
  min_len_bucket: int = 64
  max_prompt_len: int = 4096
  max_response_len: int = 1024
  vocab_chunk: int  # response positions per vocabulary-projection chunk
  dtype: str


class Rescorer:
  """Host wrapper: pads ragged prompts/responses into bucketed arrays and runs `rescore` in row batches.

  `tokens` sums what the passes cost: contexts x rows bucket x (prompt bucket + response bucket) positions
  against the real prompt and response lengths of every context's rows."""

  def __init__(self, spec: ModelSpec, pad_id: int, cfg: RescorerConfig, mesh=None):
    self.spec, self.pad_id, self.cfg, self.mesh = spec, pad_id, cfg, mesh
    data = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    self.row_sizes = pow2_sizes(data, max(cfg.max_rows, data))
    self.prompt_sizes = pow2_sizes(min(cfg.min_len_bucket, cfg.max_prompt_len), cfg.max_prompt_len)
    self.resp_sizes = pow2_sizes(min(cfg.min_len_bucket, cfg.max_response_len), cfg.max_response_len)
    self.compiles = CompileCounter()
    self.tokens = TokenCount()

  def score(self, params, contexts: Sequence[Sequence[Sequence[int]]], responses: Sequence[Sequence[int]],
            temperature: float, with_entropy: bool = False) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """contexts[c][i]: prompt ids of sample i under context c; responses[i]: its response ids.
    Returns per-context, per-sample arrays of log-probs and entropies (each of len(responses[i]))."""
    C, N = len(contexts), len(responses)
    if any(len(ctx) != N for ctx in contexts):
      raise ValueError(f"every context needs one prompt per response ({N})")
    logps = [[None] * N for _ in range(C)]
    ents = [[None] * N for _ in range(C)]
    per_pass = max(1, self.row_sizes[-1] // C)
    for start in range(0, N, per_pass):
      idx = list(range(start, min(N, start + per_pass)))
      lp, en = self._score_batch(params, [[ctx[i] for i in idx] for ctx in contexts], [responses[i] for i in idx],
                                 temperature, with_entropy)
      for c in range(C):
        for j, i in enumerate(idx):
          n = len(responses[i])
          logps[c][i], ents[c][i] = lp[c, j, :n], en[c, j, :n]
    return logps, ents

  def _score_batch(self, params, contexts, responses, temperature, with_entropy):
    C, N = len(contexts), len(responses)
    B = bucket(N, self.row_sizes, "samples")
    Pn = bucket(max(len(p) for ctx in contexts for p in ctx), self.prompt_sizes, "prompt length")
    R = bucket(max(1, max(map(len, responses))), self.resp_sizes, "response length")
    prompt = np.full((C, B, Pn), self.pad_id, np.int32)
    pvalid = np.zeros((C, B, Pn), bool)
    resp = np.full((B, R), self.pad_id, np.int32)
    rmask = np.zeros((B, R), bool)
    for c, ctx in enumerate(contexts):
      for b, p in enumerate(ctx):
        if len(p) == 0:
          raise ValueError(f"prompt {b} of context {c} is empty")
        prompt[c, b, Pn - len(p):], pvalid[c, b, Pn - len(p):] = p, True
    for b, r in enumerate(responses):
      resp[b, :len(r)], rmask[b, :len(r)] = r, True
    self.tokens.add(TokenCount(prompt_forwarded=C * B * Pn, prompt_real=sum(len(p) for ctx in contexts for p in ctx),
                               response_forwarded=C * B * R, response_real=C * sum(map(len, responses)),
                               rows_forwarded=C * B, rows_real=C * N))
    chunk = min(self.cfg.vocab_chunk, R)
    static = dict(spec=self.spec, dtype=jnp.dtype(self.cfg.dtype), chunk=chunk, with_entropy=with_entropy)
    if self.compiles.see(("rescore", C, B, Pn, R, with_entropy)):
      log.info("compiling rescore: %d contexts x %d rows, prompt %d, response %d", C, B, Pn, R)
    args = (prompt, pvalid, resp, rmask)
    if self.mesh is not None:
      rows = lambda nd, lead: NamedSharding(self.mesh, P(*([None] * lead + [("data", "fsdp")] + [None] * (nd - lead - 1))))
      args = (jax.device_put(prompt, rows(3, 1)), jax.device_put(pvalid, rows(3, 1)),
              jax.device_put(resp, rows(2, 0)), jax.device_put(rmask, rows(2, 0)))
    with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
      lp, en = rescore(params, *args, jnp.float32(temperature), **static)
    return jax.device_get((lp, en))
