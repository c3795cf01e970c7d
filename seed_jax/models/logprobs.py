"""Per-token log-probs and entropies of given tokens under the policy: the shared core of re-scoring
(rescore.py), the update step (update.py) and SFT (sft.py).

Row layout of `response_logprobs`: [left padding | prompt | response | right padding], every prompt
right-aligned at column P, so the hidden state at column P-1+r predicts response token r for every row.
`packed_logprobs` takes sequences packed several to a row (seed_jax/packing.py) and gathers each response's
predicting positions into slots; both end in `token_logprobs`.
"""
from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from seed_jax.models import transformer as tf
from seed_jax.models import vlm
from seed_jax.models.spec import ModelSpec

F32 = jnp.float32


def entropy_from_logits_BT(logits_BTV: jax.Array) -> jax.Array:
  """H = −Σ_v p_v log p_v of softmax(logits) per position, in fp32 via log_softmax (stable for large logits;
  −inf logits contribute 0). The logits must already be divided by the sampling temperature."""
  logp_BTV = jax.nn.log_softmax(logits_BTV.astype(F32), axis=-1)
  p_BTV = jnp.exp(logp_BTV)
  return -jnp.sum(p_BTV * jnp.where(p_BTV > 0, logp_BTV, 0.0), axis=-1)  # where: no 0·(−inf) in value or grad


def entropy_BT(logits_BTV: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Entropy of softmax(logits / temperature) per position (scales, then entropy_from_logits_BT)."""
  return entropy_from_logits_BT(logits_BTV.astype(F32) / temperature)


def response_logprobs(params, spec: ModelSpec, prompt_BP, pvalid_BP, resp_BR, rmask_BR, temperature,
                      images: vlm.ImageBatch | None = None, *, dtype, chunk: int, remat: bool | str = False,
                      with_entropy: bool = True):
  """Per-token log π(resp_r | prompt, resp_<r) and entropy, both of the temperature-scaled distribution.

  prompt_BP/pvalid_BP: left-padded prompt ids and validity; resp_BR/rmask_BR: right-padded responses.
  The vocabulary projection is `token_logprobs` (chunked). `images`: the rows' frames laid out for the
  [B, P + R] rows (images.layout_images). Returns (logp_BR, entropy_BR), 0 where rmask_BR is False.
  """
  B, Pn = prompt_BP.shape
  R = resp_BR.shape[1]
  tokens_BT = jnp.concatenate([prompt_BP, resp_BR], axis=1)
  valid_BT = jnp.concatenate([pvalid_BP, rmask_BR], axis=1)
  positions, embeds = vlm.forward_inputs(params, spec, images, tf.left_pad_positions(valid_BT), dtype)
  hidden_BTD, _ = tf.forward(params, spec, tokens_BT, positions, valid_BT.astype(jnp.int32), None, dtype, remat,
                             embeds=embeds)
  hidden_BRD = hidden_BTD[:, Pn - 1:Pn - 1 + R]
  return token_logprobs(params, spec, hidden_BRD, resp_BR, rmask_BR, temperature, dtype=dtype, chunk=chunk,
                        remat=remat, with_entropy=with_entropy)


@flax.struct.dataclass
class PackedRows:
  """Sequences packed into rows [W, L] (segment ids 1, 2, ... per row, 0 = padding; positions restart at 0 per
  sequence), and per slot s the row holding its sequence and the columns whose hidden states predict its
  response tokens (col_SR[s, r] = start + prompt length - 1 + r). Prefix trees (packing.fill_rows) add
  segment_end_WL: the last segment that sees each slot (attention.visible)."""
  tokens_WL: Any
  positions_WL: Any
  segment_WL: Any
  row_S: Any
  col_SR: Any
  segment_end_WL: Any = None

  @property
  def segments(self):
    """What the forward takes as segment_BT: the ids, or (ids, ends) of trees."""
    return self.segment_WL if self.segment_end_WL is None else (self.segment_WL, self.segment_end_WL)


def packed_logprobs(params, spec: ModelSpec, rows: PackedRows, resp_SR, rmask_SR, temperature,
                    images: vlm.ImageBatch | None = None, *, dtype, chunk: int, remat: bool | str = False,
                    with_entropy: bool = True):
  """`response_logprobs` for packed rows: (logp_SR, entropy_SR) per slot, 0 where rmask_SR is False. `images`:
  the segments' frames laid out for the [W, L] rows (their positions replace rows.positions_WL)."""
  positions, embeds = vlm.forward_inputs(params, spec, images, rows.positions_WL, dtype)
  hidden_WLD, _ = tf.forward(params, spec.for_packed_rows(), rows.tokens_WL, positions, rows.segments, None,
                             dtype, remat, embeds=embeds)
  hidden_SRD = hidden_WLD[rows.row_S[:, None], rows.col_SR]
  return token_logprobs(params, spec, hidden_SRD, resp_SR, rmask_SR, temperature, dtype=dtype,
                        chunk=min(chunk, resp_SR.shape[1]), remat=remat, with_entropy=with_entropy)


def token_logprobs(params, spec: ModelSpec, hidden_BRD, targets_BR, mask_BR, temperature, *, dtype, chunk: int,
                   remat: bool | str = False, with_entropy: bool = True):
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
