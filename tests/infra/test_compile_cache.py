"""The persistent compilation cache: a fresh process writes the folder, a second fresh process running the same
jitted program reads it instead of compiling (JAX's own cache-hit event, not wall time)."""
import os
import subprocess
import sys

import pytest
from helpers import REPO as ROOT
from seed_jax.infra import compile_cache
_PROGRAM = """
import sys
from seed_jax.infra import compile_cache
compile_cache.enable(sys.argv[1], min_compile_time_s=0.0)
import jax, jax.numpy as jnp
x = jax.jit(lambda a: jnp.tanh(a @ a.T).sum())(jnp.arange(64.0).reshape(8, 8))
print(float(x), compile_cache.hits())
"""


def _run(folder):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _PROGRAM, str(folder)], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  value, hits = out.stdout.split()
  return float(value), int(hits)


@pytest.mark.slow  # two fresh interpreters
def test_second_process_reads_the_cache(tmp_path):
  folder = tmp_path / "jax_cache"
  value, hits = _run(folder)
  assert hits == 0
  files = sorted(os.listdir(folder))
  assert any(f.startswith("jit__lambda") for f in files), files
  again, hits = _run(folder)
  assert again == value and hits >= 1
  assert sorted(os.listdir(folder)) == files  # nothing new was compiled and written


def test_jax_own_environment_variables_are_the_defaults(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "c"))
  monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.25")
  assert compile_cache.default_dir() == str(tmp_path / "c") and compile_cache.default_min_compile_time_s() == 0.25
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
  assert compile_cache.default_dir() == str(tmp_path / "x" / "seed_jax" / "jax_compilation_cache")
  assert compile_cache.default_min_compile_time_s() == 1.0
