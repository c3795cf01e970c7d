"""Log-probs and entropies of given responses under one or several prompt contexts, in one batched forward.

`rescore` stacks C contexts into C*B rows of one `response_logprobs` forward (models/logprobs.py, the core the
update step also differentiates); `rescore_packed` forwards the same sequences packed several to a row
(seed_jax/packing.py). `Rescorer` is the host wrapper: ragged ids in, bucketed or packed batches out.
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

from seed_jax import images as images_lib
from seed_jax import packing
from seed_jax.buckets import CompileCounter, TokenCount, bucket, pow2_sizes
from seed_jax.infra import distributed
from seed_jax.models.logprobs import PackedRows, packed_logprobs, response_logprobs
from seed_jax.models.spec import ModelSpec
from seed_jax.models.vlm import ImageBatch

log = logging.getLogger(__name__)


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "chunk", "with_entropy"))
def rescore(params, prompt_CBP, pvalid_CBP, resp_BR, rmask_BR, temperature, images=None, *, spec: ModelSpec, dtype,
            chunk: int, with_entropy: bool = True):
  """The same responses under C contexts (e.g. ordinary and skill-augmented prompts) in ONE forward pass
  over the C*B stacked rows (`images`: their frames, laid out for the [C*B, P + R] rows, row leaves [C, B, ...]).
  Returns logp_CBR and
  entropy_CBR (0 on padding)."""
  C, B, Pn = prompt_CBP.shape
  tile = lambda x: jnp.broadcast_to(x[None], (C,) + x.shape).reshape((C * B,) + x.shape[1:])
  if images is not None:  # row leaves [C, B, ...] like the prompts (Rescorer._context_images)
    images = images.replace(index_BT=images.index_BT.reshape((C * B,) + images.index_BT.shape[2:]),
                            positions_B3T=images.positions_B3T.reshape((C * B,) + images.positions_B3T.shape[2:]))
  logp, ent = response_logprobs(params, spec, prompt_CBP.reshape(C * B, Pn), pvalid_CBP.reshape(C * B, Pn),
                                tile(resp_BR), tile(rmask_BR), temperature, images, dtype=dtype, chunk=chunk,
                                with_entropy=with_entropy)
  return logp.reshape(C, B, -1), ent.reshape(C, B, -1)


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "chunk", "with_entropy"))
def rescore_packed(params, rows: PackedRows, resp_SR, rmask_SR, temperature, images=None, *, spec: ModelSpec,
                   dtype, chunk: int, with_entropy: bool = True):
  """Every (context, sample) sequence packed into rows: one forward, (logp_SR, entropy_SR) per slot."""
  return packed_logprobs(params, spec, rows, resp_SR, rmask_SR, temperature, images, dtype=dtype, chunk=chunk,
                         with_entropy=with_entropy)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RescorerConfig:
  """max_rows, vocab_chunk and dtype have their defaults in config.rescore (configs/base.py) only."""
  max_rows: int  # rows (contexts x samples) per forward; more run as several passes
  min_len_bucket: int = 64
  max_prompt_len: int = 4096
  max_response_len: int = 1024
  vocab_chunk: int  # response positions per vocabulary-projection chunk
  dtype: str
  pack_length: int = 0  # > 0: sequences packed into rows of this length (0: one padded row each)
  pack_tokens: int = 16384  # packed: at most this many positions per forward pass
  share_prefix: bool = False  # packed text: sequences that share a head store it once (packing.prefix_order)


class Rescorer:
  """Host wrapper: pads ragged prompts/responses into bucketed arrays and runs `rescore` in row batches.

  `tokens` sums what the passes cost: contexts x rows bucket x (prompt bucket + response bucket) positions
  against the real prompt and response lengths of every context's rows.

  With several processes `score` is collective: every process calls it at the same point with its own samples
  (none is fine) and the same number of contexts; shapes are agreed, and each process reads back its rows."""

  def __init__(self, spec: ModelSpec, pad_id: int, cfg: RescorerConfig, mesh=None):
    self.spec, self.pad_id, self.cfg, self.mesh = spec, pad_id, cfg, mesh
    data, procs = (1, 1) if mesh is None else (distributed.local_dp(mesh), jax.process_count())
    self.row_sizes = pow2_sizes(data, max(cfg.max_rows // procs, data))  # this process's rows per pass
    self.prompt_sizes = pow2_sizes(min(cfg.min_len_bucket, cfg.max_prompt_len), cfg.max_prompt_len)
    self.resp_sizes = pow2_sizes(min(cfg.min_len_bucket, cfg.max_response_len), cfg.max_response_len)
    self.compiles = CompileCounter()
    self.tokens = TokenCount()

  def score(self, params, contexts: Sequence[Sequence[Sequence[int]]], responses: Sequence[Sequence[int]],
            temperature: float, with_entropy: bool = False, images: Sequence | None = None
            ) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """contexts[c][i]: prompt ids of sample i under context c, or None where sample i is not scored under c
    (packed, it costs nothing; its results come back None); responses[i]: its response ids; images[i]: the
    images.Image of sample i's prompts (None: text), the same under every context.
    Returns per-context, per-sample arrays of log-probs and entropies (each of len(responses[i]))."""
    C, N = len(contexts), len(responses)
    if any(len(ctx) != N for ctx in contexts):
      raise ValueError(f"every context needs one prompt per response ({N})")
    images = [None] * N if images is None else list(images)
    if any(f is not None for f in images) and self.spec.vision is None:
      raise ValueError("samples with images need a vision-language policy (config.model.path)")
    empty = next(((c, i) for c, ctx in enumerate(contexts) for i, p in enumerate(ctx) if p is not None and not len(p)),
                 None)
    if empty:
      raise ValueError(f"prompt {empty[1]} of context {empty[0]} is empty")
    if self.cfg.pack_length > 0:
      return self._score_packed(params, contexts, responses, temperature, with_entropy, images)
    logps = [[None] * N for _ in range(C)]
    ents = [[None] * N for _ in range(C)]
    per_pass = max(1, self.row_sizes[-1] // C)
    (passes,) = distributed.agree_max(-(-N // per_pass))
    for start in range(0, passes * per_pass, per_pass):
      idx = list(range(start, min(N, start + per_pass)))
      lp, en = self._score_batch(params, [[ctx[i] for i in idx] for ctx in contexts], [responses[i] for i in idx],
                                 temperature, with_entropy, [images[i] for i in idx])
      for c in range(C):
        for j, i in enumerate(idx):
          if contexts[c][i] is not None:
            n = len(responses[i])
            logps[c][i], ents[c][i] = lp[c, j, :n], en[c, j, :n]
    return logps, ents

  def _score_packed(self, params, contexts, responses, temperature, with_entropy, images):
    """The (prompt, response) sequences of every context packed into equal passes of at most pack_tokens
    positions; a None prompt is left out."""
    C, N = len(contexts), len(responses)
    keep = [(c, i) for c, ctx in enumerate(contexts) for i, p in enumerate(ctx) if p is not None]
    prompts = [contexts[c][i] for c, i in keep]
    resps = [responses[i] for _, i in keep]
    frames = [images[i] for _, i in keep]
    R = bucket(max(1, max(map(len, resps), default=1)), pow2_sizes(16, max(16, self.cfg.max_response_len)),
               "response length")
    # Every process's passes take the same shapes; only the passes that hold a sequence somewhere run.
    share = self.cfg.share_prefix and self.spec.vision is None  # by the model: the same on every process
    agreed = packing.agreed_layout([len(p) + len(r) for p, r in zip(prompts, resps)], length=self.cfg.pack_length,
                                   group_tokens=self.cfg.pack_tokens, resp_len=R, mesh=self.mesh,
                                   seqs=[list(p) + list(r) for p, r in zip(prompts, resps)] if share else None)
    layout, R, live = agreed.layout, agreed.resp_len, agreed.live
    W, S, L = layout.rows_per_group, layout.slots_per_group, layout.length
    rows, resp, rmask, slot_of = packing.fill_rows(layout, prompts, resps, R, agreed.first_row)
    self.tokens.add(layout.tokens(sum(map(len, prompts)), sum(map(len, resps)), R))
    static = dict(spec=self.spec, dtype=jnp.dtype(self.cfg.dtype), chunk=min(self.cfg.vocab_chunk, R),
                  with_entropy=with_entropy)
    segs = packing.segments(layout, prompts, resps, frames)
    multi = self.mesh is not None and jax.process_count() > 1
    patches = images_lib.agreed_patches(max((images_lib.patch_bucket(s) for s in segs), default=0),  # every pass's
                                        self.mesh if multi else None)
    if self.compiles.see(("rescore_packed", W, L, S, R, patches, with_entropy)):
      log.info("compiling rescore: %d packed rows of %d, %d slots, response %d, image patches %d", W, L, S, R,
               patches)
    lp_out, en_out = [], []
    for g in range(len(layout.groups)):
      if g >= live:  # group-count padding on every process: nothing to score
        lp_out.append(np.zeros((S, R), np.float32))
        en_out.append(np.zeros((S, R), np.float32))
        continue
      part = lambda x, n: None if x is None else x[g * n:(g + 1) * n]
      args = (PackedRows(part(rows.tokens_WL, W), part(rows.positions_WL, W), part(rows.segment_WL, W),
                         part(rows.row_S, S), part(rows.col_SR, S), part(rows.segment_end_WL, W)), part(resp, S),
              part(rmask, S))
      image_batch = images_lib.call_images(W, L, segs[g], self.spec.vision, self.mesh, patches) if patches else None
      if self.mesh is not None:
        args = distributed.global_batch(args, self.mesh)
      with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
        out = rescore_packed(params, *args, jnp.float32(temperature), image_batch, **static)
        lp, en = (distributed.local_rows(x) for x in out)
      lp_out.append(lp)
      en_out.append(en)
    lp, en = np.concatenate(lp_out), np.concatenate(en_out)
    logps, ents = [[None] * N for _ in range(C)], [[None] * N for _ in range(C)]
    for k, (c, i) in enumerate(keep):
      logps[c][i], ents[c][i] = lp[slot_of[k], :len(responses[i])], en[slot_of[k], :len(responses[i])]
    return logps, ents

  def _score_batch(self, params, given, responses, temperature, with_entropy, frames):
    C, N = len(given), len(responses)
    B, Pn, R = distributed.agree_max(  # every process's pass takes the same shapes
        bucket(max(N, 1), self.row_sizes, "samples"),
        bucket(max((len(p) for ctx in given for p in ctx if p is not None), default=1), self.prompt_sizes,
               "prompt length"),
        bucket(max(1, max(map(len, responses), default=1)), self.resp_sizes, "response length"))
    prompt = np.full((C, B, Pn), self.pad_id, np.int32)
    pvalid = np.zeros((C, B, Pn), bool)
    resp = np.full((B, R), self.pad_id, np.int32)
    rmask = np.zeros((B, R), bool)
    # A sample left out of a context (None) still takes its row there: one pad token it attends, read back by nobody.
    contexts = [[[self.pad_id] if p is None else p for p in ctx] for ctx in given]
    for c, ctx in enumerate(contexts):
      for b, p in enumerate(ctx):
        prompt[c, b, Pn - len(p):], pvalid[c, b, Pn - len(p):] = p, True
    for b, r in enumerate(responses):
      resp[b, :len(r)], rmask[b, :len(r)] = r, True
    real = [(p, r) for ctx in given for p, r in zip(ctx, responses) if p is not None]
    self.tokens.add(TokenCount(prompt_forwarded=C * B * Pn, prompt_real=sum(len(p) for p, _ in real),
                               response_forwarded=C * B * R, response_real=sum(len(r) for _, r in real),
                               rows_forwarded=C * B, rows_real=len(real)))
    chunk = min(self.cfg.vocab_chunk, R)
    static = dict(spec=self.spec, dtype=jnp.dtype(self.cfg.dtype), chunk=chunk, with_entropy=with_entropy)
    image_batch = self._context_images(C, B, Pn + R, [
        (c * B + b, Pn - len(p), p, responses[b], frames[b] if given[c][b] is not None else None)
        for c, ctx in enumerate(contexts) for b, p in enumerate(ctx)])
    patches = 0 if image_batch is None else image_batch.pixels_NP.shape[0]
    if self.compiles.see(("rescore", C, B, Pn, R, patches, with_entropy)):
      log.info("compiling rescore: %d contexts x %d rows, prompt %d, response %d, image patches %d", C, B, Pn, R,
               patches)
    args = (prompt, pvalid, resp, rmask)
    if self.mesh is not None:  # rows: axis 1 of the [C, B, P] prompts
      args = distributed.global_batch((prompt, pvalid), self.mesh, axis=1) + distributed.global_batch(
          (resp, rmask), self.mesh)
    with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
      lp, en = rescore(params, *args, jnp.float32(temperature), image_batch, **static)
    return distributed.local_rows(lp, axis=1), distributed.local_rows(en, axis=1)

  def _context_images(self, C: int, B: int, T: int, segments) -> ImageBatch | None:
    """The images of C x B padded rows (row c * B + b) with their row leaves as [C, B, ...], laid out like the
    prompts: on several processes each context's rows are every process's B, so the rows split on axis 1."""
    multi = self.mesh is not None and jax.process_count() > 1
    patches = images_lib.agreed_patches(images_lib.patch_bucket(segments), self.mesh if multi else None)
    if not patches:
      return None
    batch = images_lib.as_block(images_lib.layout_images(C * B, T, segments, patches, self.spec.vision), self.mesh)
    batch = batch.replace(index_BT=batch.index_BT.reshape(C, B, T), positions_B3T=batch.positions_B3T.reshape(
        C, B, 3, T))
    if not multi:
      return batch
    rows = distributed.global_batch((batch.index_BT, batch.positions_B3T), self.mesh, axis=1)
    return distributed.global_batch(batch.replace(index_BT=None, positions_B3T=None), self.mesh).replace(
        index_BT=rows[0], positions_B3T=rows[1])
