"""Memory planner: per-device bytes of a run's weights, optimizer state, gradients, KV caches and activations.

python -m seed_jax.plan --config=configs/sciworld.py:paper --config.model.path=Qwen2.5-7B-Instruct --preset=v5p_16

The model comes from `model.path`: an HF folder (only its config.json is read), a config.json file, a .gguf
file (metadata only), or a name in KNOWN_MODELS. The mesh comes from --preset (configs/mesh/), else from
config.mesh with --devices (default: the attached devices). Every array is sized per device with the same
rules table the run uses (infra/mesh.py), so an axis the mesh does not divide counts as replicated.

Activations follow the code: the residual stream and everything after a matmul is fp32 (only weights are
cast), attention is materialized as [rows, heads, queries, keys] scores (with a cache) or in causal query blocks
(without), and the vocabulary projection runs
`rescore.vocab_chunk` response positions at a time. They are estimates (XLA fuses and reuses buffers); the
CPU test checks the update's against XLA's own buffer assignment. Prints a table and one JSON line.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import ml_collections

from seed_jax.config import CONFIGS_DIR, MESH_AXES, load_mesh_preset
from seed_jax.infra.mesh import logical_to_spec, resolve, resolve_shape
from seed_jax.models import attention, transformer
from seed_jax.models.spec import ModelSpec

F32 = 4
GiB = 1024 ** 3

# Published config.json values (Hugging Face hub) of models the planner knows by name.
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "Qwen2.5-3B-Instruct": dict(
        architectures=["Qwen2ForCausalLM"], vocab_size=151936, hidden_size=2048, intermediate_size=11008,
        num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, bos_token_id=151643,
        eos_token_id=151645),
    "Qwen2.5-7B-Instruct": dict(
        architectures=["Qwen2ForCausalLM"], vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, bos_token_id=151643,
        eos_token_id=151645),
    "SmolLM2-135M-Instruct": dict(
        architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0, bos_token_id=1, eos_token_id=2),
}


def load_spec(path: str) -> ModelSpec:
  """ModelSpec without reading weights: a KNOWN_MODELS name, an HF folder or config.json, a .gguf file."""
  known = {k.lower(): v for k, v in KNOWN_MODELS.items()}
  name = path.rsplit("/", 1)[-1].lower()
  if not os.path.exists(path) and name in known:
    return ModelSpec.from_hf_config(known[name])
  if path in ("", "embedded") or path.endswith(".gguf"):
    import gguf
    from seed_jax.models import weights
    return weights.gguf_spec(gguf.GGUFReader(weights.embedded_model_path() if path in ("", "embedded") else path))
  cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"model {path!r}: no such config.json, .gguf file or known model "
                            f"({', '.join(KNOWN_MODELS)})")
  with open(cfg_path) as f:
    return ModelSpec.from_hf_config(json.load(f))


def mesh_sizes(mc: ml_collections.ConfigDict, n_devices: int | None = None) -> tuple[dict[str, int], int]:
  """{axis: size} of the whole mesh (slices included) and the device count, without devices attached."""
  mc = resolve(mc)
  if n_devices is None:
    if mc.get("preset"):
      n_devices = int(load_mesh_preset(mc.preset).num_devices)
    elif -1 not in tuple(mc.shape):
      n_devices = math.prod(mc.shape) * math.prod(mc.dcn_shape)
    else:
      import jax
      n_devices = jax.device_count()
  ici = resolve_shape(tuple(mc.shape), n_devices, tuple(mc.dcn_shape))
  return {a: i * d for a, i, d in zip(MESH_AXES, ici, mc.dcn_shape)}, n_devices


def shard_bytes(shape: Sequence[int], axes: Sequence[str | None], mesh: dict[str, int], itemsize: int = F32) -> int:
  """Bytes one device holds of an array laid out by the rules table."""
  n = math.prod(shape)
  for dim in logical_to_spec(axes, shape, mesh):
    for a in (dim if isinstance(dim, tuple) else (dim,) if dim else ()):
      n //= mesh[a]
  return n * itemsize


def param_bytes(spec: ModelSpec, mesh: dict[str, int], itemsize: int = F32) -> int:
  shapes, axes = transformer.param_shapes(spec), transformer.param_axes(spec)
  flat = lambda t: [(k, v) for k, v in t.items() if k != "layers"] + list(t["layers"].items())
  ax = dict(flat(axes))
  return sum(shard_bytes(s, ax[k], mesh, itemsize) for k, s in flat(shapes))


def matmul_weight_bytes(spec: ModelSpec, mesh: dict[str, int], itemsize: int) -> int:
  """The per-layer matmul weights: what the sampler casts once to its compute dtype."""
  shapes, axes = transformer.param_shapes(spec)["layers"], transformer.param_axes(spec)["layers"]
  big = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
  return sum(shard_bytes(shapes[k], axes[k], mesh, itemsize) for k in big)


def kv_cache_bytes(spec: ModelSpec, rows: int, length: int, mesh: dict[str, int], itemsize: int) -> int:
  """K [L, B, K, hd, S] + V [L, B, K, S, hd] (transformer.KVCache)."""
  L, K, hd = spec.n_layers, spec.n_kv_heads, spec.head_dim
  k = shard_bytes((L, rows, K, hd, length), ("layers", "batch", "kv_heads", "head_dim", "cache_length"), mesh, itemsize)
  v = shard_bytes((L, rows, K, length, hd), ("layers", "batch", "kv_heads", "cache_length", "head_dim"), mesh, itemsize)
  return k + v


def causal_score_columns(tokens: int) -> int:
  """Score entries per row and head of a cache-less forward, which attends in query blocks each against
  the keys up to its last position (attention.dense_causal_attention): about the lower triangle."""
  block = attention.QUERY_BLOCK
  return sum(min(block, tokens - t0) * min(t0 + block, tokens) for t0 in range(0, tokens, block))


def layer_activation_bytes(spec: ModelSpec, rows: int, queries: int, keys: int | None, mesh: dict[str, int]) -> int:
  """fp32 intermediates of one transformer block (transformer._layer) that its backward pass reads: the
  block input and both norms' outputs, q/k/v (before and after RoPE), attention scores and probabilities,
  the attention output, and the MLP's gate, up and product. `keys=None`: a cache-less causal forward."""
  B, T, S = rows, queries, keys
  D, H, K, hd, F = spec.dim, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.ffn_dim
  b = lambda shape, axes: shard_bytes(shape, axes, mesh)
  hidden = b((B, T, D), ("batch", "length", None))
  q = b((B, T, H, hd), ("batch", "length", "heads", "head_dim"))
  kv = b((B, T, K, hd), ("batch", "length", "kv_heads", "head_dim"))
  mask = 0
  if S is None and spec.attention == "cudnn":  # fused kernel: scores stay on chip; the boolean [B, T, T] mask, lse
    scores, mask = b((B, H, T), ("batch", "heads", "length")), shard_bytes((B, T, T), ("batch", "length", None), mesh, 1)
  elif S is None and spec.blockwise(T):  # models/attention.py: one live tile, plus per-row max / sum / lse
    tile = min(spec.attention_block, T)
    scores = b((B, H, tile * tile), ("batch", "heads", None)) + 2 * b((B, H, T), ("batch", "heads", "length"))
  elif S is None:
    scores = b((B, H, causal_score_columns(T)), ("batch", "heads", None))
  elif spec.blockwise(S):  # a prefill chunk over the cache, tiled (attention.tiled_cache_attention)
    tile = min(spec.attention_block, S)
    scores = b((B, H, T * tile), ("batch", "heads", None)) + 2 * b((B, H, T), ("batch", "heads", "length"))
  else:  # scores, masked scores, exponentials and probabilities over the whole cache (attention.cache_attention)
    scores = 2 * b((B, H, T, S), ("batch", "heads", "length", "cache_length"))
  mlp = b((B, T, F), ("batch", "length", "mlp"))
  return 4 * hidden + 3 * q + 4 * kv + 2 * scores + mask + 3 * mlp


def prefill_activation_bytes(spec: ModelSpec, rows: int, prompt: int, new: int, chunk: int,
                             mesh: dict[str, int], itemsize: int) -> int:
  """One layer's activations of generation's prefill (transformer.prefill): the whole prompt cache-less, or
  chunks of `chunk` tokens attending to the prompt + new-token cache, plus the cache's copy that the scan over
  chunks carries (in the sampler's dtype)."""
  if 0 < chunk < prompt:
    return (layer_activation_bytes(spec, rows, chunk, prompt + new, mesh)
            + kv_cache_bytes(spec, rows, prompt + new, mesh, itemsize))
  return layer_activation_bytes(spec, rows, prompt, None, mesh)


def logits_bytes(spec: ModelSpec, rows: int, positions: int, mesh: dict[str, int]) -> int:
  """fp32 logits, log-softmax and softmax (entropy) of `positions` response positions."""
  return 3 * shard_bytes((rows, positions, spec.vocab_size), ("batch", "length", "vocab"), mesh)


@dataclasses.dataclass(frozen=True)
class Workload:
  """The shapes a config asks for (worst case: every bucket at its largest size)."""
  sample_rows: int  # rows of one generation call (rollouts)
  sample_prompt: int  # bucketed prompt length
  sample_new: int
  analysis_rows: int  # 0: no policy-side analysis
  analysis_prompt: int
  analysis_new: int
  sample_itemsize: int  # bytes per KV-cache / cast-weight element of the sampler's dtype
  rescore_rows: int
  prompt: int  # bucketed step-prompt length of re-scoring and the update
  response: int  # bucketed response length
  micro_rows: int  # rows of one forward/backward (doubled when both contexts go through the update)
  vocab_chunk: int
  remat: bool
  remat_saves: str  # learner.remat_saves
  reference_on_device: bool  # the frozen KL reference occupies accelerator memory
  prefill_chunk: int = 0  # sampler.prefill_chunk: longer prompts are prefilled this many tokens at a time

  @classmethod
  def from_config(cls, cfg: ml_collections.ConfigDict, data_parallel: int) -> "Workload":
    pow2_at_least = lambda n, lo=64: max(lo, 1 << (max(n, 1) - 1).bit_length())
    itemsize = 2 if cfg.sampler.dtype == "bfloat16" else 4
    policy_analysis = cfg.analyzer.enabled and cfg.analyzer.backend == "policy"
    # The sampler rounds a call's rows up to a power of two (at least one per data-parallel device) and
    # splits larger requests into calls of sampler.max_batch rows.
    rows = lambda n: min(pow2_at_least(n, data_parallel), max(cfg.sampler.max_batch, data_parallel))
    episodes = cfg.rollout.tasks_per_update * cfg.rollout.group_size
    uses_skill = cfg.analyzer.enabled and cfg.objectives.opd_variant != "none"
    return cls(
        sample_rows=rows(episodes), sample_prompt=pow2_at_least(cfg.model.max_prompt_tokens),
        sample_new=cfg.rollout.max_new_tokens,
        analysis_rows=rows(episodes) if policy_analysis else 0,
        analysis_prompt=pow2_at_least(cfg.analyzer.max_prompt_tokens), analysis_new=cfg.analyzer.max_new_tokens,
        sample_itemsize=itemsize, rescore_rows=max(cfg.rescore.max_rows, data_parallel),
        prompt=pow2_at_least(cfg.model.max_prompt_tokens), response=pow2_at_least(cfg.rollout.max_new_tokens),
        micro_rows=cfg.learner.micro_batch_size * (2 if uses_skill and cfg.learner.teacher == "current" else 1),
        vocab_chunk=cfg.rescore.vocab_chunk, remat=bool(cfg.learner.remat),
        remat_saves=cfg.learner.remat_saves,
        reference_on_device=cfg.objectives.kl_coef > 0 and cfg.mesh.ref_params_memory == "device",
        prefill_chunk=cfg.sampler.prefill_chunk)


AUTO_MAX_ROWS = 1024  # the largest row count "auto" tries


def fitting_rows(cfg: ml_collections.ConfigDict, spec: ModelSpec, mesh: dict[str, int], device_memory: int,
                 field: str) -> int:
  """`field` ("sampler.max_batch" or "rescore.max_rows") set to "auto" (0): the largest power of two up to
  AUTO_MAX_ROWS whose plan fits `device_memory`, the other settings as configured; the data-parallel size if
  none does. Rows are independent (the sampler's per-row keys), so the choice changes memory, not results."""
  data = mesh.get("data", 1) * mesh.get("fsdp", 1)
  trial = ml_collections.ConfigDict(cfg.to_dict())
  section, name = field.split(".")
  for other in ("sampler.max_batch", "rescore.max_rows"):  # an "auto" sibling is sized at the smallest first
    a, b = other.split(".")
    if not trial[a][b]:
      trial[a][b] = data
  rows = AUTO_MAX_ROWS
  while rows > data:
    trial[section][name] = rows
    if plan(spec, mesh, Workload.from_config(trial, data), device_memory)["peak"] <= device_memory:
      return rows
    rows //= 2
  return data


def device_memory_bytes() -> int:
  """One local device's memory: the accelerator's limit, or on CPU the host's RAM shared by its devices."""
  import jax
  stats = jax.local_devices()[0].memory_stats() or {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(jax.local_device_count(), 1)


def update_activation_bytes(spec: ModelSpec, w: Workload, mesh: dict[str, int], remat: bool) -> int:
  """Peak activations of one micro-batch's forward + backward (update.micro_loss)."""
  B, T, R = w.micro_rows, w.prompt + w.response, w.response
  layer = layer_activation_bytes(spec, B, T, None, mesh)
  block_input = shard_bytes((B, T, spec.dim), ("batch", "length", None), mesh)
  chunk = min(w.vocab_chunk, R)
  if remat:  # saved: each block's input (and the blockwise attention's output and lse, SAVED_UNDER_REMAT);
    # live in the backward: one block recomputed plus its cotangents
    if spec.blockwise(T) and spec.attention not in ("splash", "cudnn"):
      block_input += shard_bytes((B, T, spec.n_heads, spec.head_dim + 1), ("batch", "length", "heads", None), mesh)
    if w.remat_saves == "projections":  # and the weight products' outputs the backward reads: q, k, v, gate, up, o
      F = (spec.n_heads + 2 * spec.n_kv_heads) * spec.head_dim + 2 * spec.ffn_dim + spec.dim
      block_input += shard_bytes((B, T, F), ("batch", "length", None), mesh)
    return spec.n_layers * block_input + 2 * layer + 2 * logits_bytes(spec, B, chunk, mesh)
  return spec.n_layers * layer + layer + logits_bytes(spec, B, R, mesh) + logits_bytes(spec, B, chunk, mesh)


def plan(spec: ModelSpec, mesh: dict[str, int], w: Workload, device_memory: int = 0) -> dict[str, Any]:
  """Per-device bytes of each item and of each phase's peak (what is live at once)."""
  p = param_bytes(spec, mesh)
  items = {
      "params": p,
      "optimizer": 2 * p,  # AdamW: two fp32 moments laid out like the weights
      "gradients": 2 * p,  # the accumulated sum plus the current micro-batch's
      "reference_params": p if w.reference_on_device else 0,
      "sampler_cast_weights": matmul_weight_bytes(spec, mesh, w.sample_itemsize) if w.sample_itemsize < F32 else 0,
      "kv_cache_rollout": kv_cache_bytes(spec, w.sample_rows, w.sample_prompt + w.sample_new, mesh, w.sample_itemsize),
      # The prefill is a cache-less forward over the prompt (transformer.prefill); decoding adds one query.
      "prefill_activations_rollout": prefill_activation_bytes(spec, w.sample_rows, w.sample_prompt, w.sample_new,
                                                              w.prefill_chunk, mesh, w.sample_itemsize),
      "kv_cache_analysis": kv_cache_bytes(spec, w.analysis_rows, w.analysis_prompt + w.analysis_new, mesh,
                                          w.sample_itemsize) if w.analysis_rows else 0,
      "prefill_activations_analysis": (prefill_activation_bytes(spec, w.analysis_rows, w.analysis_prompt,
                                                                w.analysis_new, w.prefill_chunk, mesh,
                                                                w.sample_itemsize)
                                       if w.analysis_rows else 0),
      "rescore_activations": layer_activation_bytes(spec, w.rescore_rows, w.prompt + w.response, None, mesh)
                             + logits_bytes(spec, w.rescore_rows, min(w.vocab_chunk, w.response), mesh),
      "update_activations_remat": update_activation_bytes(spec, w, mesh, remat=True),
      "update_activations_no_remat": update_activation_bytes(spec, w, mesh, remat=False),
  }
  resident = items["params"] + items["optimizer"] + items["reference_params"]
  act = items["update_activations_remat" if w.remat else "update_activations_no_remat"]
  sampling = resident + items["sampler_cast_weights"]
  phases = {
      "rollout": sampling + items["kv_cache_rollout"] + items["prefill_activations_rollout"],
      "analysis": (sampling + items["kv_cache_analysis"] + items["prefill_activations_analysis"]
                   if w.analysis_rows else 0),
      "rescore": resident + items["rescore_activations"],
      "update": resident + items["gradients"] + p + act,  # + p: AdamW's update tree before it is applied
  }
  peak = max(phases.values())
  return dict(items=items, phases=phases, peak=peak, device_memory=device_memory,
              fits=None if not device_memory else peak <= device_memory, notes=notes(spec, mesh, w))


def notes(spec: ModelSpec, mesh: dict[str, int], w: Workload) -> list[str]:
  """Layout facts that change the numbers a lot: rows or heads that do not divide their mesh axes."""
  dp, tp = mesh["data"] * mesh["fsdp"], mesh["tensor"]
  out = []
  for what, rows in (("update micro-batch", w.micro_rows), ("rescore batch", w.rescore_rows),
                     ("rollout batch", w.sample_rows), ("analysis batch", w.analysis_rows)):
    if rows and rows % dp:
      out.append(f"{what} of {rows} rows does not divide over data x fsdp = {dp} devices: its activations are "
                 f"replicated (use a multiple of {dp})")
  for what, n in (("heads", spec.n_heads), ("kv_heads", spec.n_kv_heads), ("mlp", spec.ffn_dim),
                  ("vocab", spec.vocab_size)):
    if tp > 1 and n % tp:
      out.append(f"{what} = {n} does not divide tensor = {tp}: replicated over the tensor axis")
  if not w.reference_on_device:
    out.append("the KL reference weights are not in accelerator memory (pinned_host or kl_coef = 0)")
  return out


def format_table(spec: ModelSpec, mesh: dict[str, int], n_devices: int, w: Workload, out: dict[str, Any]) -> str:
  g = lambda b: f"{b / GiB:9.2f}"
  lines = [f"model: {spec.architecture} L={spec.n_layers} D={spec.dim} H={spec.n_heads}/{spec.n_kv_heads} "
           f"F={spec.ffn_dim} V={spec.vocab_size} tied={spec.tie_embeddings}",
           f"mesh: {mesh} on {n_devices} devices",
           f"shapes: rollout {w.sample_rows} rows x ({w.sample_prompt}+{w.sample_new}); "
           f"analysis {w.analysis_rows} rows x ({w.analysis_prompt}+{w.analysis_new}); rescore {w.rescore_rows} rows; "
           f"update micro-batch {w.micro_rows} rows x ({w.prompt}+{w.response}), remat={w.remat}",
           f"{'per device':31s}{'GiB':>9s}"]
  lines += [f"  {k:29s}{g(v)}" for k, v in out["items"].items()]
  lines += ["peak by phase"] + [f"  {k:29s}{g(v)}" for k, v in out["phases"].items()]
  fit = "" if out["fits"] is None else \
      f"  ({'fits' if out['fits'] else 'DOES NOT FIT'} in {out['device_memory'] / GiB:.1f} GiB)"
  lines.append(f"  {'peak':29s}{g(out['peak'])}{fit}")
  lines += [f"note: {n}" for n in out["notes"]]
  return "\n".join(lines)


def main(argv):
  del argv
  from absl import flags
  cfg = flags.FLAGS.config
  if flags.FLAGS.preset:
    cfg.mesh.preset = flags.FLAGS.preset
  spec = load_spec(flags.FLAGS.model or cfg.model.path).with_attention(cfg.model)
  mesh, n_devices = mesh_sizes(cfg.mesh, flags.FLAGS.devices or None)
  device_memory = 0
  if cfg.mesh.preset:
    device_memory = int(load_mesh_preset(cfg.mesh.preset).device_memory_bytes)
  w = Workload.from_config(cfg, mesh["data"] * mesh["fsdp"])
  out = plan(spec, mesh, w, device_memory)
  print(format_table(spec, mesh, n_devices, w, out))
  print(json.dumps(dict(model=flags.FLAGS.model or cfg.model.path, mesh=mesh, devices=n_devices,
                        workload=dataclasses.asdict(w), **out)))


if __name__ == "__main__":
  from absl import app, flags as _flags
  from ml_collections import config_flags
  config_flags.DEFINE_config_file("config", os.path.join(CONFIGS_DIR, "sciworld.py"),
                                  "ml_collections config file[:variant]")
  _flags.DEFINE_string("preset", "", "mesh preset (configs/mesh/<name>.py); overrides config.mesh.preset")
  _flags.DEFINE_string("model", "", "model to plan for (known name, HF folder, config.json, .gguf); "
                       "default: config.model.path")
  _flags.DEFINE_integer("devices", 0, "device count when neither a preset nor a full mesh.shape gives it")
  app.run(main)
