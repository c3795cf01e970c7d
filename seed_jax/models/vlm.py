"""Qwen2.5-VL: the vision tower (models/vision.py) feeding the decoder (models/transformer.py).

A prompt holds, for each image, a run of `image_token_id` placeholders, one per merged 2x2 patch unit of that
image (vision.num_merged). The host prepares, from the token ids and the image grids, everything whose shape
depends on them (`prepare`): the 3-D (t, h, w) rotary positions of Qwen2.5-VL's multimodal RoPE, the index of
the image-feature row each placeholder takes, and the vision tower's tables. The jitted `forward` then encodes
the pixels and runs the one decoder forward with those rows in place of the placeholders' token embeddings.

Images only: video inputs (temporal positions scaled by tokens_per_second) are not handled.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax
import jax.numpy as jnp
import numpy as np

from seed_jax.models import transformer, vision
from seed_jax.models.spec import ModelSpec
from seed_jax.models.vision import Grid, VisionInputs, VisionSpec

Params = dict[str, Any]  # {"vision": vision params, "lm": transformer params}
ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"


@dataclasses.dataclass(frozen=True)
class VLSpec:
  """A Qwen2.5-VL checkpoint: the language model (a Qwen2 decoder with mrope_section), the vision tower and
  the special token ids."""
  text: ModelSpec
  vision: VisionSpec
  image_token_id: int
  video_token_id: int
  vision_start_token_id: int
  vision_end_token_id: int

  @classmethod
  def from_hf_config(cls, cfg: dict[str, Any]) -> "VLSpec":
    arch = (cfg.get("architectures") or [cfg.get("model_type")])[0]
    if arch != ARCHITECTURE:
      raise ValueError(f"unsupported vision-language architecture {arch!r}; supported: {ARCHITECTURE}")
    text = dict(cfg.get("text_config") or cfg)  # checkpoints before transformers 4.5x keep text keys at the top
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or cfg.get("rope_scaling") or {})
    if "mrope_section" not in rope:
      raise ValueError("Qwen2.5-VL config without rope mrope_section")
    section = tuple(int(s) for s in rope["mrope_section"])
    theta = rope.get("rope_theta", text.get("rope_theta", 1000000.0))
    text.pop("head_dim", None)  # Qwen2.5-VL's attention always uses hidden_size // num_attention_heads
    text.update(architectures=["Qwen2ForCausalLM"], rope_parameters={"rope_type": "default", "rope_theta": theta},
                tie_word_embeddings=cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    text.pop("rope_scaling", None)
    spec = dataclasses.replace(ModelSpec.from_hf_config(text), mrope_section=section)
    return cls(text=spec, vision=VisionSpec.from_hf_config(cfg["vision_config"]),
               image_token_id=int(cfg["image_token_id"]), video_token_id=int(cfg["video_token_id"]),
               vision_start_token_id=int(cfg["vision_start_token_id"]),
               vision_end_token_id=int(cfg["vision_end_token_id"]))

  def to_hf_config(self) -> dict[str, Any]:
    text = self.text.to_hf_config()
    for key in ("architectures", "head_dim", "rope_theta", "attention_bias", "tie_word_embeddings"):
      text.pop(key, None)
    text.update(model_type="qwen2_5_vl_text", rope_parameters={
        "rope_type": "default", "rope_theta": self.text.rope_theta, "mrope_section": list(self.text.mrope_section)})
    return {"architectures": [ARCHITECTURE], "model_type": "qwen2_5_vl", "text_config": text,
            "vision_config": self.vision.to_hf_config(), "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id, "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id, "tie_word_embeddings": self.text.tie_embeddings,
            "dtype": "float32"}


def policy_spec(vls: VLSpec) -> ModelSpec:
  """The decoder's spec carrying the vision tower's: what the sampler, re-scorer and update close over."""
  return dataclasses.replace(vls.text, vision=vls.vision)


def policy_params(params: Params) -> Params:
  """{"vision", "lm"} as one policy tree: the decoder's weights at the top (transformer reads them as they
  are) and the tower's under "vision", so one optimizer state and checkpoint cover both."""
  return {**params["lm"], "vision": params["vision"]}


def init_params(vls: VLSpec, seed: int = 0) -> Params:
  return {"vision": vision.init_params(vls.vision, seed), "lm": transformer.init_params(vls.text, seed + 1)}


# ------------------------------------------------------------------ host side: positions and placeholder index


def check_image_tokens(vls: VLSpec, tokens_BT: np.ndarray, grids: Sequence[Grid]) -> None:
  """Raises ValueError unless the prompt's image placeholders are exactly the images' feature rows."""
  n_tokens = int((np.asarray(tokens_BT) == vls.image_token_id).sum())
  n_rows = sum(vision.num_merged(vls.vision, tuple(g)) for g in grids)
  if n_tokens != n_rows:
    raise ValueError(f"the prompt has {n_tokens} image placeholder tokens (id {vls.image_token_id}) but its "
                     f"{len(grids)} image(s) give {n_rows} feature rows: one placeholder per merged patch unit")


def image_index(vls: VLSpec, tokens_BT: np.ndarray, grids: Sequence[Grid]) -> np.ndarray:
  """int32 [B, T]: the image-feature row each placeholder takes (placeholders in row-major order take the
  images' rows in order), -1 for every other token."""
  check_image_tokens(vls, tokens_BT, grids)
  is_image = np.asarray(tokens_BT) == vls.image_token_id
  return np.where(is_image, np.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1, -1).astype(np.int32)


def rope_index(vls: VLSpec, tokens_BT: np.ndarray, grids: Sequence[Grid],
               valid_BT: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Qwen2.5-VL's 3-D rotary positions: int32 [3, B, T] and the per-row offset [B] that decoding adds to
  ordinary positions (next position = tokens so far + offset).

  Text tokens step all three axes by one. An image is one run of placeholders (llm grid t x h' x w',
  h' = h / merge) at start + (frame, row, column); the text after it resumes at start + max(h', w'). Padding
  (valid_BT == 0) gets position 0. `grids`: all rows' images in row-major order."""
  tokens_BT = np.asarray(tokens_BT)
  B, T = tokens_BT.shape
  valid_BT = np.ones((B, T), bool) if valid_BT is None else np.asarray(valid_BT).astype(bool)
  check_image_tokens(vls, np.where(valid_BT, tokens_BT, -1), grids)
  m = vls.vision.merge_size
  positions = np.zeros((3, B, T), np.int64)
  deltas = np.zeros((B,), np.int64)
  images = iter(tuple(int(x) for x in g) for g in grids)
  for b in range(B):
    row = tokens_BT[b][valid_BT[b]]
    pos = np.zeros((3, len(row)), np.int64)
    i, current = 0, 0
    while i < len(row):
      if row[i] != vls.image_token_id:
        pos[:, i] = current
        i, current = i + 1, current + 1
        continue
      t, h, w = next(images)
      n = t * (h // m) * (w // m)
      run = np.argmax(np.append(row[i:] != vls.image_token_id, True))  # consecutive placeholders from i
      if run != n:  # one run per image, as transformers reads them
        raise ValueError(f"row {b}: {run} consecutive image placeholder tokens at {i}, but the image there "
                         f"(grid {(t, h, w)}) gives {n} feature rows")
      tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h // m), np.arange(w // m), indexing="ij")
      pos[:, i:i + n] = np.stack([tt, hh, ww]).reshape(3, -1) + current
      i, current = i + n, current + max(h, w) // m
    positions[:, b, valid_BT[b]] = pos
    deltas[b] = (pos.max() + 1 if len(row) else 0) - len(row)
  return positions.astype(np.int32), deltas.astype(np.int32)


@flax.struct.dataclass
class VLInputs:
  """The host-prepared arrays of one multimodal batch (see `prepare`)."""
  positions_3BT: Any
  index_BT: Any
  vision: VisionInputs


def prepare(vls: VLSpec, tokens_BT: np.ndarray, grids: Sequence[Grid],
            valid_BT: np.ndarray | None = None) -> tuple[VLInputs, np.ndarray]:
  """Everything shape-dependent of a batch, in numpy: (VLInputs, rope offsets [B] for decoding)."""
  positions_3BT, deltas_B = rope_index(vls, tokens_BT, grids, valid_BT)
  inputs = VLInputs(positions_3BT=positions_3BT, index_BT=image_index(vls, tokens_BT, grids),
                    vision=vision.vision_inputs(vls.vision, grids))
  return inputs, deltas_B


# ------------------------------------------------------------------ jitted


def input_embeddings(params: Params, vls: VLSpec, tokens_BT, pixels_NP, inputs: VLInputs, dtype=jnp.float32):
  """fp32 [B, T, D]: token embeddings with the image features in the placeholders' places."""
  rows_UD = vision.encode(params["vision"], vls.vision, pixels_NP, inputs.vision, dtype)
  return transformer.embed_tokens(params["lm"], tokens_BT, (inputs.index_BT, rows_UD))


def forward(params: Params, vls: VLSpec, tokens_BT, segment_BT, pixels_NP, inputs: VLInputs,
            cache: transformer.KVCache | None = None, dtype=jnp.float32):
  """Final-normed hidden states [B, T, D] and the cache, as transformer.forward, for a prompt with images."""
  rows_UD = vision.encode(params["vision"], vls.vision, pixels_NP, inputs.vision, dtype)
  return transformer.forward(params["lm"], vls.text, tokens_BT, inputs.positions_3BT, segment_BT, cache, dtype,
                             embeds=(inputs.index_BT, rows_UD))


def logits(params: Params, vls: VLSpec, tokens_BT, segment_BT, pixels_NP, inputs: VLInputs, dtype=jnp.float32):
  """fp32 logits [B, T, V] of a prompt with images (no cache)."""
  hidden_BTD, _ = forward(params, vls, tokens_BT, segment_BT, pixels_NP, inputs, None, dtype)
  return transformer.logits_from_hidden(params["lm"], vls.text, hidden_BTD, dtype)


# ------------------------------------------------------------------ image batches of the policy's jitted calls


@flax.struct.dataclass
class ImageBatch:
  """The images of one jitted call laid out for its token rows [B, T] (images.layout_images builds it): the
  processor patches of every image of the call (padded to a bucket of N patches), the tower's tables, the
  feature row each placeholder takes (-1 elsewhere) and the M-RoPE positions of every token, [B, 3, T] so
  that every leaf splits by its leading axis into micro-batches."""
  pixels_NP: Any
  vision: VisionInputs
  index_BT: Any
  positions_B3T: Any


def forward_inputs(params, spec: ModelSpec, images: ImageBatch | None, positions_BT, dtype=jnp.float32):
  """(positions, embeds) for transformer.forward / prefill: the text positions and no rows without images;
  with them the 3-D positions and the tower's rows for the placeholders (the tower runs here, in the jit)."""
  if images is None:
    return positions_BT, None
  if spec.vision is None:
    raise ValueError("an image batch needs a vision-language spec (ModelSpec.vision)")
  rows_UD = vision.encode(params["vision"], spec.vision, images.pixels_NP, images.vision, dtype)
  return jnp.moveaxis(images.positions_B3T, 1, 0), (images.index_BT, rows_UD)
