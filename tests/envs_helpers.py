"""Helpers shared by the environment tests: process-group inspection through /proc and panel dumps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def live_processes_in_groups(pgids: set[int]) -> list[tuple[int, str]]:
  """(pid, command line) of every live (non-zombie) process whose process group is in `pgids`."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        stat = f.read()
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
      continue
    state, _, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
    if int(pgrp) in pgids and state != "Z":
      found.append((int(entry), cmdline))
  return found


def wait_until_gone(pgids: set[int], timeout_s: float = 10.0) -> list[tuple[int, str]]:
  """Polls until no live process is left in `pgids` (SIGKILL is delivered asynchronously); returns leftovers."""
  deadline = time.monotonic() + timeout_s
  while True:
    left = live_processes_in_groups(pgids)
    if not left or time.monotonic() > deadline:
      return left
    time.sleep(0.1)


def panel_in_subprocess(module: str, split: str, hash_seed: str) -> list[dict]:
  """The task panel as built by a fresh interpreter with a different hash seed."""
  code = (f"import json; from seed_jax.envs import {module} as m; from configs import {module} as c; "
          f"print(json.dumps([t.to_json() for t in m.task_panel(c.env_config(), {split!r})]))")
  env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=120, check=True)
  return json.loads(out.stdout)
