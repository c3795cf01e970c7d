"""Where one `seed_jax.main` process spends its time: the same run twice on one fresh compilation cache, first
empty (what a CI machine and every test's first run see), then warm (what a second run sees), with JAX's own
duration events: tracing, lowering, XLA compiles (and the programs that took longest), cache reads.

`--tiny` (the default) runs the test suite's kind of job: the tiny random Llama of tests/helpers.py with the
embedded tokenizer on TextWorldExpress, 3 tasks x 2 rollouts, 3 updates, on 8 CPU devices; `--notiny` runs the
given config as it is. Flags after `--` go to seed_jax.main (e.g. `-- --config.train.num_updates=1`).
`--processes=2` runs it as tests/test_pods.py's pods do: 2 processes of 4 devices on a loopback coordinator.
Prints one JSON line: per run the process's wall and CPU seconds (its own and its waited-for children's), and from
after `import jax` the seconds to the first rollout program (start-up: imports, tokenizer, environment processes,
weights) and those JAX spent tracing, lowering, compiling and reading the cache; with several processes, the
job's wall time and each process's line. XLA_FLAGS set outside are kept (to try a flag on both runs).

Usage: python -m benchmarks.startup [--config_file=configs/textworld_express.py] [--notiny] [--processes=2]
                                    [-- --config.x=y ...]
"""
from __future__ import annotations

import collections
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks import common

_CONFIG = flags.DEFINE_string("config_file", "configs/textworld_express.py", "seed_jax config file")
_TINY = flags.DEFINE_bool("tiny", True, "the tests' tiny random Llama and small settings")
_DEVICES = flags.DEFINE_integer("devices", 8, "CPU devices (XLA's host platform device count), over all processes")
_PROCESSES = flags.DEFINE_integer("processes", 1, "processes of the job (a loopback coordinator), each with "
                                  "devices / processes CPU devices, as tests/test_pods.py runs them")

# The test suite's small TextWorldExpress job (tests/test_pods.py's settings).
TINY_FLAGS = ("--config.model.max_prompt_tokens=512", "--config.rollout.tasks_per_update=3",
              "--config.rollout.group_size=2", "--config.rollout.max_new_tokens=12", "--config.env.max_steps=3",
              "--config.analyzer.max_new_tokens=24", "--config.learner.minibatch_size=8",
              "--config.learner.micro_batch_size=8", "--config.train.num_updates=3", "--config.eval.every=2",
              "--config.eval.max_tasks=5")
_COMPILED = re.compile(r"Finished XLA compilation of (.+) in ([0-9.e-]+) sec")


def child(argv: list[str]) -> None:
  """Runs seed_jax.main with `argv`, then prints the summed JAX duration events as the last stdout line."""
  import logging

  import jax
  from jax import monitoring
  seconds, counts, compiles, first_prefill = collections.defaultdict(float), collections.Counter(), [], []
  t0 = time.perf_counter()

  def on_duration(event: str, duration: float, **_) -> None:
    seconds[event] += duration
    counts[event] += 1

  class Compiles(logging.Handler):
    def emit(self, record):
      if m := _COMPILED.search(record.getMessage()):
        compiles.append((m.group(1), float(m.group(2))))
        if "prefill" in m.group(1) and not first_prefill:  # the first rollout's first program: start-up ends
          first_prefill.append(time.perf_counter() - t0 - float(m.group(2)))

  monitoring.register_event_duration_secs_listener(on_duration)
  monitoring.register_event_listener(lambda event, **_: counts.update([event]))
  jax.config.update("jax_log_compiles", True)  # the compiled programs' names, logged by jax._src.dispatch
  logging.getLogger("jax").addHandler(Compiles())
  from seed_jax import main
  sys.argv = ["seed_jax.main", *argv]
  status = 0
  try:
    main.run()
  except SystemExit as e:
    status = e.code or 0
  ev = lambda name: f"/jax/core/compile/{name}"
  print(json.dumps({
      "exit": status, "wall_s": round(time.perf_counter() - t0, 1),
      "to_first_prefill_s": round(first_prefill[0], 1) if first_prefill else None,
      "programs": counts[ev("backend_compile_duration")],  # compiled or read from the cache
      "compile_s": round(seconds[ev("backend_compile_duration")], 1),
      "trace_s": round(seconds[ev("jaxpr_trace_duration")], 1),
      "lower_s": round(seconds[ev("jaxpr_to_mlir_module_duration")], 1),
      "cache_hits": counts["/jax/compilation_cache/cache_hits"],
      "cache_read_s": round(seconds["/jax/compilation_cache/cache_retrieval_time_sec"], 1),
      "longest_compiles": [[n, round(s, 2)] for n, s in sorted(compiles, key=lambda c: -c[1])[:6]],
      "cpu_s": round(sum(getattr(resource.getrusage(who), f) for f in ("ru_utime", "ru_stime")
                         for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)), 1)}), flush=True)


def _run(argv: list[str], cache_dir: str, workdir: str) -> dict:
  """The job once: its processes' lines (one process: its line), with the job's wall time."""
  n = _PROCESSES.value
  devices = f"--xla_force_host_platform_device_count={_DEVICES.value // n}"
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache_dir,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", TOKENIZERS_PARALLELISM="false",
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {devices}")
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  job = lambda i: [] if n == 1 else [f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                                     f"--config.distributed.num_processes={n}", f"--config.distributed.process_id={i}"]
  logs = [tempfile.TemporaryFile("w+") for _ in range(n)]  # not pipes: a full one would stall its process
  t0 = time.perf_counter()
  procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.startup", "--child", "--", *argv,
                             f"--workdir={workdir}", *job(i)], cwd=common.ROOT, env=env, stdout=log, stderr=log,
                            text=True) for i, log in enumerate(logs)]
  for p in procs:
    p.wait()
  wall = time.perf_counter() - t0
  outs = []
  for p, log in zip(procs, logs):
    log.seek(0)
    output = log.read()
    lines = [line for line in output.strip().splitlines() if line.startswith("{")]
    if p.returncode or not lines:
      raise RuntimeError(f"seed_jax.main failed ({p.returncode}):\n{output[-4000:]}")
    out = json.loads(lines[-1])
    if out["exit"]:
      raise RuntimeError(f"seed_jax.main exited {out['exit']}:\n{output[-4000:]}")
    outs.append(out)
  return dict(outs[0], process_wall_s=round(wall, 1)) if n == 1 else {"process_wall_s": round(wall, 1),
                                                                      "processes": outs}


def main(argv: list[str]) -> None:
  rest = argv[1:]  # what absl left after `--`: seed_jax.main's flags
  with tempfile.TemporaryDirectory() as tmp:
    args = [f"--config={_CONFIG.value}"]
    if _TINY.value:
      sys.path.insert(0, os.path.join(common.ROOT, "tests"))
      from helpers import save_tiny_llama
      from seed_jax.models import load
      model = save_tiny_llama(os.path.join(tmp, "tiny"), load.load_tokenizer("embedded"))
      args += [f"--config.model.path={model}", *TINY_FLAGS]
    args += rest
    cache = os.path.join(tmp, "jax_cache")
    runs = {name: _run(args, cache, os.path.join(tmp, name)) for name in ("cold", "warm")}
  common.emit({"bench": "startup", "config": _CONFIG.value, "tiny": _TINY.value, "devices": _DEVICES.value,
               "processes": _PROCESSES.value, "flags": rest, **runs, "load_avg": common.load_avg()})


if __name__ == "__main__":
  if "--child" in sys.argv:
    child(sys.argv[sys.argv.index("--") + 1:])
  else:
    app.run(main)
