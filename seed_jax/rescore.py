"""Log-probs and entropies of given responses under one or several prompt contexts, in one batched forward.

Row layout: [left padding | prompt | response | right padding], every prompt right-aligned at column P, so
the hidden state at column P-1+r predicts response token r for every row. `response_logprobs` is the shared
core (also differentiated by the update step); `rescore` stacks C contexts into C*B rows of one forward.
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

from seed_jax.buckets import CompileCounter, bucket, pow2_sizes
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec
from seed_jax.losses import entropy_from_logits_BT

log = logging.getLogger(__name__)


def response_logprobs(params, spec: ModelSpec, prompt_BP, pvalid_BP, resp_BR, rmask_BR, temperature, *, dtype,
                      chunk: int, remat: bool = False, with_entropy: bool = True):
  """Per-token log π(resp_r | prompt, resp_<r) and entropy, both of the temperature-scaled distribution.

  prompt_BP/pvalid_BP: left-padded prompt ids and validity; resp_BR/rmask_BR: right-padded responses.
  The vocabulary projection is `token_logprobs` (chunked). Returns (logp_BR, entropy_BR), 0 where rmask_BR
  is False.
  """
  B, Pn = prompt_BP.shape
  R = resp_BR.shape[1]
  tokens_BT = jnp.concatenate([prompt_BP, resp_BR], axis=1)
  valid_BT = jnp.concatenate([pvalid_BP, rmask_BR], axis=1)
  hidden_BTD, _ = tf.forward(params, spec, tokens_BT, tf.left_pad_positions(valid_BT), valid_BT.astype(jnp.int32),
                             None, dtype, remat)
  hidden_BRD = hidden_BTD[:, Pn - 1:Pn - 1 + R]
  return token_logprobs(params, spec, hidden_BRD, resp_BR, rmask_BR, temperature, dtype=dtype, chunk=chunk,
                        remat=remat, with_entropy=with_entropy)


def token_logprobs(params, spec: ModelSpec, hidden_BRD, targets_BR, mask_BR, temperature, *, dtype, chunk: int,
                   remat: bool = False, with_entropy: bool = True):
  """log π(targets_BR | hidden_BRD) and entropy of the temperature-scaled distribution, where hidden_BRD are
  final hidden states gathered at the positions that predict each target (any positions: a response block, or
  the scattered response tokens of packed SFT rows).

  The vocabulary projection runs `chunk` positions at a time (rematerialized under grad), so the full
  [B, R, V] fp32 logits never exist at once. Returns (logp_BR, entropy_BR), 0 where mask_BR is False.
  """
  B, R = targets_BR.shape
  n_chunks = -(-R // chunk)
  pad = n_chunks * chunk - R
  h_CBcD = jnp.pad(hidden_BRD, ((0, 0), (0, pad), (0, 0))).reshape(B, n_chunks, chunk, -1).swapaxes(0, 1)
  t_CBc = jnp.pad(targets_BR, ((0, 0), (0, pad))).reshape(B, n_chunks, chunk).swapaxes(0, 1)

  def one_chunk(args):
    h_BcD, t_Bc = args
    logits_BcV = tf.logits_from_hidden(params, spec, h_BcD, dtype) / temperature
    logp_Bc = jnp.take_along_axis(jax.nn.log_softmax(logits_BcV, axis=-1), t_Bc[..., None], axis=-1)[..., 0]
    ent_Bc = entropy_from_logits_BT(logits_BcV) if with_entropy else jnp.zeros_like(logp_Bc)
    return logp_Bc, ent_Bc

  if remat:
    one_chunk = jax.checkpoint(one_chunk)
  logp_CBc, ent_CBc = jax.lax.map(one_chunk, (h_CBcD, t_CBc))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(B, n_chunks * chunk)[:, :R]
  return jnp.where(mask_BR, unchunk(logp_CBc), 0.0), jnp.where(mask_BR, unchunk(ent_CBc), 0.0)


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
  """Host wrapper: pads ragged prompts/responses into bucketed arrays and runs `rescore` in row batches."""

  def __init__(self, spec: ModelSpec, pad_id: int, cfg: RescorerConfig, mesh=None):
    self.spec, self.pad_id, self.cfg, self.mesh = spec, pad_id, cfg, mesh
    data = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    self.row_sizes = pow2_sizes(data, max(cfg.max_rows, data))
    self.prompt_sizes = pow2_sizes(min(cfg.min_len_bucket, cfg.max_prompt_len), cfg.max_prompt_len)
    self.resp_sizes = pow2_sizes(min(cfg.min_len_bucket, cfg.max_response_len), cfg.max_response_len)
    self.compiles = CompileCounter()

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
