"""Soak: `seed_jax.main` for many updates (default: 30 of the embedded ScienceWorld default) while a sampler reads,
every few seconds, the run's resident memory (its whole process tree: the driver, env workers, JVMs), its open
file handles, its child processes and the workdir's size; prints one JSON line with the curves and the checks:

- resident memory after update 3 grows by at most 5 % to the end (the tree's, at update ends: the median of the
  last few against that of the first few from update 3, since single update ends swing with every GC; the
  driver's, the JVMs' and the env workers' shares are reported apart);
- open file handles and child processes stay flat (their maximum over updates 3.. equals their value at 3);
- the workdir's checkpoints stay within train.checkpoint.max_to_keep steps (plus the one being written).

Beside each update end: the programs compiled so far and the live device arrays, from the run's own metrics
(a new compiled program holds host memory for good; the driver grows with them until every shape was met).

  python -m benchmarks.soak [--updates 30] [--config configs/sciworld.py] [--set train.checkpoint.max_to_keep=2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks import common


def _tree(root: int) -> list[int]:
  """`root` and every live descendant."""
  parents: dict[int, list[int]] = {}
  for name in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{name}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      parents.setdefault(ppid, []).append(int(name))
    except (OSError, ValueError, IndexError):
      pass
  out, todo = [], [root]
  while todo:
    pid = todo.pop()
    out.append(pid)
    todo += parents.get(pid, [])
  return out


def _rss_mb(pid: int) -> float:
  try:
    with open(f"/proc/{pid}/status") as f:
      return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024
  except (OSError, StopIteration):
    return 0.0


def _comm(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/comm") as f:
      return f.read().strip()
  except OSError:
    return ""


def _fds(pid: int) -> int:
  try:
    return len(os.listdir(f"/proc/{pid}/fd"))
  except OSError:
    return 0


def _du_mb(path: str) -> float:
  total = 0
  for d, _, fs in os.walk(path):
    for f in fs:
      try:
        total += os.path.getsize(os.path.join(d, f))
      except OSError:
        pass
  return total / 2 ** 20


def sample(pid: int, workdir: str) -> dict[str, Any]:
  tree = _tree(pid)
  steps = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()] \
      if os.path.isdir(os.path.join(workdir, "checkpoints")) else []
  rss = {pid: _rss_mb(pid) for pid in tree}
  java = sum(v for pid, v in rss.items() if _comm(pid) == "java")
  return dict(t=time.time(), rss_mb=round(sum(rss.values()), 1), driver_mb=round(rss[pid], 1),
              java_mb=round(java, 1), workers_mb=round(sum(rss.values()) - rss[pid] - java, 1),
              fds=sum(map(_fds, tree)),
              children=len(tree) - 1, workdir_mb=round(_du_mb(workdir), 1), checkpoints=len(steps))


def _records(workdir: str) -> dict[int, dict[str, Any]]:
  """The update records of the run's metrics.jsonl by update index (its `step` is updates done)."""
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
  except OSError:
    return {}
  return {r["step"] + 1: r for r in rows if "eval/updates_done" not in r and "step" in r}


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--updates", type=int, default=30)
  p.add_argument("--config", default=os.path.join(common.ROOT, "configs", "sciworld.py"))
  p.add_argument("--set", action="append", default=[], help="a --config.KEY=VALUE override, as KEY=VALUE")
  p.add_argument("--every_s", type=float, default=2.0)
  p.add_argument("--workdir", default="")
  a = p.parse_args()
  workdir = a.workdir or tempfile.mkdtemp(prefix="soak-")
  args = [sys.executable, "-m", "seed_jax.main", f"--config={a.config}", f"--workdir={workdir}",
          f"--config.train.num_updates={a.updates}"] + [f"--config.{s}" for s in a.set]
  proc = subprocess.Popen(args, cwd=common.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  samples, ends, lock = [], {}, threading.Lock()

  def read_log():  # "update N/M:" lines mark the end of update N
    for line in proc.stderr:
      m = re.search(r"update (\d+)/\d+:", line)
      if m:
        with lock:
          ends[int(m.group(1))] = sample(proc.pid, workdir)
  reader = threading.Thread(target=read_log, daemon=True)
  reader.start()
  t0 = time.time()
  while proc.poll() is None:
    samples.append(sample(proc.pid, workdir))
    time.sleep(a.every_s)
  reader.join(timeout=10)
  for u, rec in _records(workdir).items():  # what the run logged of itself at each update end
    if u in ends:
      ends[u]["compiles"] = sum(v for k, v in rec.items() if k.startswith("compiles/"))
      ends[u]["live_arrays_mb"] = round(rec.get("mem/live_arrays_mb", 0.0), 1)
  keep = next((int(s.split("=", 1)[1]) for s in a.set if s.startswith("train.checkpoint.max_to_keep=")), 3)
  at = {u: ends[u] for u in sorted(ends)}
  base = at.get(3)
  checks = {}
  if base:
    late = [v for u, v in at.items() if u >= 3]
    k = max(1, min(5, len(late) // 4))  # update ends swing with each GC and buffer: medians of k, first vs last
    growth = {part: round(statistics.median(v[part] for v in late[-k:]) /
                          max(statistics.median(v[part] for v in late[:k]), 1e-9) - 1, 4)
              for part in ("rss_mb", "driver_mb", "java_mb", "workers_mb")}
    checks = dict(rss_growth_after_3=round(late[-1]["rss_mb"] / base["rss_mb"] - 1, 4),
                  median_growth_after_3=growth, medians_of=k, rss_ok=growth["rss_mb"] <= 0.05,
                  fds_flat=max(v["fds"] for v in late) == base["fds"],
                  children_flat=max(v["children"] for v in late) == base["children"],
                  # at update ends the kept steps; between, also the one being written before the oldest goes
                  checkpoints_within_keep=max(v["checkpoints"] for v in late) <= keep
                  and max(s["checkpoints"] for s in samples) <= keep + 1)
  common.emit(dict(bench="soak", config=a.config, set=a.set, updates=a.updates, exit_code=proc.returncode,
                   wall_s=round(time.time() - t0, 1), at_update_end={u: {k: v for k, v in s.items() if k != "t"}
                                                                     for u, s in at.items()},
                   samples=len(samples), peak_rss_mb=max((s["rss_mb"] for s in samples), default=0.0), **checks))


if __name__ == "__main__":
  main()
