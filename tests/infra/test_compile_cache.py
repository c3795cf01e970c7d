"""The persistent compilation cache: a fresh process writes the folder, a second fresh process running the same
jitted program reads it instead of compiling (JAX's own cache-hit event, not wall time); so do both processes of
a 2-process CPU job, of what process 0 wrote."""
import os
import socket
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


_TWO_PROCESSES = """
import sys
import numpy as np
from seed_jax.infra import compile_cache
compile_cache.enable(sys.argv[1], min_compile_time_s=0.0)
import jax, jax.numpy as jnp
jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", 2, int(sys.argv[3]), initialization_timeout=60)
rows = jax.sharding.NamedSharding(jax.make_mesh((4,), ("d",)), jax.sharding.PartitionSpec("d"))
x = jax.make_array_from_callback((8, 8), rows, lambda i: np.arange(64.0).reshape(8, 8)[i])
y = jax.jit(lambda a: jnp.tanh(a / 64).sum())(x)  # one program over both processes' devices
print(float(y), compile_cache.hits())
jax.distributed.shutdown()
"""


def _env(devices=1):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return env


def _run(folder):
  out = subprocess.run([sys.executable, "-c", _PROGRAM, str(folder)], env=_env(), capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  value, hits = out.stdout.split()
  return float(value), int(hits)


def _run_two(folder) -> list[tuple[float, int]]:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESSES, str(folder), str(port), str(i)], env=_env(2),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], "\n".join(err[-2000:] for _, err in outs)
  last = [out.strip().splitlines()[-1].split() for out, _ in outs]  # gloo prints lines of its own
  return [(float(value), int(hits)) for value, hits in last]


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


@pytest.mark.slow  # two 2-process jobs
def test_every_process_of_a_cpu_job_reads_what_process_0_wrote(tmp_path):
  """JAX keys a CPU program by a topology fingerprint that holds the process index, and only process 0 writes:
  without compile_cache's key process 1 compiled every program again in every run."""
  folder = tmp_path / "jax_cache"
  first = _run_two(folder)
  again = _run_two(folder)
  assert first[0][0] == first[1][0] == again[0][0] == again[1][0]
  assert again[0][1] >= 1 and again[1][1] >= 1, again  # process 1 read process 0's entries


def test_jax_own_environment_variables_are_the_defaults(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "c"))
  monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.25")
  assert compile_cache.default_dir() == str(tmp_path / "c") and compile_cache.default_min_compile_time_s() == 0.25
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
  assert compile_cache.default_dir() == str(tmp_path / "x" / "seed_jax" / "jax_compilation_cache")
  assert compile_cache.default_min_compile_time_s() == 1.0
