"""The CPU-sized vision-language policy: a tiny random Qwen2.5-VL checkpoint, written once as an HF folder.

config.model.path "embedded-vl" resolves here. The weights come from a fixed seed (random, untrained: it runs
the whole pipeline end to end, it does not play well). No Qwen tokenizer ships offline, so the folder's
tokenizer is the embedded SmolLM2 one (the same ChatML chat template as Qwen's) with Qwen2.5-VL's vision
special tokens added after its vocabulary; the model's vocabulary covers exactly those ids.
"""
from __future__ import annotations

import json
import os

from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.models import vlm, vlm_weights, weights
from seed_jax.models.spec import ModelSpec
from seed_jax.models.vision import VisionSpec

EMBEDDED_VL = "embedded-vl"
VERSION = 1
SEED = 0
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")  # in id order


def default_dir() -> str:
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "seed_jax", f"tiny-qwen2.5-vl-v{VERSION}")


def ensure_tiny_vl(path: str = "") -> str:
  """The folder of the tiny checkpoint (default: the user cache), written there first if it is not yet."""
  path = path or default_dir()
  if os.path.exists(os.path.join(path, "preprocessor_config.json")):  # written last
    return path
  tmp = f"{path}.tmp{os.getpid()}"
  hf = tokenizer_lib.from_gguf(weights.embedded_model_path()).hf
  base = len(hf)
  hf.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
  ids = [hf.convert_tokens_to_ids(t) for t in VISION_TOKENS]
  if ids != list(range(base, base + len(VISION_TOKENS))):
    raise RuntimeError(f"vision tokens got ids {ids}, expected {base}..")
  text = ModelSpec("Qwen2ForCausalLM", vocab_size=len(hf), dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                   ffn_dim=128, rms_eps=1e-6, rope_theta=1000000.0, tie_embeddings=True, max_seq_len=4096,
                   bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id, mrope_section=(2, 3, 3))
  vs = VisionSpec(depth=2, dim=32, n_heads=2, ffn_dim=64, out_dim=64, full_attention_blocks=(1,), window_size=112)
  vls = vlm.VLSpec(text, vs, image_token_id=ids[2], video_token_id=ids[3], vision_start_token_id=ids[0],
                   vision_end_token_id=ids[1])
  vlm_weights.export_hf(vlm.init_params(vls, SEED), vls, tmp)
  hf.save_pretrained(tmp)
  # Frames up to 112 x 112 keep their size (Sokoban's 96 x 96 -> 84 x 84: 9 image tokens); larger ones shrink.
  with open(os.path.join(tmp, "preprocessor_config.json"), "w") as f:
    json.dump({"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 56 * 56, "max_pixels": 112 * 112,
               "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}, f, indent=2)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  try:
    os.rename(tmp, path)
  except OSError:  # another process wrote it first
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
  return path
