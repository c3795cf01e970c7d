"""Fault drills: `config.faults.plan` schedules real faults into a run, as "kind@update" items, e.g.
"env_kill@1,nan_grad@2,ckpt_write@3,sigterm@4,kill9@5". Each fires once per workdir (<workdir>/faults_fired.jsonl
records it before it acts), so the resumed run goes on past it, and two runs of one plan meet the same faults at
the same points: the plan is part of the seed. The storm test (tests/test_storm.py) runs them all in one run.

Kinds and where they strike in update u (docs/faults.md says what the run does about each):
- env_kill: one env's simulator (a JVM: every process of the worker's group but the worker) is SIGKILLed before
  that env's second step of the rollout; the env is chosen from config.seed and u.
- nan_grad: the update's advantages are NaN, so its loss and gradient are; the optimizer step is skipped.
- sigterm: SIGTERM to this process after the rollout.
- ckpt_write: writing checkpoint u + 1 fails (as a full disk does, CheckpointWriteError).
- kill9: the process dies (os._exit(137)) while checkpoint u + 1 is being written.

An item may name one process of a multi-process run, "kind@update:pN" (only process N meets it); on several
processes only ckpt_write runs (the drill of one host failing while the others go on, docs/faults.md).
"""
from __future__ import annotations

import json
import logging
import os
import random
import signal
import time

log = logging.getLogger(__name__)

KINDS = ("env_kill", "nan_grad", "sigterm", "ckpt_write", "kill9")
FIRED_FILE = "faults_fired.jsonl"


def parse_plan(plan: str) -> frozenset[tuple[str, int, int | None]]:
  """{(kind, update, process or None)} of a plan string; ValueError naming the bad item."""
  out = set()
  for item in (x.strip() for x in plan.split(",") if x.strip()):
    kind, _, rest = item.partition("@")
    update, _, proc = rest.partition(":p")
    if kind not in KINDS or not update.isdigit() or (":" in rest and not proc.isdigit()):
      raise ValueError(f"config.faults.plan item {item!r}: want kind@update[:pN] with kind in {', '.join(KINDS)}, "
                       "update an integer >= 0 and N a process index")
    out.add((kind, int(update), int(proc) if proc else None))
  return frozenset(out)


def multi_process_problem(plan: str) -> str | None:
  """Why `plan` cannot run on several processes (only ckpt_write drills do), or None."""
  other = sorted({kind for kind, _, _ in parse_plan(plan)} - {"ckpt_write"})
  return (f"config.faults.plan: only ckpt_write drills run on several processes, not {', '.join(other)}"
          if other else None)


class Faults:
  """The plan of one run and what of it has fired in this workdir."""

  def __init__(self, plan: str, workdir: str, seed: int = 0, process: int = 0):
    """`process`: this process's index; it meets the items of no process and those naming it."""
    self.seed, self.process = seed, process
    self.plan = {(k, u) for k, u, p in parse_plan(plan) if p in (None, process)}
    self.path = os.path.join(workdir, FIRED_FILE)
    self.fired: set[tuple[str, int]] = set()
    if self.plan and os.path.exists(self.path):
      with open(self.path) as f:
        self.fired = {(r["kind"], r["update"]) for r in map(json.loads, f) if r.get("process", 0) == process}

  def take(self, kind: str, update: int) -> bool:
    """True once per workdir when `kind` is planned at `update` (recorded on disk first: a fault that ends the
    process is not repeated by the resumed run)."""
    if (kind, update) not in self.plan or (kind, update) in self.fired:
      return False
    self.fired.add((kind, update))
    with open(self.path, "a") as f:
      f.write(json.dumps({"kind": kind, "update": update, "process": self.process}) + "\n")
      f.flush()
      os.fsync(f.fileno())
    log.warning("fault drill: %s in update %d (config.faults.plan)", kind, update)
    return True

  def env_index(self, update: int, num_envs: int) -> int:
    """The env an env_kill of `update` strikes (seeded by config.seed and the update)."""
    return random.Random(f"faults:{self.seed}:{update}").randrange(num_envs)


def kill_simulator(worker_pid: int, timeout_s: float = 10.0) -> list[int]:
  """SIGKILLs every process of the worker's process group except the worker (its simulator), and waits until
  they are gone; returns their pids."""
  victims = []
  for name in os.listdir("/proc"):
    if name.isdigit() and int(name) != worker_pid:
      try:
        if os.getpgid(int(name)) == worker_pid:
          victims.append(int(name))
      except (ProcessLookupError, PermissionError):
        pass
  for pid in victims:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline and any(_alive(pid) for pid in victims):
    time.sleep(0.02)
  return victims


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has died
  except OSError:
    return False
