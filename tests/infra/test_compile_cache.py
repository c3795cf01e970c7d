"""The persistent compilation cache: a fresh process writes the folder, a second fresh process running the same
jitted program reads it instead of compiling (JAX's own cache-hit event, not wall time)."""
import os
import subprocess
import sys

import pytest
from helpers import REPO as ROOT
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
