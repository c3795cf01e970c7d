"""Qwen2.5-VL weights in and out of Hugging Face checkpoint folders (safetensors, one file or sharded).

Two key layouts exist: the Hub's (`visual.*`, `model.layers.*`, `model.embed_tokens`, what transformers 5.x
`save_pretrained` writes) and transformers 4.5x's (`model.visual.*`, `model.language_model.*`). Both load;
export writes the Hub's. `lm_head.weight` is absent when the embeddings are tied.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np

from seed_jax.models import transformer, vision, weights
from seed_jax.models.vlm import Params, VLSpec

# Our vision block weight -> (HF name inside "{visual}blocks.{i}.", "in": HF [out, in] transposed, or "vec").
HF_BLOCK = {
    "attn_norm": ("norm1.weight", "vec"), "mlp_norm": ("norm2.weight", "vec"),
    "w_qkv": ("attn.qkv.weight", "in"), "b_qkv": ("attn.qkv.bias", "vec"),
    "wo": ("attn.proj.weight", "in"), "bo": ("attn.proj.bias", "vec"),
    "w_gate": ("mlp.gate_proj.weight", "in"), "b_gate": ("mlp.gate_proj.bias", "vec"),
    "w_up": ("mlp.up_proj.weight", "in"), "b_up": ("mlp.up_proj.bias", "vec"),
    "w_down": ("mlp.down_proj.weight", "in"), "b_down": ("mlp.down_proj.bias", "vec"),
}
HF_MERGER = {"norm": ("ln_q.weight", "vec"), "w1": ("mlp.0.weight", "in"), "b1": ("mlp.0.bias", "vec"),
             "w2": ("mlp.2.weight", "in"), "b2": ("mlp.2.bias", "vec")}
PATCH = "patch_embed.proj.weight"  # Conv3d [D, C, t, p, p]: ours is its [C * t * p * p, D] matmul form
LAYOUTS = {"hub": ("visual.", "model."), "transformers4": ("model.visual.", "model.language_model.")}


def _lm_keys(lm: str) -> dict[str, str]:
  return {"embed": f"{lm}embed_tokens.weight", "final_norm": f"{lm}norm.weight", "lm_head": "lm_head.weight"}


def load_hf(path: str, mesh=None) -> tuple[VLSpec, Params]:
  """Loads a Qwen2.5-VL HF checkpoint folder: (spec, {"vision": ..., "lm": ...}); the language model's weights
  and the vision tower's are placed by their logical axes (sharded under `mesh`, as weights.load_hf's)."""
  cfg, tensor, names = weights.open_hf_folder(path)
  vls = VLSpec.from_hf_config(cfg)
  visual, lm = LAYOUTS["transformers4" if "model.language_model.embed_tokens.weight" in names else "hub"]
  spec, vs = vls.text, vls.vision
  shapes = transformer.param_shapes(spec)

  def read_lm(name: str, layer: int | None) -> np.ndarray:
    if layer is None:
      key = _lm_keys(lm)[name]
      return weights.to_ours(tensor(key), weights.HF_TOP[name][1], shapes[name], key)
    hf, kind = weights.HF_LAYER[name]
    key = f"{lm}layers.{layer}.{hf}"
    return weights.to_ours(tensor(key), kind, shapes["layers"][name][1:], key)

  lm_params = weights.assemble(spec, read_lm, weights.default_placer(mesh, spec))
  vshapes = vision.param_shapes(vs)

  def read(key: str, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    return weights.to_ours(tensor(key), kind, shape, key)

  blocks = {name: np.stack([read(f"{visual}blocks.{i}.{hf}", kind, vshapes["blocks"][name][1:])
                            for i in range(vs.depth)]) for name, (hf, kind) in HF_BLOCK.items()}
  merger = {name: read(f"{visual}merger.{hf}", kind, vshapes["merger"][name])
            for name, (hf, kind) in HF_MERGER.items()}
  patch = tensor(f"{visual}{PATCH}")
  vision_params = {"patch_embed": weights.to_ours(patch.reshape(patch.shape[0], -1), "in", vshapes["patch_embed"],
                                                  f"{visual}{PATCH}"), "blocks": blocks, "merger": merger}
  place = weights.default_placer(mesh, spec)
  vision_params = jax.tree.map(lambda ax, w: place(ax, w), vision.param_axes(vs), vision_params,
                               is_leaf=lambda x: isinstance(x, tuple))
  return vls, {"vision": vision_params, "lm": lm_params}


def export_hf(params: Params, vls: VLSpec, out_dir: str) -> None:
  """Writes config.json + model.safetensors (the Hub's key layout) that transformers'
  Qwen2_5_VLForConditionalGeneration loads with identical outputs."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  host = jax.tree.map(lambda a: np.asarray(jax.device_get(a), np.float32), params)
  visual, lm = LAYOUTS["hub"]
  vs = vls.vision
  tensors: dict[str, np.ndarray] = {}
  for name, key in _lm_keys(lm).items():
    if name in host["lm"]:
      tensors[key] = weights.to_hf(host["lm"][name], weights.HF_TOP[name][1])
  for name, stacked in host["lm"]["layers"].items():
    hf, kind = weights.HF_LAYER[name]
    for i in range(vls.text.n_layers):
      tensors[f"{lm}layers.{i}.{hf}"] = weights.to_hf(stacked[i], kind)
  v = host["vision"]
  tensors[f"{visual}{PATCH}"] = np.ascontiguousarray(v["patch_embed"].T.reshape(
      vs.dim, vs.in_channels, vs.temporal_patch_size, vs.patch_size, vs.patch_size))
  for name, (hf, kind) in HF_BLOCK.items():
    for i in range(vs.depth):
      tensors[f"{visual}blocks.{i}.{hf}"] = weights.to_hf(v["blocks"][name][i], kind)
  for name, (hf, kind) in HF_MERGER.items():
    tensors[f"{visual}merger.{hf}"] = weights.to_hf(v["merger"][name], kind)
  save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(vls.to_hf_config(), f, indent=2)
