"""The decoder-only transformer: one forward that serves sampling (with a KV cache), re-scoring and training.

Weights live in a plain nested dict (`params`) whose per-layer tensors are stacked on a leading "layers" axis
and run with `lax.scan`, so the layers compile once whatever their number. `Transformer` is the Flax NNX module
that declares every weight with its logical axes (see infra/mesh.py) and initializes it.

Attention masking uses segment ids: 0 marks padding, equal positive ids may attend to each other causally.
One id per row gives ordinary left-padded batches; several ids per row give packed sequences. Each layer
attends through the one entry of models/attention.py; the XLA:CPU workarounds live in models/xla_cpu.py.
"""
from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax.ad_checkpoint import checkpoint_name

from seed_jax.infra.mesh import constrain
from seed_jax.models import attention, xla_cpu
from seed_jax.models.spec import ModelSpec
from seed_jax.models.xla_cpu import from_storage, to_storage

Params = dict[str, Any]


def param_axes(spec: ModelSpec) -> dict[str, Any]:
  """Logical axes of every weight, the same tree as `params`."""
  layer = {
      "attn_norm": ("layers", "embed"),
      "wq": ("layers", "embed", "heads", "head_dim"),
      "wk": ("layers", "embed", "kv_heads", "head_dim"),
      "wv": ("layers", "embed", "kv_heads", "head_dim"),
      "wo": ("layers", "heads", "head_dim", "embed"),
      "mlp_norm": ("layers", "embed"),
      "w_gate": ("layers", "embed", "mlp"),
      "w_up": ("layers", "embed", "mlp"),
      "w_down": ("layers", "mlp", "embed"),
  }
  if spec.qkv_bias:
    layer.update(bq=("layers", "heads", "head_dim"), bk=("layers", "kv_heads", "head_dim"),
                 bv=("layers", "kv_heads", "head_dim"))
  if spec.qk_norm:
    layer.update(q_norm=("layers", "head_dim"), k_norm=("layers", "head_dim"))
  axes = {"embed": ("vocab", "embed"), "layers": layer, "final_norm": ("embed",)}
  if not spec.tie_embeddings:
    axes["lm_head"] = ("embed", "vocab")
  return axes


def param_shapes(spec: ModelSpec) -> dict[str, Any]:
  L, D, H, K, hd, F, V = (spec.n_layers, spec.dim, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.ffn_dim,
                          spec.vocab_size)
  layer = {"attn_norm": (L, D), "wq": (L, D, H, hd), "wk": (L, D, K, hd), "wv": (L, D, K, hd),
           "wo": (L, H, hd, D), "mlp_norm": (L, D), "w_gate": (L, D, F), "w_up": (L, D, F), "w_down": (L, F, D)}
  if spec.qkv_bias:
    layer.update(bq=(L, H, hd), bk=(L, K, hd), bv=(L, K, hd))
  if spec.qk_norm:
    layer.update(q_norm=(L, hd), k_norm=(L, hd))
  shapes = {"embed": (V, D), "layers": layer, "final_norm": (D,)}
  if not spec.tie_embeddings:
    shapes["lm_head"] = (D, V)
  return shapes


class Transformer(nnx.Module):
  """NNX container of the weights (each an `nnx.Param` carrying its logical `axes`)."""

  def __init__(self, spec: ModelSpec, rngs: nnx.Rngs):
    self.spec = spec
    shapes, axes = param_shapes(spec), param_axes(spec)

    def make(name, shape, ax):
      if name.endswith("norm"):
        return nnx.Param(jnp.ones(shape, jnp.float32), axes=ax)
      if name in ("bq", "bk", "bv"):
        return nnx.Param(jnp.zeros(shape, jnp.float32), axes=ax)
      return nnx.Param(0.02 * jax.random.normal(rngs.params(), shape, jnp.float32), axes=ax)

    self.embed = make("embed", shapes["embed"], axes["embed"])
    self.final_norm = make("final_norm", shapes["final_norm"], axes["final_norm"])
    self.layers = nnx.Dict({k: make(k, shapes["layers"][k], axes["layers"][k]) for k in shapes["layers"]})
    if not spec.tie_embeddings:
      self.lm_head = make("lm_head", shapes["lm_head"], axes["lm_head"])

  def params(self) -> Params:
    return nnx.to_pure_dict(nnx.state(self, nnx.Param))

  def __call__(self, tokens_BT, positions_BT, segment_BT, cache=None, dtype=jnp.float32):
    hidden_BTD, cache = forward(self.params(), self.spec, tokens_BT, positions_BT, segment_BT, cache, dtype)
    return logits_from_hidden(self.params(), self.spec, hidden_BTD), cache


def init_params(spec: ModelSpec, seed: int = 0) -> Params:
  return Transformer(spec, nnx.Rngs(params=seed)).params()


@flax.struct.dataclass
class KVCache:
  """Keys/values of every slot, one array per layer: decode updates and reads each layer's cache in place,
  where slicing a layer out of a stacked [L, ...] array would copy it on every step. Each K is [B, Hkv, hd, S]
  and each V is [B, Hkv, S, hd], as attention.LayerCache. `segment_BS` is 0 for empty slots; `end` is the
  first free slot (new tokens are written at [end, end+T)): a scalar, or one per row [B] when rows advance
  apart (sample.decode_slots)."""
  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  segment_BS: jax.Array
  end: jax.Array

  @staticmethod
  def create(spec: ModelSpec, batch: int, length: int, dtype=jnp.float32) -> "KVCache":
    store = xla_cpu.storage_dtype(dtype)
    shape = (batch, spec.n_kv_heads)
    return KVCache(k=tuple(jnp.zeros(shape + (spec.head_dim, length), store) for _ in range(spec.n_layers)),
                   v=tuple(jnp.zeros(shape + (length, spec.head_dim), store) for _ in range(spec.n_layers)),
                   segment_BS=jnp.zeros((batch, length), jnp.int32), end=jnp.zeros((), jnp.int32))


def rms_norm(x, w, eps):
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (x32 * w.astype(jnp.float32)).astype(x.dtype)


def rope(x_BTNh, cos_BTh, sin_BTh):
  """Rotary embedding in the half-split convention (the Hugging Face layout of q/k weights)."""
  half = x_BTNh.shape[-1] // 2
  x32 = x_BTNh.astype(jnp.float32)
  rot = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  return (x32 * cos_BTh[:, :, None] + rot * sin_BTh[:, :, None]).astype(x_BTNh.dtype)


def _dot(eq, a, b, dtype):
  """An activation x weight projection, fp32 results. On XLA:CPU the weight gradient goes through
  `xla_cpu.projection`, whose backward feeds the library's dot kernels operands they take."""
  a, b = a.astype(dtype), b.astype(dtype)
  lhs, out = eq.split("->")
  sa, sb = lhs.split(",")
  if jax.default_backend() == "cpu" and sb[0] in sa:  # weight [contracted..., out...] (not "btd,vd->btv")
    out = xla_cpu.projection(eq, a, b)
  else:
    out = jnp.einsum(eq, a, b, preferred_element_type=jnp.float32)
  return checkpoint_name(out, "projection")  # kept by a rematerialized layer under remat="projections"


def _layer(spec: ModelSpec, dtype, x_BTD, w, cos_BTh, sin_BTh, kv, mask_BTS, segment_BT=None):
  """One pre-norm block on one layer's weights `w` (uint16 entries are bf16 bits).

  `kv` None: attend to this call's tokens (by `mask_BTS`, or blockwise by `segment_BT` when the mask is None);
  an attention.LayerCache: write this call's keys/values at its slot `end` and attend to the cache (see
  attention.attend). Returns (x, LayerCache of this call's keys/values or of the updated cache).
  """
  B, T, _ = x_BTD.shape
  K, G = spec.n_kv_heads, spec.n_heads // spec.n_kv_heads
  w = {name: from_storage(a, dtype) if a.dtype == jnp.uint16 else a for name, a in w.items()}
  h_BTD = rms_norm(x_BTD, w["attn_norm"], spec.rms_eps)
  if "wqkv" in w:  # fused by `decode_params`
    qkv_BTF = _dot("btd,df->btf", h_BTD, w["wqkv"], dtype)
    if spec.qkv_bias:
      qkv_BTF = qkv_BTF + w["bqkv"]
    q_BTF, k_BTF, v_BTF = jnp.split(qkv_BTF, [spec.n_heads * spec.head_dim, (spec.n_heads + K) * spec.head_dim], -1)
    q_BTHh, k_BTKh, v_BTKh = (a.reshape(B, T, -1, spec.head_dim) for a in (q_BTF, k_BTF, v_BTF))
  else:
    q_BTHh = _dot("btd,dnh->btnh", h_BTD, w["wq"], dtype)
    k_BTKh = _dot("btd,dnh->btnh", h_BTD, w["wk"], dtype)
    v_BTKh = _dot("btd,dnh->btnh", h_BTD, w["wv"], dtype)
    if spec.qkv_bias:
      q_BTHh, k_BTKh, v_BTKh = q_BTHh + w["bq"], k_BTKh + w["bk"], v_BTKh + w["bv"]
  if spec.qk_norm:
    q_BTHh, k_BTKh = rms_norm(q_BTHh, w["q_norm"], spec.rms_eps), rms_norm(k_BTKh, w["k_norm"], spec.rms_eps)
  q_BTHh, k_BTKh = rope(q_BTHh, cos_BTh, sin_BTh), rope(k_BTKh, cos_BTh, sin_BTh)
  q_BTHh = constrain(q_BTHh, ("batch", "length", "heads", "head_dim"))
  o_BTKGh, kv = attention.attend(spec, q_BTHh.reshape(B, T, K, G, -1), k_BTKh, v_BTKh, segment_BT, mask_BTS, kv,
                                 dtype)
  wo_FD = w["wo"].reshape(-1, x_BTD.shape[-1])  # [heads * head_dim, D]: one contraction, no relayout
  x_BTD = x_BTD + _dot("btf,fd->btd", o_BTKGh.reshape(B, T, -1), wo_FD, dtype).astype(x_BTD.dtype)
  h_BTD = rms_norm(x_BTD, w["mlp_norm"], spec.rms_eps)
  if "w_gate_up" in w:  # fused by `decode_params`
    gate_BTF, up_BTF = jnp.split(_dot("btd,df->btf", h_BTD, w["w_gate_up"], dtype), 2, axis=-1)
  else:
    gate_BTF = _dot("btd,df->btf", h_BTD, w["w_gate"], dtype)
    up_BTF = _dot("btd,df->btf", h_BTD, w["w_up"], dtype)
  act_BTF = constrain(jax.nn.silu(gate_BTF) * up_BTF, ("batch", "length", "mlp"))
  x_BTD = x_BTD + _dot("btf,fd->btd", act_BTF, w["w_down"], dtype).astype(x_BTD.dtype)
  return constrain(x_BTD, ("batch", "length", "embed")), kv


def embed_tokens(params: Params, tokens_BT, embeds=None):
  """fp32 input embeddings [B, T, D]. `embeds` (index_BT, rows_ND), e.g. image features: a token with
  index_BT >= 0 takes row index_BT of rows_ND instead of its token embedding (static shapes: N is fixed)."""
  x_BTD = jnp.take(params["embed"], tokens_BT, axis=0).astype(jnp.float32)
  if embeds is not None:
    index_BT, rows_ND = embeds
    rows_BTD = jnp.take(rows_ND, jnp.maximum(index_BT, 0), axis=0).astype(jnp.float32)
    x_BTD = jnp.where((index_BT >= 0)[..., None], rows_BTD, x_BTD)
  return x_BTD


def rope_angles(spec: ModelSpec, positions_BT):
  """Rotary angles [B, T, head_dim]. positions [B, T], or [3, B, T] (t, h, w) with spec.mrope_section: each
  section of the frequencies takes its angle from its own axis (Qwen2.5-VL's multimodal rotary)."""
  inv_freq_h = jnp.asarray(spec.rope_inv_freq())
  angles_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq_h
  if positions_BT.ndim == 3:
    if spec.mrope_section is None:
      raise ValueError(f"positions of shape {positions_BT.shape} need a spec with mrope_section")
    bounds = np.cumsum((0,) + tuple(spec.mrope_section))
    angles_BTh = jnp.concatenate([angles_BTh[i % 3, ..., bounds[i]:bounds[i + 1]]
                                  for i in range(len(spec.mrope_section))], axis=-1)
  return jnp.concatenate([angles_BTh, angles_BTh], axis=-1)


def _embed(params: Params, spec: ModelSpec, tokens_BT, positions_BT, embeds=None):
  """fp32 embeddings and the RoPE cos/sin tables of the given positions."""
  x_BTD = constrain(embed_tokens(params, tokens_BT, embeds), ("batch", "length", "embed"))
  angles_BTh = rope_angles(spec, positions_BT)
  return x_BTD, jnp.cos(angles_BTh), jnp.sin(angles_BTh)


def _saved_under_remat(remat: bool | str) -> tuple[str, ...]:
  """What a rematerialized layer keeps (`remat`: True or learner.remat_saves), by checkpoint_name: the blockwise
  attention's output (its tile walk is the costliest recompute) and, under "projections", every weight product's."""
  return attention.SAVED_UNDER_REMAT + (("projection",) if remat == "projections" else ())


def _scan_layers(params: Params, spec: ModelSpec, tokens_BT, positions_BT, segment_BT, dtype, remat: bool | str,
                 keep_kv: bool, embeds=None):
  """The cache-less forward: `lax.scan` over the stacked layers (compiles once for all of them). Returns the
  final-normed hidden states and, if `keep_kv`, an attention.LayerCache of every layer's keys [L, B, K, hd, T]
  and values [L, B, K, T, hd]."""
  T = tokens_BT.shape[1]
  x_BTD, cos_BTh, sin_BTh = _embed(params, spec, tokens_BT, positions_BT, embeds)
  slot = jnp.arange(T)
  mask_BTS = None if spec.blockwise(T) else (
      (slot[None, :, None] >= slot[None, None, :]) & attention.visible_BTT(segment_BT))
  layer_fn = functools.partial(_layer, spec, dtype)
  if remat:
    layer_fn = jax.checkpoint(layer_fn, prevent_cse=False,
                              policy=jax.checkpoint_policies.save_only_these_names(*_saved_under_remat(remat)))

  def body(x, w):
    x, kv = layer_fn(x, w, cos_BTh, sin_BTh, None, mask_BTS, segment_BT)
    return x, kv if keep_kv else None

  # Cast up front where the cast is differentiable (bf16 on accelerators: each layer's weights then move as
  # bf16, e.g. in an FSDP all-gather). bf16 kept as uint16 bits on CPU passes no gradient, and the update
  # differentiates this scan through its fp32 master weights: there each layer casts where used (_dot).
  layers = params["layers"]
  if xla_cpu.storage_dtype(dtype) != jnp.uint16:
    layers = _cast_layers(layers, dtype)
  x_BTD, kv = jax.lax.scan(body, x_BTD, layers)
  return rms_norm(x_BTD, params["final_norm"], spec.rms_eps), kv


def forward(params: Params, spec: ModelSpec, tokens_BT, positions_BT, segment_BT, cache: KVCache | None = None,
            dtype=jnp.float32, remat: bool | str = False, embeds=None):
  """Final-normed hidden states [B, T, D] (fp32 residual stream) and the updated cache.

  tokens_BT: int32 ids; positions_BT: int32 RoPE positions, [B, T] or [3, B, T] (see `rope_angles`);
  segment_BT: int32, 0 = padding, or (ids, ends) of packed prefix trees without a cache (attention.visible);
  embeds: rows replacing some tokens' embeddings (see `embed_tokens`).
  Without a cache, token t attends to tokens s <= t of its own segment. With a cache, the T tokens are
  written at slots [cache.end, cache.end + T) and attend to all earlier slots of their segment.
  dtype: compute dtype of the matmuls (fp32 or bf16); norms, softmax and the residual stay fp32.
  With a cache the layers run as a Python loop (see KVCache), on stacked params or on `unstack_layers`
  output; inside a decode loop pass the latter (from `decode_params`) so no step slices the weights.
  """
  if cache is None:
    hidden_BTD, _ = _scan_layers(params, spec, tokens_BT, positions_BT, segment_BT, dtype, remat, keep_kv=False,
                                 embeds=embeds)
    return hidden_BTD, None
  T = tokens_BT.shape[1]
  x_BTD, cos_BTh, sin_BTh = _embed(params, spec, tokens_BT, positions_BT, embeds)
  S = cache.segment_BS.shape[1]
  seg_BS = attention.write_slots(cache.segment_BS, segment_BT.astype(jnp.int32), cache.end, axis=1)
  q_slot_BT = jnp.reshape(cache.end, (-1, 1)) + jnp.arange(T)  # [1, T] or, with an end per row, [B, T]
  tiled = T > 1 and spec.blockwise(S)  # prefill chunks of a long prompt
  if tiled and jnp.ndim(cache.end):
    raise ValueError("a cache with an end per row takes single-token steps or an unblocked attention")
  mask_BTS = None if tiled else ((q_slot_BT[:, :, None] >= jnp.arange(S)[None, None, :])
                                 & (segment_BT[:, :, None] == seg_BS[:, None, :]) & (seg_BS[:, None, :] > 0))
  layers = params["layers"]
  if isinstance(layers, dict):
    layers = unstack_layers(_cast_layers(layers, dtype))
  ks, vs = [], []
  for w, ck, cv in zip(layers, cache.k, cache.v):
    kv = attention.LayerCache(ck, cv, cache.end, seg_BS if tiled else None)
    x_BTD, kv = _layer(spec, dtype, x_BTD, w, cos_BTh, sin_BTh, kv, mask_BTS, segment_BT)
    ks.append(kv.k)
    vs.append(kv.v)
  new_cache = KVCache(k=tuple(ks), v=tuple(vs), segment_BS=seg_BS, end=cache.end + T)
  return rms_norm(x_BTD, params["final_norm"], spec.rms_eps), new_cache


def prefill(params: Params, spec: ModelSpec, tokens_BT, positions_BT, segment_BT, length: int, dtype=jnp.float32,
            chunk: int = 0, embeds=None):
  """The cache-less forward over a prompt (its attention spans only the prompt's T slots, not the cache's),
  keeping every layer's keys/values as a `length`-slot KVCache whose first T slots hold the prompt.
  Returns (final-normed hidden states [B, T, D], cache).

  `chunk` > 0 and shorter than the prompt: the prompt goes through in chunks of that many tokens (a shorter
  first one takes the remainder), each written into the cache and attending to it, tiled when
  spec.blockwise(length): the live activations are one chunk's, not the whole prompt's."""
  B, T = tokens_BT.shape
  if length < T:
    raise ValueError(f"cache length {length} is shorter than the prompt ({T} tokens)")
  if 0 < chunk < T:
    return _prefill_chunked(params, spec, tokens_BT, positions_BT, segment_BT, length, dtype, chunk, embeds)
  hidden_BTD, kv = _scan_layers(params, spec, tokens_BT, positions_BT, segment_BT, dtype, False, keep_kv=True,
                                embeds=embeds)
  pad = length - T
  k = tuple(jnp.pad(kv.k[i], ((0, 0), (0, 0), (0, 0), (0, pad))) for i in range(spec.n_layers))
  v = tuple(jnp.pad(kv.v[i], ((0, 0), (0, 0), (0, pad), (0, 0))) for i in range(spec.n_layers))
  segment_BS = jnp.pad(segment_BT.astype(jnp.int32), ((0, 0), (0, pad)))
  return hidden_BTD, KVCache(k=k, v=v, segment_BS=segment_BS, end=jnp.asarray(T, jnp.int32))


def prefill_after_head(params: Params, spec: ModelSpec, head_k, head_v, head_segment_BH, tokens_BT, positions_BT,
                       segment_BT, length: int, dtype=jnp.float32):
  """`prefill` of prompts whose head's keys and values are given (head_k / head_v: per layer, in KVCache
  layout, H slots; head_segment_BH: each slot's segment, 0 for padding): the T new tokens attend to the head
  and causally to each other, a `lax.scan` over the stacked layers as `_scan_layers` (a loop of cached forwards
  runs slower here). Returns (final-normed hidden states [B, T, D], a `length`-slot KVCache: the head at [0, H),
  the tokens at [H, H+T))."""
  T = tokens_BT.shape[1]
  H = head_k[0].shape[-1]
  x_BTD, cos_BTh, sin_BTh = _embed(params, spec, tokens_BT, positions_BT)
  seg_BS = jnp.concatenate([head_segment_BH.astype(jnp.int32), segment_BT.astype(jnp.int32)], axis=1)
  slot_S = jnp.arange(H + T)
  mask_BTS = (((H + jnp.arange(T))[None, :, None] >= slot_S[None, None, :])
              & (segment_BT[:, :, None] == seg_BS[:, None, :]) & (seg_BS[:, None, :] > 0))
  grow = lambda a, axis: jnp.pad(a, [(0, T) if i == axis else (0, 0) for i in range(a.ndim)])

  def body(x, xs):
    w, k, v = xs
    x, kv = _layer(spec, dtype, x, w, cos_BTh, sin_BTh, attention.LayerCache(grow(k, 3), grow(v, 2), jnp.int32(H)),
                   mask_BTS, segment_BT)
    return x, (kv.k, kv.v)

  x_BTD, (k, v) = jax.lax.scan(body, x_BTD, (_cast_layers(params["layers"], dtype), jnp.stack(head_k), jnp.stack(head_v)))
  room = length - H - T
  return rms_norm(x_BTD, params["final_norm"], spec.rms_eps), KVCache(
      k=tuple(jnp.pad(k[i], ((0, 0), (0, 0), (0, 0), (0, room))) for i in range(spec.n_layers)),
      v=tuple(jnp.pad(v[i], ((0, 0), (0, 0), (0, room), (0, 0))) for i in range(spec.n_layers)),
      segment_BS=jnp.pad(seg_BS, ((0, 0), (0, room))), end=jnp.asarray(H + T, jnp.int32))


def _prefill_chunked(params, spec, tokens_BT, positions_BT, segment_BT, length, dtype, chunk, embeds=None):
  B, T = tokens_BT.shape
  first = T % chunk or chunk
  cache = KVCache.create(spec, B, length, dtype)
  index_BT, rows_ND = embeds if embeds is not None else (None, None)
  with_rows = lambda index: None if embeds is None else (index, rows_ND)
  head = lambda x: None if x is None else x[..., :first]  # slices the token axis (last: positions may be [3, B, T])
  hidden_BTD, cache = forward(params, spec, head(tokens_BT), head(positions_BT), head(segment_BT), cache, dtype,
                              embeds=with_rows(head(index_BT)))
  rest = (T - first) // chunk
  if not rest:
    return hidden_BTD, cache
  split = lambda x: None if x is None else jnp.moveaxis(x[..., first:].reshape(*x.shape[:-1], rest, chunk), -2, 0)

  def body(cache, xs):
    tokens, positions, segment, index = xs
    hidden_BCD, cache = forward(params, spec, tokens, positions, segment, cache, dtype, embeds=with_rows(index))
    return cache, hidden_BCD

  cache, hidden_nBCD = jax.lax.scan(body, cache, (split(tokens_BT), split(positions_BT), split(segment_BT),
                                                  split(index_BT)))
  tail_BTD = hidden_nBCD.swapaxes(0, 1).reshape(B, T - first, -1)
  return jnp.concatenate([hidden_BTD, tail_BTD], axis=1), cache


def _cast_layers(layers: Params, dtype) -> Params:
  """Matmul weights to the compute dtype (uint16 bits for bf16 on CPU); norms and biases stay fp32. No gradient
  passes the uint16 bits: where they are used, a differentiated forward casts per layer instead (_scan_layers)."""
  if jnp.dtype(dtype) == jnp.float32:
    return layers
  big = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
  return {k: (to_storage(v, dtype) if k in big and v.dtype != jnp.uint16 else v) for k, v in layers.items()}


def logits_from_hidden(params: Params, spec: ModelSpec, hidden_BTD, dtype=jnp.float32):
  """fp32 logits [B, T, V] from final hidden states (tied embedding or separate head)."""
  if spec.tie_embeddings:
    return _dot("btd,vd->btv", hidden_BTD, params["embed"], dtype)
  return _dot("btd,dv->btv", hidden_BTD, params["lm_head"], dtype)


def cast_params(params: Params, dtype) -> Params:
  """Params with the layer weights in the compute dtype (uint16 bits for bf16 on CPU): cast once, not per call."""
  return {**params, "layers": _cast_layers(params["layers"], dtype)}


def unstack_layers(layers: Params) -> tuple[Params, ...]:
  """The stacked [L, ...] layer weights as one dict per layer."""
  n = len(next(iter(layers.values())))
  return tuple({name: a[i] for name, a in layers.items()} for i in range(n))


def decode_params(params: Params, dtype) -> Params:
  """Params for a loop of cached forwards (decoding), prepared once outside the loop: weights cast to the
  compute dtype, split per layer (no step slices a stacked array), q/k/v and gate/up each fused into one
  matrix and wo flattened to [heads * head_dim, D] (one weight pass per group at decode's few rows)."""
  layers = dict(_cast_layers(params["layers"], dtype))
  L, D = layers["wq"].shape[:2]
  flat = lambda name: layers.pop(name).reshape(L, D, -1)
  layers["wqkv"] = jnp.concatenate([flat("wq"), flat("wk"), flat("wv")], axis=-1)
  layers["w_gate_up"] = jnp.concatenate([layers.pop("w_gate"), layers.pop("w_up")], axis=-1)
  layers["wo"] = layers["wo"].reshape(L, -1, D)
  if "bq" in layers:
    layers["bqkv"] = jnp.concatenate([layers.pop(b).reshape(L, -1) for b in ("bq", "bk", "bv")], axis=-1)
  return {**params, "layers": unstack_layers(layers)}


def left_pad_positions(valid_BT):
  """RoPE positions for left-padded rows: 0 at each row's first real token (padding gets 0 too)."""
  return jnp.maximum(jnp.cumsum(valid_BT.astype(jnp.int32), axis=1) - 1, 0)


def full_logits(params: Params, spec: ModelSpec, tokens_BT, valid_BT, dtype=jnp.float32):
  """Logits [B, T, V] of left-padded rows without a cache (reference checks and small models)."""
  segment_BT = valid_BT.astype(jnp.int32)
  hidden_BTD, _ = forward(params, spec, tokens_BT, left_pad_positions(valid_BT), segment_BT, None, dtype)
  return logits_from_hidden(params, spec, hidden_BTD, dtype)
