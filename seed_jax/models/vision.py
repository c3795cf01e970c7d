"""The Qwen2.5-VL vision tower: patch embedding, 2-D rotary, window attention blocks, 2x2 patch merger.

Images arrive as the image processor's flat patches [N, C * temporal * patch * patch] (models/image_processing.py),
several images concatenated, each described by its grid (t, h, w) in patches. The grids are host-side numbers:
`vision_inputs` turns them into numpy tables (window permutation, rotary cos/sin, attention segment ids), so
`encode` is jitted once per set of grid shapes with static shapes throughout.

Tokens run in window order: merged 2x2 units are permuted so each attention window is a contiguous run of
tokens, and attention is masked to equal segment ids (a window, or a whole frame in the full-attention blocks).
The merger output is permuted back, giving one row per merged unit in the processor's order, the rows that
replace the image placeholder tokens of the language model.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from seed_jax.models.xla_cpu import batched_dot
from seed_jax.models.transformer import rms_norm

Params = dict[str, Any]
Grid = tuple[int, int, int]  # (t, h, w) in patches
_MASKED = -1e30
QUERY_BLOCK = 1024  # queries per score block: live scores are [heads, QUERY_BLOCK, N], not [heads, N, N]


@dataclasses.dataclass(frozen=True)
class VisionSpec:
  """Static hyper-parameters of the vision tower (HF `vision_config`); hashable for jit."""
  depth: int
  dim: int
  n_heads: int
  ffn_dim: int
  out_dim: int
  full_attention_blocks: tuple[int, ...]
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  window_size: int = 112
  in_channels: int = 3
  rope_theta: float = 10000.0
  tokens_per_second: int = 4
  rms_eps: float = 1e-6

  @property
  def head_dim(self) -> int:
    return self.dim // self.n_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def merge_unit(self) -> int:
    return self.merge_size ** 2

  def __post_init__(self):
    if self.dim % self.n_heads or self.head_dim % 4:
      raise ValueError(f"vision dim {self.dim} / {self.n_heads} heads must give a head_dim divisible by 4")
    if self.window_size % (self.merge_size * self.patch_size):
      raise ValueError(f"window_size {self.window_size} is not a multiple of merge_size * patch_size")
    if any(not 0 <= i < self.depth for i in self.full_attention_blocks):
      raise ValueError(f"full-attention blocks {self.full_attention_blocks} outside depth {self.depth}")

  @classmethod
  def from_hf_config(cls, vc: dict[str, Any]) -> "VisionSpec":
    if vc.get("hidden_act", "silu") != "silu":
      raise ValueError(f"unsupported vision hidden_act {vc['hidden_act']!r}; Qwen2.5-VL uses silu")
    rope = vc.get("rope_parameters") or {}
    return cls(depth=vc["depth"], dim=vc["hidden_size"], n_heads=vc["num_heads"], ffn_dim=vc["intermediate_size"],
               out_dim=vc["out_hidden_size"], full_attention_blocks=tuple(vc["fullatt_block_indexes"]),
               patch_size=vc.get("patch_size", 14), temporal_patch_size=vc.get("temporal_patch_size", 2),
               merge_size=vc.get("spatial_merge_size", 2), window_size=vc.get("window_size", 112),
               in_channels=vc.get("in_channels", vc.get("in_chans", 3)),  # "in_chans" in Hub configs
               rope_theta=float(rope.get("rope_theta", 10000.0)),
               tokens_per_second=int(vc.get("tokens_per_second", 4)))

  def to_hf_config(self) -> dict[str, Any]:
    return {"model_type": "qwen2_5_vl_vision", "depth": self.depth, "hidden_size": self.dim,
            "num_heads": self.n_heads, "intermediate_size": self.ffn_dim, "out_hidden_size": self.out_dim,
            "fullatt_block_indexes": list(self.full_attention_blocks), "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size, "spatial_merge_size": self.merge_size,
            "window_size": self.window_size, "in_channels": self.in_channels, "hidden_act": "silu",
            "tokens_per_second": self.tokens_per_second,
            "rope_parameters": {"rope_type": "axial", "rope_theta": self.rope_theta}}


def param_shapes(vs: VisionSpec) -> Params:
  L, D, F, M = vs.depth, vs.dim, vs.ffn_dim, vs.dim * vs.merge_unit
  blocks = {"attn_norm": (L, D), "w_qkv": (L, D, 3 * D), "b_qkv": (L, 3 * D), "wo": (L, D, D), "bo": (L, D),
            "mlp_norm": (L, D), "w_gate": (L, D, F), "b_gate": (L, F), "w_up": (L, D, F), "b_up": (L, F),
            "w_down": (L, F, D), "b_down": (L, D)}
  merger = {"norm": (D,), "w1": (M, M), "b1": (M,), "w2": (M, vs.out_dim), "b2": (vs.out_dim,)}
  return {"patch_embed": (vs.patch_dim, D), "blocks": blocks, "merger": merger}


def param_axes(vs: VisionSpec) -> Params:
  """Logical axes of every tower weight (infra/mesh.py rules), as the decoder's: the model width over "embed"
  (fsdp), the MLP width over "mlp" (tensor); the fused q/k/v and merger widths, and biases, are not split."""
  del vs
  blocks = {"attn_norm": ("layers", "embed"), "w_qkv": ("layers", "embed", None), "b_qkv": ("layers", None),
            "wo": ("layers", None, "embed"), "bo": ("layers", "embed"), "mlp_norm": ("layers", "embed"),
            "w_gate": ("layers", "embed", "mlp"), "b_gate": ("layers", "mlp"), "w_up": ("layers", "embed", "mlp"),
            "b_up": ("layers", "mlp"), "w_down": ("layers", "mlp", "embed"), "b_down": ("layers", "embed")}
  merger = {"norm": ("embed",), "w1": (None, None), "b1": (None,), "w2": (None, "embed"), "b2": ("embed",)}
  return {"patch_embed": (None, "embed"), "blocks": blocks, "merger": merger}


def init_params(vs: VisionSpec, seed: int = 0) -> Params:
  """Random weights (norms 1, biases 0): for tests and shape checks, not a trained tower."""
  keys = iter(jax.random.split(jax.random.key(seed), 32))

  def make(name, shape):
    if name.endswith("norm"):
      return jnp.ones(shape, jnp.float32)
    if name.startswith("b"):
      return jnp.zeros(shape, jnp.float32)
    return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

  return jax.tree.map_with_path(lambda path, s: make(path[-1].key, s), param_shapes(vs),
                                is_leaf=lambda x: isinstance(x, tuple))


# ------------------------------------------------------------------ host-side tables (numpy, static per grid)


@flax.struct.dataclass
class VisionInputs:
  """What `encode` needs besides pixels, computed on host from the grids. N patches, U = N / merge_unit units.
  window_index_U: unit permutation into window order; reverse_index_U its inverse; cos_Nh / sin_Nh: rotary
  tables in window order; full_segment_N / window_segment_N: attention segment ids in window order (one per
  frame / one per window)."""
  window_index_U: Any
  reverse_index_U: Any
  cos_Nh: Any
  sin_Nh: Any
  full_segment_N: Any
  window_segment_N: Any


def num_patches(grids: Sequence[Grid]) -> int:
  return sum(t * h * w for t, h, w in grids)


def num_merged(vs: VisionSpec, grid: Grid) -> int:
  """Rows the merger produces for one image: its count of image placeholder tokens in the prompt."""
  t, h, w = grid
  return t * h * w // vs.merge_unit


def _check_grids(vs: VisionSpec, grids: Sequence[Grid]) -> None:
  if not grids:
    raise ValueError("no image grids given")
  for g in grids:
    if len(g) != 3 or min(g) < 1 or g[1] % vs.merge_size or g[2] % vs.merge_size:
      raise ValueError(f"image grid {tuple(g)} must be (t, h, w) >= 1 with h, w multiples of {vs.merge_size}")


def _rotary_positions(vs: VisionSpec, grid: Grid) -> np.ndarray:
  """[t*h*w, 2] (row, column) of each patch, in the processor's merge-block order."""
  t, h, w = grid
  m = vs.merge_size
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  block = lambda a: a.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
  return np.tile(np.stack([block(rows), block(cols)], axis=-1), (t, 1))


def _window_index(vs: VisionSpec, grid: Grid, offset: int) -> tuple[np.ndarray, np.ndarray]:
  """Unit indices of one image in window order and the unit count of each (non-empty) window."""
  t, h, w = grid
  uh, uw = h // vs.merge_size, w // vs.merge_size
  win = vs.window_size // vs.merge_size // vs.patch_size  # window side in units
  # HF pads by a whole window when a side is already a multiple: only empty windows come of it, dropped below.
  ph, pw = uh + win - uh % win, uw + win - uw % win
  index = np.full((t, ph, pw), -1, np.int64)
  index[:, :uh, :uw] = np.arange(t * uh * uw).reshape(t, uh, uw)
  index = index.reshape(t, ph // win, win, pw // win, win).transpose(0, 1, 3, 2, 4).reshape(t, -1, win * win)
  sizes = (index >= 0).sum(-1).reshape(-1)
  flat = index.reshape(-1)
  return flat[flat >= 0] + offset, sizes[sizes > 0]


def vision_inputs(vs: VisionSpec, grids: Sequence[Grid]) -> VisionInputs:
  """The host-side tables of `encode` for images with these grids (in prompt order)."""
  grids = [tuple(int(x) for x in g) for g in grids]
  _check_grids(vs, grids)
  unit = vs.merge_unit
  windows, window_sizes, positions, frames = [], [], [], []
  offset = 0
  for g in grids:
    index, sizes = _window_index(vs, g, offset)
    windows.append(index)
    window_sizes.append(sizes)
    positions.append(_rotary_positions(vs, g))
    frames += [g[1] * g[2]] * g[0]
    offset += num_merged(vs, g)
  window_index = np.concatenate(windows)
  order_N = (window_index[:, None] * unit + np.arange(unit)).reshape(-1)  # patch permutation into window order
  spatial = vs.head_dim // 2
  inv_freq = np.float32(1.0) / (np.float32(vs.rope_theta) ** (np.arange(0, spatial, 2, dtype=np.float32)
                                                              / np.float32(spatial)))
  angles = np.concatenate(positions)[order_N].astype(np.float32)[:, :, None] * inv_freq  # [N, 2, hd/4]
  angles = np.tile(angles.reshape(len(order_N), -1), (1, 2))  # (rows, cols) halves, repeated for rotate-half
  window_segment = np.repeat(np.arange(1, sum(map(len, window_sizes)) + 1), np.concatenate(window_sizes) * unit)
  # Window order keeps every frame's tokens contiguous and in frame order, so frame ids need no permutation.
  full_segment = np.repeat(np.arange(1, len(frames) + 1), frames)
  return VisionInputs(window_index_U=window_index.astype(np.int32),
                      reverse_index_U=np.argsort(window_index).astype(np.int32),
                      cos_Nh=np.cos(angles), sin_Nh=np.sin(angles),
                      full_segment_N=full_segment.astype(np.int32), window_segment_N=window_segment.astype(np.int32))


# ------------------------------------------------------------------ the jitted tower


def _dot(eq, a, b, dtype):
  return jnp.einsum(eq, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _rope(x_NHh, cos_Nh, sin_Nh):
  half = x_NHh.shape[-1] // 2
  rot = jnp.concatenate([-x_NHh[..., half:], x_NHh[..., :half]], axis=-1)
  return x_NHh * cos_Nh[:, None] + rot * sin_Nh[:, None]


def _attention(q_NHh, k_NHh, v_NHh, segment_N, dtype):
  """Bidirectional attention within equal segment ids, in query blocks of QUERY_BLOCK."""
  q_NHh = q_NHh * q_NHh.shape[-1] ** -0.5
  out = []
  for n0 in range(0, q_NHh.shape[0], QUERY_BLOCK):
    n1 = min(n0 + QUERY_BLOCK, q_NHh.shape[0])
    s_HnN = batched_dot("nhd,mhd->hnm", q_NHh[n0:n1], k_NHh, dtype)
    mask_nN = segment_N[n0:n1, None] == segment_N[None, :]
    p_HnN = jax.nn.softmax(jnp.where(mask_nN[None], s_HnN, _MASKED), axis=-1)
    out.append(batched_dot("hnm,mhd->nhd", p_HnN, v_NHh, dtype))
  return jnp.concatenate(out, axis=0)


def _block(vs: VisionSpec, dtype, x_ND, w, full, inputs: VisionInputs):
  N, D = x_ND.shape
  segment_N = jnp.where(full, inputs.full_segment_N, inputs.window_segment_N)
  h_ND = rms_norm(x_ND, w["attn_norm"], vs.rms_eps)
  qkv_N3Hh = (_dot("nd,df->nf", h_ND, w["w_qkv"], dtype) + w["b_qkv"]).reshape(N, 3, vs.n_heads, vs.head_dim)
  q_NHh, k_NHh = (_rope(qkv_N3Hh[:, i], inputs.cos_Nh, inputs.sin_Nh) for i in (0, 1))
  o_NHh = _attention(q_NHh, k_NHh, qkv_N3Hh[:, 2], segment_N, dtype)
  x_ND = x_ND + _dot("nf,fd->nd", o_NHh.reshape(N, D), w["wo"], dtype) + w["bo"]
  h_ND = rms_norm(x_ND, w["mlp_norm"], vs.rms_eps)
  gate_NF = _dot("nd,df->nf", h_ND, w["w_gate"], dtype) + w["b_gate"]
  up_NF = _dot("nd,df->nf", h_ND, w["w_up"], dtype) + w["b_up"]
  return x_ND + _dot("nf,fd->nd", jax.nn.silu(gate_NF) * up_NF, w["w_down"], dtype) + w["b_down"]


def encode(params: Params, vs: VisionSpec, pixels_NP, inputs: VisionInputs, dtype=jnp.float32):
  """Image features [U, out_dim] (fp32): one row per merged 2x2 unit, images in order, each in the processor's
  unit order. pixels_NP: the processor's patches of all images, concatenated; inputs: `vision_inputs` of
  their grids."""
  N = pixels_NP.shape[0]
  if N != inputs.full_segment_N.shape[0] or pixels_NP.shape[1] != vs.patch_dim:
    raise ValueError(f"pixels {tuple(pixels_NP.shape)} do not match the grids' {inputs.full_segment_N.shape[0]} "
                     f"patches of {vs.patch_dim} values")
  unit, U = vs.merge_unit, N // vs.merge_unit
  x_ND = _dot("np,pd->nd", pixels_NP, params["patch_embed"], dtype)  # the Conv3d: stride == kernel
  x_ND = x_ND.reshape(U, unit, -1)[inputs.window_index_U].reshape(N, -1)
  full_L = jnp.asarray(np.isin(np.arange(vs.depth), vs.full_attention_blocks))

  def body(x_ND, xs):
    w, full = xs
    return _block(vs, dtype, x_ND, w, full, inputs), None

  x_ND, _ = jax.lax.scan(body, x_ND, (params["blocks"], full_L))
  m = params["merger"]
  h_UM = rms_norm(x_ND, m["norm"], vs.rms_eps).reshape(U, -1)
  h_UM = jax.nn.gelu(_dot("um,mk->uk", h_UM, m["w1"], dtype) + m["b1"], approximate=False)
  out_UO = _dot("um,mo->uo", h_UM, m["w2"], dtype) + m["b2"]
  return out_UO[inputs.reverse_index_U]

