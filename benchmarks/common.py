"""Shared pieces of the model benchmarks: the SmolLM2-135M weights as an HF folder both sides load, child
processes (so each side's peak memory is its own), timing, the CPU's fp32 matmul peak and FLOP counts.

A benchmark's parent process exports the weights once, runs one child per side (`--child NAME`, which
prints one JSON line) and prints one JSON line with both sides, their ratios and the load average.
"""
from __future__ import annotations

import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from seed_jax.infra import machine
from seed_jax.models import spec as spec_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_THREADS = 2


def export_embedded(out_dir: str):
  """Writes the embedded SmolLM2-135M-Instruct (GGUF) as an HF folder (config.json + safetensors); returns
  its ModelSpec."""
  from seed_jax.models import load, weights
  spec, params = load.load_model("embedded")
  weights.export_hf(params, spec, out_dir)
  return spec


def run_child(module: str, child: str, model_dir: str, **kw: Any) -> dict[str, Any]:
  """Runs `python -m module --child child ...` and returns the JSON object of its last stdout line."""
  args = [sys.executable, "-m", module, "--child", child, "--model_dir", model_dir]
  for k, v in kw.items():
    args += [f"--{k}", str(v)]
  env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
  proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
  if proc.returncode:
    raise RuntimeError(f"{module} child {child!r} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_rss_mb() -> float:
  """High-water resident set of this process (Linux reports ru_maxrss in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
  """Wall seconds of `runs` calls of `fn` (which must block until its result is ready)."""
  out = []
  for _ in range(runs):
    t0 = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t0)
  return out


def median(xs: list[float]) -> float:
  return statistics.median(xs)


def matmul_peak_gflops(n: int = 2048, runs: int = 7, dtype: str = "float32") -> float:
  """GFLOP/s of one large jnp matmul (median), the practical compute ceiling of this CPU: operands in `dtype`,
  fp32 results, as the model's projections (bf16 runs native AVX512_BF16 / AMX products where the CPU has them)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  mm = jax.jit(functools.partial(jnp.matmul, preferred_element_type=jnp.float32))
  mm(a, b).block_until_ready()
  return 2 * n ** 3 / median(timed(lambda: mm(a, b).block_until_ready(), runs)) / 1e9


def stream_bandwidth_gbs(mb: int = 1024, runs: int = 7) -> float:
  """GB/s at which one jitted matrix-vector product reads an `mb` MB fp32 matrix (median): the rate a decode
  step, which reads every weight once per token, can read memory on this CPU with every core."""
  import jax
  import jax.numpy as jnp
  n = 8192
  w = jnp.ones((mb * 2 ** 20 // 4 // n, n), jnp.float32)
  v = jnp.ones((n,), jnp.float32)
  mv = jax.jit(jnp.dot)
  mv(w, v).block_until_ready()
  return w.size * 4 / median(timed(lambda: mv(w, v).block_until_ready(), runs)) / 1e9


forward_flops_per_token = spec_lib.forward_flops_per_token


def decode_read_floor(spec, n_params: int, dtype: str, rows: float, attended: float,
                      bandwidth_gbs: float) -> tuple[float, float, float]:
  """(floor ms, weight bytes, KV bytes) of one decode step: every weight in `dtype` and the keys and values of
  `rows` rows attending `attended` positions each, read once at `bandwidth_gbs`."""
  item = 2 if dtype == "bfloat16" else 4
  weights = n_params * item
  kv = 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * item * rows * attended
  return (weights + kv) / (bandwidth_gbs * 1e9) * 1e3, weights, kv


def load_torch(model_dir: str):
  """The HF PyTorch model (fp32, eval, default attention) on TORCH_THREADS threads."""
  import torch
  from transformers import AutoModelForCausalLM
  torch.set_num_threads(TORCH_THREADS)
  return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def load_avg() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


cpu_model = machine.cpu_description


def emit(result: dict[str, Any]) -> None:
  """One JSON line; a parent's result (not a child's) gets the CPU model if it has none."""
  if "bench" in result and "cpu" not in result:
    result = dict(result, cpu=cpu_model())
  print(json.dumps(result), flush=True)
