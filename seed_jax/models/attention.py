"""Every attention implementation of the decoder, behind one entry (`attend`), which a layer calls once.

`attend` picks by the call: without a cache, short rows materialize their scores in query blocks
(`dense_causal_attention`) and long or packed rows go tile by tile (`blockwise_causal_attention` in plain XLA,
or the splash / cuDNN kernels, as spec.attention says); with a cache, one new token per row is a
matrix-vector pass over the cache (`one_query_attention`), a few tokens attend to the whole cache
(`cache_attention`) and a prefill chunk of a long prompt walks it tile by tile (`tiled_cache_attention`).

The blockwise path: queries and keys go in blocks of `block` slots. For each query block an online softmax
(running max `m`, running sum `l`) walks the key blocks up to its own, so no more than one [block, block] tile
of scores per head is alive and the masked upper triangle is never computed. Token t attends to slots s <= t
of its own segment; segment 0 is padding (left padding, packing gaps) and its rows come out as 0. Packed rows
of prefix trees (packing: sequences that share a head store it once) pass `segment_BT` as a pair (ids, ends):
slot s is then seen by the queries of every segment from its own id to its end (`visible`).

Inside, q, k and v are head-major tiles [n, B, K, (G,) block, h], so each tile is a batched matrix product
over (B, K) with no relayout in the loops. The backward pass is written by hand (jax.custom_vjp): it keeps
only the output and the per-row log-sum-exp and walks the lower triangle once by key block, recomputing each
tile's probabilities once for dq, dk and dv, so a training step's attention memory is O(T) per head instead of
the O(T^2) of autodiff through the tiles.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from seed_jax.models.spec import ModelSpec
from seed_jax.models.xla_cpu import batched_dot, from_storage, to_storage, widen

# What a rematerialized layer keeps of the blockwise attention: its output and per-row log-sum-exp, the backward's
# residuals besides q, k, v (cheap projections to redo). Recomputing them is a second walk over the score tiles;
# keeping them costs (heads x head_dim + heads) floats per token and layer.
SAVED_UNDER_REMAT = ("attention_out", "attention_lse")
_NEG = -1e30  # running-max start: finite, so an all-masked tile leaves m, l and the output untouched
_MASKED = -1e30  # finite, so a fully masked (padding) query row gives a uniform softmax instead of NaN
QUERY_BLOCK = 128  # dense_causal_attention's query blocks


class LayerCache(NamedTuple):
  """One layer's keys k [B, K, hd, S] and values v [B, K, S, hd] in storage dtype (xla_cpu.storage_dtype): on
  CPU that layout feeds the attention without a transpose. As a cached call's input, `end` is the first free
  slot (this call's tokens are written at [end, end + T)) and `segment_BS` the slots' segment ids after that
  write, given for a prefill chunk that attends tile by tile."""
  k: jax.Array
  v: jax.Array
  end: jax.Array | None = None
  segment_BS: jax.Array | None = None


def attend(spec: ModelSpec, q_BTKGh, k_BTKh, v_BTKh, segment_BT, mask_BTS, cache: LayerCache | None, dtype):
  """Grouped-query attention of one layer: q [B, T, K, G, h] (K kv heads, G queries each), k/v [B, T, K, h].

  `cache` None: the tokens attend to each other, by `mask_BTS` [B, T, T] or, when it is None, blockwise by
  `segment_BT`. Otherwise this call's keys/values are written at slot cache.end (a scalar, or one per row) and
  the tokens attend to the
  cache, by `mask_BTS` [B, T, S] or, when it is None, tile by tile by cache.segment_BS.
  Returns (output [B, T, K, G, h] fp32, LayerCache of this call's keys/values or of the updated cache)."""
  k_BKhT = to_storage(k_BTKh.transpose(0, 2, 3, 1), dtype)
  v_BKTh = to_storage(v_BTKh.transpose(0, 2, 1, 3), dtype)
  if cache is None and mask_BTS is None:
    # splash takes segment ids, not trees: a tree goes the blockwise way
    impl = "xla_blockwise" if spec.attention == "splash" and isinstance(segment_BT, tuple) else spec.attention
    kernel = {"splash": splash_causal_attention, "cudnn": fused_causal_attention}.get(
        impl, functools.partial(blockwise_causal_attention, dtype=dtype,
                                          rows_per_step=spec.attention_rows_per_step))
    return kernel(q_BTKGh, k_BTKh, v_BTKh, segment_BT, block=spec.attention_block), LayerCache(k_BKhT, v_BKTh)
  if cache is None:
    return dense_causal_attention(q_BTKGh, k_BTKh, v_BTKh, mask_BTS, dtype), LayerCache(k_BKhT, v_BKTh)
  kv = LayerCache(write_slots(cache.k, k_BKhT, cache.end, axis=3), write_slots(cache.v, v_BKTh, cache.end, axis=2))
  if mask_BTS is None:
    return tiled_cache_attention(q_BTKGh, kv.k, kv.v, segment_BT, cache.segment_BS, cache.end, spec.attention_block,
                                 dtype), kv
  return cache_attention(q_BTKGh, kv.k, kv.v, mask_BTS, dtype), kv


def split_tree(segment_BT):
  """(ids [B, T], ends [B, T] or None): packed prefix trees pass both (packing.fill_rows), other calls the ids."""
  return tuple(segment_BT) if isinstance(segment_BT, tuple) else (segment_BT, None)


def visible(seg_q, seg_k, end_k):
  """Which keys a query may see (broadcast; causality apart): a key of its own segment or, in a prefix tree,
  a key whose segments [seg_k, end_k] hold the query's (its sequence shares that token); never padding."""
  if end_k is None:
    return (seg_q == seg_k) & (seg_k > 0)
  return (seg_k <= seg_q) & (seg_q <= end_k) & (seg_k > 0)


def visible_BTT(segment_BT):
  """[B, T, T]: which of a call's own tokens each token may see (`visible`; ids or a tree's (ids, ends))."""
  seg_BT, end_BT = split_tree(segment_BT)
  return visible(seg_BT[:, :, None], seg_BT[:, None, :], None if end_BT is None else end_BT[:, None, :])


def write_slots(cache_B, new_B, end, axis: int):
  """`new_B` written into `cache_B` at slot `end` of the slot axis: a scalar end for every row, or one per row
  (end [B], rows that started at different times, sample.decode_slots)."""
  if jnp.ndim(end) == 0:
    return jax.lax.dynamic_update_slice(cache_B, new_B, tuple(end if a == axis else 0 for a in range(cache_B.ndim)))
  row = lambda c, x, e: jax.lax.dynamic_update_slice(c, x, tuple(e if a == axis - 1 else 0 for a in range(c.ndim)))
  return jax.vmap(row)(cache_B, new_B, end)


def dense_causal_attention(q_BTKGh, k_BTKh, v_BTKh, mask_BTS, dtype):
  """Attention among this call's own tokens (no cache). Queries go in blocks of QUERY_BLOCK, each against
  only the keys up to its last position: the causal mask hides the rest, so this skips most of the masked
  upper triangle and keeps each block's scores small."""
  T = q_BTKGh.shape[1]
  scale = q_BTKGh.shape[-1] ** -0.5
  out = []
  for t0 in range(0, T, QUERY_BLOCK):
    t1 = min(t0 + QUERY_BLOCK, T)
    s_BKGtS = batched_dot("btkgh,bskh->bkgts", q_BTKGh[:, t0:t1] * scale, k_BTKh[:, :t1], dtype)
    s_BKGtS = jnp.where(mask_BTS[:, None, None, t0:t1, :t1], s_BKGtS, _MASKED)
    p_BKGtS = jax.nn.softmax(s_BKGtS, axis=-1)
    out.append(batched_dot("bkgts,bskh->btkgh", p_BKGtS, v_BTKh[:, :t1], dtype))
  return jnp.concatenate(out, axis=1)


def cache_attention(q_BTKGh, k_BKhS, v_BKSh, mask_BTS, dtype):
  """Grouped-query attention over a cache; keys/values in storage dtype (xla_cpu.storage_dtype)."""
  scale = q_BTKGh.shape[-1] ** -0.5
  if q_BTKGh.shape[1] == 1:
    return one_query_attention(q_BTKGh * scale, k_BKhS, v_BKSh, mask_BTS, dtype)
  s_BKGTS = batched_dot("btkgh,bkhs->bkgts", q_BTKGh * scale, from_storage(k_BKhS, dtype), dtype)
  s_BKGTS = jnp.where(mask_BTS[:, None, None], s_BKGTS, _MASKED)
  p_BKGTS = jax.nn.softmax(s_BKGTS, axis=-1)
  return batched_dot("bkgts,bksh->btkgh", p_BKGTS, from_storage(v_BKSh, dtype), dtype)


def one_query_attention(q_B1KGh, k_BKhS, v_BKSh, mask_B1S, dtype):
  """Decode attention (one query per row, already scaled): matrix-vector products, written as multiply +
  reduce because XLA:CPU fuses those into one pass over the cache, where its batched-dot kernel is slower at
  these sizes. Products and sums are fp32 (bf16 operands are widened inside the fusion)."""
  q_BKGh1 = q_B1KGh[:, 0, ..., None].astype(dtype).astype(jnp.float32)
  s_BKGS = jnp.sum(q_BKGh1 * widen(k_BKhS)[:, :, None], axis=3)
  s_BKGS = jnp.where(mask_B1S[:, :, None], s_BKGS, _MASKED)
  p_BKGS1 = jax.nn.softmax(s_BKGS, axis=-1)[..., None]
  if jnp.dtype(dtype) != jnp.float32:
    p_BKGS1 = p_BKGS1.astype(dtype).astype(jnp.float32)  # the rounding a bf16 dot applies to its operand
  o_BKGh = jnp.sum(p_BKGS1 * widen(v_BKSh)[:, :, None], axis=3)
  return o_BKGh[:, None]


def tiled_cache_attention(q_BTKGh, k_BKhS, v_BKSh, seg_q_BT, seg_BS, end, tile: int, dtype):
  """Attention of T new tokens (slots [end, end + T)) over the cache, one key tile of `tile` slots at a time
  (online softmax, as the blockwise path) and only up to the tokens' last slot: a long prompt prefilled in
  chunks never holds a [T, S] score matrix. Forward only (generation)."""
  B, T, K, G, h = q_BTKGh.shape
  S = seg_BS.shape[1]
  q_BTKGh = q_BTKGh * h ** -0.5
  q_slot = end + jnp.arange(T)

  def key_tile(j, carry):
    start = jnp.minimum(j * tile, S - tile)  # the last tile may overlap the one before: its slots are masked
    k_tile = from_storage(jax.lax.dynamic_slice_in_dim(k_BKhS, start, tile, axis=3), dtype)
    v_tile = from_storage(jax.lax.dynamic_slice_in_dim(v_BKSh, start, tile, axis=2), dtype)
    seg_k = jax.lax.dynamic_slice_in_dim(seg_BS, start, tile, axis=1)
    k_slot = start + jnp.arange(tile)
    fresh = k_slot >= j * tile  # slots an earlier tile has not covered
    mask_BTs = ((q_slot[:, None] >= k_slot[None, :]) & fresh[None, :])[None] \
        & (seg_q_BT[:, :, None] == seg_k[:, None, :]) & (seg_k[:, None, :] > 0)
    s = jnp.where(mask_BTs[:, None, None], batched_dot("btkgh,bkhs->bkgts", q_BTKGh, k_tile, dtype), -1e30)
    return softmax_tile(carry, s, mask_BTs, v_tile, "bkgts,bksh->bkgth", dtype)

  tiles = (end + T + tile - 1) // tile  # the causal bound: tiles past the last new slot hold nothing it sees
  out_BKGTh, _ = softmax_finish(jax.lax.fori_loop(0, tiles, key_tile, softmax_start(B, K, G, T, h)))
  return jnp.einsum("bkgth->btkgh", out_BKGTh)


def _tile_mask(seg_nBb, end_nBb, i, j, block):
  """[B, block, block]: query slot >= key slot, key `visible` (query block i, key block j)."""
  k_end = None if end_nBb is None else end_nBb[j][:, None, :]
  causal = (i * block + jnp.arange(block))[:, None] >= (j * block + jnp.arange(block))[None, :]
  return causal[None] & visible(seg_nBb[i][:, :, None], seg_nBb[j][:, None, :], k_end)


def _pad_to_tiles(block, *xs_BT):
  """Each [B, T, ...] array (or None) padded along T to a multiple of `block` (segment ids with 0: padding)."""
  pad = -xs_BT[0].shape[1] % block
  return tuple(None if x is None else jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)) for x in xs_BT)


def _head_major_tiles(x_BT, block):
  """[B, T, K, (G,) h] -> [n, B, K, (G,) block, h] (T a multiple of block): each tile's scores and products are
  then plain batched matrix products over (B, K), with no relayout inside the loops."""
  B, T = x_BT.shape[:2]
  x = x_BT.reshape((B, T // block, block) + x_BT.shape[2:])
  return jnp.transpose(x, (1, 0) + tuple(range(3, x.ndim - 1)) + (2, x.ndim - 1))


def _from_head_major_tiles(x_n):
  """[n, B, K, G, block, h] -> [B, n * block, K, G, h]."""
  n, B, K, G, block, h = x_n.shape
  return jnp.transpose(x_n, (1, 0, 4, 2, 3, 5)).reshape(B, n * block, K, G, h)


def block_ranges(seg_BT, block, end_BT=None):
  """(lo_n, hi_n): per query block the first key block any of its queries may attend to, per key block the last
  query block that may attend to it, over the whole batch. A packed row's segments then cost only their own
  tiles, not the lower triangle of the row; a segment id may recur anywhere in its row (first/last slot per id).
  With trees (end_BT) from `tiles_meet`, the last two of (lo_n, hi_n, meet_nn)."""
  B, T = seg_BT.shape
  n, rows = T // block, jnp.arange(B)[:, None]
  if end_BT is not None:
    meet_nn = tiles_meet(seg_BT, end_BT, block)
    lo_n = jnp.where(meet_nn.any(1), jnp.argmax(meet_nn, 1), n)
    hi_n = jnp.where(meet_nn.any(0), n - 1 - jnp.argmax(meet_nn[::-1], 0), -1)
    return lo_n, hi_n, meet_nn
  slot_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  seg_BT = jnp.clip(seg_BT, 0, T)
  first_BT = jnp.take_along_axis(jnp.full((B, T + 1), T, jnp.int32).at[rows, seg_BT].min(slot_BT), seg_BT, 1)
  last_BT = jnp.take_along_axis(jnp.full((B, T + 1), -1, jnp.int32).at[rows, seg_BT].max(slot_BT), seg_BT, 1)
  real_BT = seg_BT > 0
  lo_n = jnp.where(real_BT, first_BT, T).reshape(B, n, block).min((0, 2)) // block  # n: all padding
  hi_n = jnp.where(real_BT, last_BT, -1).reshape(B, n, block).max((0, 2)) // block  # -1: all padding
  return lo_n, hi_n


def tiles_meet(seg_BT, end_BT, block):
  """[query block, key block] bool over the whole batch, for prefix trees: key block j may hold a key that
  query block i sees (causal, and j's ids [min id, max end] overlap i's [min id, max id]). A branch's tiles
  then skip its siblings' tiles between it and the shared head."""
  B, T = seg_BT.shape
  n = T // block
  real_Bnb = (seg_BT > 0).reshape(B, n, block)
  lo_Bn = jnp.where(real_Bnb, seg_BT.reshape(B, n, block), T + 1).min(-1)
  q_hi_Bn = jnp.where(real_Bnb, seg_BT.reshape(B, n, block), -1).max(-1)
  k_hi_Bn = jnp.where(real_Bnb, end_BT.reshape(B, n, block), -1).max(-1)
  meet_nn = ((lo_Bn[:, None, :] <= q_hi_Bn[:, :, None]) & (lo_Bn[:, :, None] <= k_hi_Bn[:, None, :])).any(0)
  return meet_nn & (jnp.arange(n)[:, None] >= jnp.arange(n)[None, :])


def _if_meet(meet_nn, i, j, tile, carry):
  """tile(carry) where tiles (i, j) meet (always without trees: meet_nn None), else carry unchanged."""
  return tile(carry) if meet_nn is None else jax.lax.cond(meet_nn[i, j], tile, lambda c: c, carry)


def _scores(q_nBKGbh, k_nBKbh, seg_nBb, end_nBb, i, j, block, dtype):
  """(masked scores [B, K, G, bq, bk] of tile (i, j), its mask [B, bq, bk]); q is already scaled."""
  mask = _tile_mask(seg_nBb, end_nBb, i, j, block)
  s = batched_dot("bkgqh,bksh->bkgqs", q_nBKGbh[i], k_nBKbh[j], dtype)
  return jnp.where(mask[:, None, None], s, _NEG), mask


def softmax_start(B, K, G, queries, h):
  """(running max, running sum, weighted values) before the first key tile."""
  return (jnp.full((B, K, G, queries), _NEG, jnp.float32), jnp.zeros((B, K, G, queries), jnp.float32),
          jnp.zeros((B, K, G, queries, h), jnp.float32))


def softmax_tile(carry, s_BKGqs, mask_Bqs, v, v_eq: str, dtype):
  """One key tile of the online softmax: masked scores s, values v contracted by `v_eq` (p, v -> bkgqh)."""
  m, l, acc = carry
  m_new = jnp.maximum(m, s_BKGqs.max(-1))
  p = jnp.where(mask_Bqs[:, None, None], jnp.exp(s_BKGqs - m_new[..., None]), 0.0)
  alpha = jnp.exp(m - m_new)
  return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + batched_dot(v_eq, p, v, dtype)


def softmax_finish(carry):
  """(output [B, K, G, q, h], log-sum-exp [B, K, G, q]); rows that saw no key are 0."""
  m, l, acc = carry
  safe = jnp.where(l > 0, l, 1.0)
  return acc / safe[..., None], jnp.where(l > 0, m + jnp.log(safe), _NEG)


def _by_block(x_BT, n, block):
  """[B, T] -> [n, B, block] (None stays None)."""
  return None if x_BT is None else jnp.moveaxis(x_BT.reshape(x_BT.shape[0], n, block), 1, 0)


def _forward(q_nBKGbh, k_nBKbh, v_nBKbh, seg_BT, end_BT, block, dtype):
  """(output [n, B, K, G, block, h] fp32, log-sum-exp [n, B, K, G, block] fp32) of head-major tiles; q is
  already scaled."""
  n, B, K, G, _, h = q_nBKGbh.shape
  seg_nBb, end_nBb = _by_block(seg_BT, n, block), _by_block(end_BT, n, block)
  lo_n, _, *meet = block_ranges(seg_BT, block, end_BT)
  meet_nn = meet[0] if meet else None

  def query_block(i):
    def key_block(j, carry):
      def tile(carry):
        s, mask = _scores(q_nBKGbh, k_nBKbh, seg_nBb, end_nBb, i, j, block, dtype)
        return softmax_tile(carry, s, mask, v_nBKbh[j], "bkgqs,bksh->bkgqh", dtype)
      return _if_meet(meet_nn, i, j, tile, carry)

    # causal: key blocks past the diagonal are skipped; so are those before the block's earliest segment
    return softmax_finish(jax.lax.fori_loop(lo_n[i], i + 1, key_block, softmax_start(B, K, G, block, h)))

  return jax.lax.map(query_block, jnp.arange(n))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q_nBKGbh, k_nBKbh, v_nBKbh, seg_BT, end_BT, block, dtype):
  return _forward(q_nBKGbh, k_nBKbh, v_nBKbh, seg_BT, end_BT, block, dtype)[0]


def _attention_fwd(q_nBKGbh, k_nBKbh, v_nBKbh, seg_BT, end_BT, block, dtype):
  out_nBKGbh, lse_nBKGb = _forward(q_nBKGbh, k_nBKbh, v_nBKbh, seg_BT, end_BT, block, dtype)
  # named so that a rematerialized layer saves them (SAVED_UNDER_REMAT) instead of re-running the tile walk
  out_nBKGbh, lse_nBKGb = checkpoint_name(out_nBKGbh, "attention_out"), checkpoint_name(lse_nBKGb, "attention_lse")
  return out_nBKGbh, (q_nBKGbh, k_nBKbh, v_nBKbh, seg_BT, end_BT, out_nBKGbh, lse_nBKGb)


def _attention_bwd(block, dtype, res, dout_nBKGbh):
  """One walk over the lower triangle, by key block: each tile's probabilities and d(scores) are recomputed
  once and feed dk, dv (carried per key block) and dq (accumulated in place at its query block)."""
  q_nBKGbh, k_nBKbh, v_nBKbh, seg_BT, end_BT, out_nBKGbh, lse_nBKGb = res
  n, B = q_nBKGbh.shape[:2]
  seg_nBb, end_nBb = _by_block(seg_BT, n, block), _by_block(end_BT, n, block)
  _, hi_n, *meet = block_ranges(seg_BT, block, end_BT)
  meet_nn = meet[0] if meet else None
  dout_nBKGbh = dout_nBKGbh.astype(jnp.float32)
  delta_nBKGb = jnp.sum(dout_nBKGbh * out_nBKGbh, axis=-1)  # [n, B, K, G, block]

  def key_block(dq_nBKGbh, j):
    def step(i, carry):
      def tile(carry):
        dq_nBKGbh, dk_BKbh, dv_BKbh = carry
        s, mask = _scores(q_nBKGbh, k_nBKbh, seg_nBb, end_nBb, i, j, block, dtype)
        p = jnp.where(mask[:, None, None], jnp.exp(s - lse_nBKGb[i][..., None]), 0.0)
        ds = p * (batched_dot("bkgqh,bksh->bkgqs", dout_nBKGbh[i], v_nBKbh[j], dtype) - delta_nBKGb[i][..., None])
        dv_BKbh = dv_BKbh + batched_dot("bkgqs,bkgqh->bksh", p, dout_nBKGbh[i], dtype)
        dk_BKbh = dk_BKbh + batched_dot("bkgqs,bkgqh->bksh", ds, q_nBKGbh[i], dtype)
        return dq_nBKGbh.at[i].add(batched_dot("bkgqs,bksh->bkgqh", ds, k_nBKbh[j], dtype)), dk_BKbh, dv_BKbh
      return _if_meet(meet_nn, i, j, tile, carry)

    zeros = jnp.zeros(k_nBKbh.shape[1:], jnp.float32)
    # causal: only query blocks at or after j, and none after the last one whose segments reach into j
    dq_nBKGbh, dk_BKbh, dv_BKbh = jax.lax.fori_loop(j, hi_n[j] + 1, step, (dq_nBKGbh, zeros, zeros))
    return dq_nBKGbh, (dk_BKbh, dv_BKbh)

  dq_nBKGbh, (dk_nBKbh, dv_nBKbh) = jax.lax.scan(key_block, jnp.zeros(q_nBKGbh.shape, jnp.float32), jnp.arange(n))
  return (dq_nBKGbh.astype(q_nBKGbh.dtype), dk_nBKbh.astype(k_nBKbh.dtype), dv_nBKbh.astype(v_nBKbh.dtype), None,
          None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _batch_shards(B: int) -> int:
  """How many devices the rows are spread over (the mesh axes that "batch" maps to), 1 off a mesh."""
  from seed_jax.infra.mesh import logical_to_spec
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or mesh.size == 1:
    return 1
  axes = logical_to_spec(("batch",), (B,), dict(mesh.shape))[0]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return int(math.prod(mesh.shape[a] for a in axes))


def blockwise_causal_attention(q_BTKGh, k_BTKh, v_BTKh, segment_BT, *, block: int = 512, dtype=jnp.float32,
                               rows_per_step: int = 0):
  """Grouped-query causal attention among one call's tokens: q [B, T, K, G, h] (K kv heads, G queries each),
  k/v [B, T, K, h], segment ids [B, T] (0 = padding) or a tree's (ids, ends). Returns [B, T, K, G, h] fp32;
  padding rows are 0. T need not be a multiple of `block`: the tail is padded with segment 0.

  rows_per_step > 0: that many rows of each batch shard at a time (`lax.map` over each shard's rows, so the loop
  never crosses the data sharding). The rows then walk only their own segments' tiles (the ranges are the
  step's rows', not the batch's), and a tile's scores stay in the core's cache: on XLA:CPU, where the tiles'
  small batched products and softmax passes bound the time, that is faster for packed rows (see
  ModelSpec.for_packed_rows)."""
  seg_BT, end_BT = split_tree(segment_BT)
  B, T = seg_BT.shape
  block = min(block, max(T, 1))
  q_BTKGh, k_BTKh, v_BTKh, seg_BT, end_BT = _pad_to_tiles(block, q_BTKGh, k_BTKh, v_BTKh, seg_BT, end_BT)
  scale = q_BTKGh.shape[-1] ** -0.5
  tiles = lambda x: _head_major_tiles(x, block)
  int32 = lambda x: None if x is None else x.astype(jnp.int32)
  attend = lambda q, k, v, seg, end: _from_head_major_tiles(
      _attention(tiles(q * scale), tiles(k), tiles(v), int32(seg), int32(end), block, jnp.dtype(dtype).name))
  shards, r = _batch_shards(B), rows_per_step
  if r <= 0 or B % (shards * r) or B == shards * r:
    return attend(q_BTKGh, k_BTKh, v_BTKh, seg_BT, end_BT)[:, :T]
  # [B, ...] -> [steps, shards * r, ...]: step i takes rows [i r, (i + 1) r) of every shard's contiguous block
  n = B // (shards * r)
  steps = lambda x: jnp.swapaxes(x.reshape((shards, n, r) + x.shape[1:]), 0, 1).reshape((n, shards * r) + x.shape[1:])
  out = jax.lax.map(lambda xs: attend(*xs),
                    tuple(None if x is None else steps(x) for x in (q_BTKGh, k_BTKh, v_BTKh, seg_BT, end_BT)))
  out = jnp.swapaxes(out.reshape((n, shards, r) + out.shape[2:]), 0, 1)
  return out.reshape((B,) + out.shape[3:])[:, :T]


def fused_causal_attention(q_BTKGh, k_BTKh, v_BTKh, segment_BT, *, block: int = 512, implementation: str = "cudnn"):
  """blockwise_causal_attention's contract on jax.nn.dot_product_attention: implementation "cudnn" is cuDNN's
  fused flash attention (GPU; scores stay on chip), "xla" the same call in plain XLA (any backend: it checks
  the mask and head layout here). Causality is the kernel's own mask; segments and padding go in as a
  [B, 1, T, T] boolean mask (T^2 bytes per row). Query head k*G + g reads kv head k, as in our layout."""
  del block  # the kernel tiles for itself
  B, T, K, G, h = q_BTKGh.shape
  seg_BT = split_tree(segment_BT)[0].astype(jnp.int32)
  mask_B1TT = visible_BTT(segment_BT)[:, None]
  out_BTNh = jax.nn.dot_product_attention(q_BTKGh.reshape(B, T, K * G, h), k_BTKh, v_BTKh, mask=mask_B1TT,
                                          is_causal=True, implementation=implementation)
  out = out_BTNh.reshape(B, T, K, G, h).astype(jnp.float32)
  return jnp.where((seg_BT > 0)[:, :, None, None, None], out, 0.0)  # padding rows: 0, as the other paths


@functools.lru_cache(maxsize=16)
def _splash_kernel(T: int, G: int, block: int, interpret: bool):
  """JAX's Pallas splash kernel for one kv head's G query heads over T slots, causal (built once per shape:
  its mask tables are computed on the host)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  mask = splash.MultiHeadMask([splash.CausalMask((T, T)) for _ in range(G)])
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                            block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  with jax.ensure_compile_time_eval():  # its tables are constants, also when first built inside a trace
    return splash.make_splash_mqa_single_device(mask=mask, block_sizes=sizes, interpret=interpret)


def splash_causal_attention(q_BTKGh, k_BTKh, v_BTKh, segment_BT, *, block: int = 512,
                            interpret: bool | None = None):
  """blockwise_causal_attention's contract on the Pallas splash kernel (TPU; `interpret` runs it in Pallas'
  interpreter elsewhere, default: off the TPU). Under a mesh the kernel runs per shard (shard_map): rows over
  the data axes, kv heads over the tensor axis where they divide."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  from seed_jax.infra.mesh import logical_to_spec
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  B, T, K, G, h = q_BTKGh.shape
  block = -(-min(block, T) // 128) * 128  # the kernel's tiles are multiples of 128 slots
  q_BTKGh, k_BTKh, v_BTKh, segment_BT = _pad_to_tiles(block, q_BTKGh, k_BTKh, v_BTKh, segment_BT)
  Tp = segment_BT.shape[1]
  kernel = _splash_kernel(Tp, G, block, interpret)
  q_BKGTh = jnp.einsum("btkgh->bkgth", q_BTKGh * h ** -0.5)
  k_BKTh, v_BKTh = (jnp.einsum("btkh->bkth", x) for x in (k_BTKh, v_BTKh))
  seg_BT = segment_BT.astype(jnp.int32)

  def local(q, k, v, seg):
    per_head = lambda q1, k1, v1, s: kernel(q1, k1, v1, segment_ids=splash.SegmentIds(q=s, kv=s))
    per_row = jax.vmap(per_head, in_axes=(0, 0, 0, None))  # kv heads share the row's segments
    return jax.vmap(per_row)(q, k, v, seg)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or mesh.size == 1:
    out_BKGTh = local(q_BKGTh, k_BKTh, v_BKTh, seg_BT)
  else:
    spec = lambda axes, shape: logical_to_spec(axes, shape, dict(mesh.shape))
    qs, ks = spec(("batch", "kv_heads", None, None, None), q_BKGTh.shape), spec(("batch", "kv_heads", None, None), k_BKTh.shape)
    ss = jax.sharding.PartitionSpec(qs[0], None)
    out_BKGTh = jax.shard_map(local, mesh=mesh, in_specs=(qs, ks, ks, ss), out_specs=qs, check_vma=False)(
        q_BKGTh, k_BKTh, v_BKTh, seg_BT)
  out = jnp.einsum("bkgth->btkgh", out_BKGTh.astype(jnp.float32))[:, :T]
  return jnp.where((segment_BT[:, :T] > 0)[:, :, None, None, None], out, 0.0)
