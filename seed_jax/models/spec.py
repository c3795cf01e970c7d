"""Architecture description of the supported decoder-only transformers (Llama/SmolLM, Qwen2/2.5, Qwen3)."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_FAMILY = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


ATTENTION_IMPLS = ("auto", "blocked", "xla_blockwise", "splash", "cudnn")
PACKED_BLOCK = 128  # packed rows' attention tiles: small enough to skip most cross-segment work
PACKED_ROWS_PER_STEP = 2  # packed rows attend two rows per batch shard at a time on XLA:CPU (see for_packed_rows)
BLOCKWISE_MIN_TOKENS = 4096  # "auto" switches where the blocked path's T x T scores start to dominate memory


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """HF `rope_scaling`: kind "linear" (positions / factor) or "llama3" (frequency-band interpolation)."""
  kind: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Static shape/hyper-parameters of one model; hashable so jitted functions can close over it."""
  architecture: str
  vocab_size: int
  dim: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  rms_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  tie_embeddings: bool = False
  max_seq_len: int = 4096
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  # Multimodal rotary (Qwen2.5-VL): the head_dim/2 frequencies split into (t, h, w) sections, each rotated by
  # its own axis of [3, B, T] positions. None: positions are [B, T] (text models).
  mrope_section: tuple[int, ...] | None = None
  # Qwen2.5-VL: the vision tower's VisionSpec (models/vision.py); params then hold its weights under "vision" and
  # the jitted forwards take an image batch (models/vlm.ImageBatch). None: a text-only model.
  vision: Any = None
  # How the cache-less forward attends (an execution choice, not architecture; config.model.attention):
  # "blocked": query blocks against every key up to their end, scores materialized (fastest for short rows);
  # "xla_blockwise": models/attention.py, online softmax over key tiles of attention_block slots, O(T) memory;
  # "splash": JAX's Pallas splash kernel (TPU; Pallas' interpreter elsewhere), same contract;
  # "cudnn": cuDNN's fused attention through jax.nn.dot_product_attention (GPU), same contract;
  # "auto": xla_blockwise from BLOCKWISE_MIN_TOKENS tokens on.
  attention: str = "auto"
  attention_block: int = 512
  attention_rows_per_step: int = 0  # xla_blockwise: rows of each batch shard per step, 0 = all at once

  @property
  def family(self) -> str:
    return _FAMILY[self.architecture]

  def blockwise(self, tokens: int) -> bool:
    """Whether a forward over `tokens` slots attends tile by tile (models/attention.py), never [T, T] scores."""
    return self.attention in ("xla_blockwise", "splash", "cudnn") or (
        self.attention == "auto" and tokens >= BLOCKWISE_MIN_TOKENS)

  def for_packed_rows(self) -> "ModelSpec":
    """The spec of a forward over packed rows (several sequences per row): with "auto" on XLA:CPU it attends
    blockwise in tiles of PACKED_BLOCK slots, which skips the tiles between segments
    (models/attention.block_ranges), faster than the blocked path forward and backward. Accelerators keep
    "auto"'s choice by length (not measured there; "splash" takes segment ids on TPU).

    Rows attend PACKED_ROWS_PER_STEP per batch shard at a time: each step walks only its rows' tiles and its score
    tiles stay in cache, faster than all rows at once (benchmarks.packed_attention)."""
    import jax
    if self.attention != "auto" or jax.default_backend() != "cpu":
      return self
    return dataclasses.replace(self, attention="xla_blockwise", attention_block=PACKED_BLOCK,
                               attention_rows_per_step=PACKED_ROWS_PER_STEP)

  def with_attention(self, model_cfg) -> "ModelSpec":
    """This spec with config.model's attention choice."""
    return dataclasses.replace(self, attention=model_cfg.attention, attention_block=int(model_cfg.attention_block))

  @property
  def qkv_bias(self) -> bool:
    return self.family == "qwen2"

  @property
  def qk_norm(self) -> bool:
    return self.family == "qwen3"

  def __post_init__(self):
    if self.attention not in ATTENTION_IMPLS:
      raise ValueError(f"model.attention={self.attention!r}; choose one of {ATTENTION_IMPLS}")
    if self.architecture not in SUPPORTED_ARCHITECTURES:
      raise ValueError(f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
    if self.mrope_section is not None and sum(self.mrope_section) != self.head_dim // 2:
      raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim / 2 = {self.head_dim // 2}")

  @classmethod
  def from_hf_config(cls, cfg: dict[str, Any]) -> "ModelSpec":
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), archs[0] if archs else cfg.get("model_type"))
    if arch not in SUPPORTED_ARCHITECTURES:
      raise ValueError(f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    # transformers >= 5 writes `rope_parameters` (theta included); older checkpoints `rope_scaling` + `rope_theta`.
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling") or None
    rope_theta = float((rs or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if cfg.get("use_sliding_window") or (arch != "Qwen2ForCausalLM" and cfg.get("attention_bias")):
      raise ValueError(f"unsupported {arch} variant: sliding-window attention and attention_bias are not implemented")
    scaling = None
    if rs is not None:
      kind = rs.get("rope_type", rs.get("type"))
      if kind in ("linear", "llama3"):
        scaling = RopeScaling(kind=kind, factor=float(rs["factor"]),
                              low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
                              high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
                              original_max_position=int(rs.get("original_max_position_embeddings", 8192)))
      elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: linear, llama3")
    n_heads = cfg["num_attention_heads"]
    eos = cfg.get("eos_token_id")
    return cls(
        architecture=arch, vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads, ffn_dim=cfg["intermediate_size"],
        rms_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=rope_theta, rope_scaling=scaling,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_seq_len=cfg.get("max_position_embeddings", 4096), bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos)

  def to_hf_config(self) -> dict[str, Any]:
    cfg = {
        "architectures": [self.architecture], "model_type": self.family, "vocab_size": self.vocab_size,
        "hidden_size": self.dim, "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
        "num_key_value_heads": self.n_kv_heads, "head_dim": self.head_dim, "intermediate_size": self.ffn_dim,
        "rms_norm_eps": self.rms_eps, "rope_theta": self.rope_theta, "tie_word_embeddings": self.tie_embeddings,
        "max_position_embeddings": self.max_seq_len, "hidden_act": "silu", "torch_dtype": "float32",
        "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
        "attention_bias": self.qkv_bias,
    }
    if self.rope_scaling is not None:
      rs = self.rope_scaling
      cfg["rope_scaling"] = {"rope_type": rs.kind, "factor": rs.factor}
      if rs.kind == "llama3":
        cfg["rope_scaling"].update(low_freq_factor=rs.low_freq_factor, high_freq_factor=rs.high_freq_factor,
                                   original_max_position_embeddings=rs.original_max_position)
    return cfg

  def rope_inv_freq(self) -> np.ndarray:
    """Inverse frequencies [head_dim/2], with HF's linear/llama3 scaling applied."""
    # float32 throughout, like the reference implementation, so positions map to identical angles.
    inv = np.float32(1.0) / (np.float32(self.rope_theta) ** (np.arange(0, self.head_dim, 2).astype(np.float32) / np.float32(self.head_dim)))
    rs = self.rope_scaling
    if rs is None:
      return inv.astype(np.float32)
    if rs.kind == "linear":
      return (inv / rs.factor).astype(np.float32)
    # llama3: long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    low_wavelen = rs.original_max_position / rs.low_freq_factor
    high_wavelen = rs.original_max_position / rs.high_freq_factor
    wavelen = 2 * np.pi / inv
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    mid = (1 - smooth) * inv / rs.factor + smooth * inv
    out = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
    out = np.where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), mid, out)
    return out.astype(np.float32)


def forward_flops_per_token(spec: ModelSpec, seq_len: int, with_logits: bool = True) -> float:
  """2 x matmul weights (+ the vocabulary projection) plus causal attention (QK and PV over (T+1)/2 keys on
  average) per token of a forward over rows of `seq_len` tokens."""
  D, H, K, hd, F = spec.dim, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.ffn_dim
  per_layer = D * H * hd + 2 * D * K * hd + H * hd * D + 3 * D * F
  matmul = spec.n_layers * per_layer + (spec.dim * spec.vocab_size if with_logits else 0)
  return 2 * matmul + spec.n_layers * 4 * H * hd * (seq_len + 1) / 2
