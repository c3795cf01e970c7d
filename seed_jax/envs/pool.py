"""Runs N environments in parallel, one worker process (and its simulator, e.g. a JVM) per env.

Each worker makes itself the leader of a new process group before it builds its env, so the simulator
child processes it launches share that group: killing the group leaves nothing behind, and a Ctrl-C in the
terminal reaches only the driver, which then closes the pool. Every call has a deadline; a worker that
misses it, dies or raises is killed with its group and restarted, and that env's call returns an
`EnvError` while the other envs' calls complete normally.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Mapping, Sequence

from seed_jax.envs.base import EnvError, EnvFamily, Observation, StepResult, Task

_CTX = mp.get_context("spawn")  # no fork: the driver may hold JAX threads and device state
_TRACEBACK_CHARS = 4000

log = logging.getLogger(__name__)


def _worker_main(family: EnvFamily, cfg: Any, conn: Connection) -> None:
  """Worker loop: build one env, then answer ("reset", (task,)), ("step", (action,)), ("gold_actions", ())
  with ("ok", result) or ("error", traceback) until ("close", ()) or the driver goes away."""
  os.setpgrp()
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  # A dead JVM is reported once, by the driver; py4j logs it on its own logger and, via logging.exception, the
  # root logger.
  logging.getLogger("py4j").setLevel(logging.CRITICAL)
  logging.getLogger().addFilter(lambda record: f"{os.sep}py4j{os.sep}" not in record.pathname)
  env, init_error = None, None
  try:
    env = family.make_env(cfg)
    conn.send(("ready", os.getpid()))
  except Exception:  # reported on every call, so the driver sees why the env is unusable
    init_error = "make_env failed:\n" + traceback.format_exc()[-_TRACEBACK_CHARS:]
    conn.send(("error", init_error))
  try:
    while True:
      try:
        cmd, args = conn.recv()
      except (EOFError, OSError):
        break
      if cmd == "close":
        break
      if init_error is not None:
        conn.send(("error", init_error))
        continue
      try:
        conn.send(("ok", getattr(env, cmd)(*args)))
      except Exception:
        conn.send(("error", traceback.format_exc()[-_TRACEBACK_CHARS:]))
  finally:
    if env is not None:
      try:
        env.close()
      except Exception:
        pass


class EnvStartError(RuntimeError):
  """An env worker that could not build its env; `line` is the one-line form (the traceback's last line)."""

  def __init__(self, message: str, index: int, payload: str):
    super().__init__(message)
    lines = [l.strip() for l in payload.strip().splitlines() if l.strip()]
    self.line = f"env worker {index} failed to start: {lines[-1] if lines else 'no reason given'}"


class _Worker:
  def __init__(self, family: EnvFamily, cfg: Any):
    self.conn, child_conn = _CTX.Pipe()
    self.proc = _CTX.Process(target=_worker_main, args=(family, cfg, child_conn), daemon=True)
    self.proc.start()
    child_conn.close()
    self.awaiting_ready = True  # the first message is "ready" (or an init error) once the env is built
    self.needs_reset = True

  @property
  def pid(self) -> int:
    return self.proc.pid

  def kill(self) -> None:
    """SIGKILL the worker's process group (the worker and its simulator), then the worker itself in case it
    had not yet made its own group."""
    for kill in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
      try:
        kill()
      except (ProcessLookupError, PermissionError):
        pass
    self.proc.join(timeout=5)
    self.conn.close()


class EnvPool:
  """`num_envs` envs of one family, stepped in parallel.

  timeout_s: deadline of one step / gold_actions call (default cfg.step_timeout_s).
  reset_timeout_s: deadline of one reset (default cfg.reset_timeout_s); loading a task can take seconds.
  start_timeout_s: extra time a freshly started worker gets to build its env (default cfg.start_timeout_s).
  """

  def __init__(self, family: EnvFamily, cfg: Any, num_envs: int, timeout_s: float | None = None,
               reset_timeout_s: float | None = None, start_timeout_s: float | None = None):
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    self.family, self.cfg = family, cfg
    self.timeout_s = float(cfg.step_timeout_s if timeout_s is None else timeout_s)
    self.reset_timeout_s = float(cfg.reset_timeout_s if reset_timeout_s is None else reset_timeout_s)
    self.start_timeout_s = float(cfg.start_timeout_s if start_timeout_s is None else start_timeout_s)
    self.restarts = 0  # workers restarted after a timeout or crash (a metric for the run log)
    self._kill_plan: list[int] | None = None  # [env, steps to go]: a fault drill (kill_simulator_before_step)
    self._closed = False
    self._workers = [_Worker(family, cfg) for _ in range(num_envs)]
    atexit.register(self.close)
    try:
      self._await_ready()
    except BaseException:
      self.close()
      raise

  @property
  def num_envs(self) -> int:
    return len(self._workers)

  def worker_pids(self) -> list[int]:
    """Worker process ids; each is also the process group id of that worker and its simulator."""
    return [w.pid for w in self._workers]

  def reset(self, tasks: Sequence[Task], indices: Sequence[int] | None = None) -> list[Observation | EnvError]:
    """Resets env indices[k] (default k) to tasks[k], all in parallel. A group of G envs given the same Task
    starts from identical observations (env resets are deterministic)."""
    indices = list(range(len(tasks))) if indices is None else list(indices)
    if len(indices) != len(tasks) or len(set(indices)) != len(indices):
      raise ValueError(f"reset got {len(tasks)} tasks for indices {indices} (one task per distinct index)")
    self._check_indices(indices)
    out = self._call({i: ("reset", (t,)) for i, t in zip(indices, tasks)}, self.reset_timeout_s)
    for i in indices:
      self._workers[i].needs_reset = isinstance(out[i], EnvError)
    return [out[i] for i in indices]

  def kill_simulator_before_step(self, i: int, n: int) -> None:
    """Fault drill (seed_jax.infra.faults): env i's simulator is SIGKILLed just before its n-th step call from
    now, as if its JVM had died under it."""
    self._kill_plan = [i, n]

  def disarm(self) -> None:
    """Cancels a drill that has not struck (its env's episode ended first)."""
    self._kill_plan = None

  def step(self, actions: Mapping[int, str]) -> dict[int, StepResult | EnvError]:
    """Steps only the given env indices (the active ones), in parallel."""
    self._check_indices(actions)
    if self._kill_plan is not None and self._kill_plan[0] in actions:
      self._kill_plan[1] -= 1
      if self._kill_plan[1] == 0:
        from seed_jax.infra.faults import kill_simulator
        kill_simulator(self._workers[self._kill_plan[0]].pid)
        self._kill_plan = None
    out: dict[int, Any] = {i: EnvError("not_reset", f"env {i} must be reset first")
                           for i in actions if self._workers[i].needs_reset}
    out.update(self._call({i: ("step", (a,)) for i, a in actions.items() if i not in out}, self.timeout_s))
    return out

  def gold_actions(self, i: int) -> list[str] | None | EnvError:
    """The gold action sequence of env i's current episode (from its reset state)."""
    self._check_indices([i])
    if self._workers[i].needs_reset:
      return EnvError("not_reset", f"env {i} must be reset first")
    return self._call({i: ("gold_actions", ())}, self.reset_timeout_s)[i]

  def close(self) -> None:
    """Asks every worker to close its env, then kills each process group (no simulator survives)."""
    if self._closed:
      return
    self._closed = True
    atexit.unregister(self.close)
    for w in self._workers:
      try:
        w.conn.send(("close", ()))
      except (OSError, ValueError):
        pass
    # Wait on the sentinels, which does not reap: an unreaped worker keeps its group id from being reused
    # before killpg runs.
    running, deadline = [w.proc.sentinel for w in self._workers], time.monotonic() + 10.0
    while running and time.monotonic() < deadline:
      done = wait(running, timeout=max(0.0, deadline - time.monotonic()))
      running = [s for s in running if s not in done]
    for w in self._workers:
      w.kill()

  def __enter__(self) -> "EnvPool":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  # -- internals -------------------------------------------------------------------------------------------

  def _check_indices(self, indices: Any) -> None:
    if self._closed:
      raise RuntimeError("EnvPool is closed")
    bad = [i for i in indices if not 0 <= i < self.num_envs]
    if bad:
      raise ValueError(f"env indices {bad} out of range [0, {self.num_envs})")

  def _await_ready(self) -> None:
    """Waits for every worker's first message at start-up, so a broken env fails the pool loudly."""
    deadline = time.monotonic() + self.start_timeout_s
    for i, w in enumerate(self._workers):
      if not w.conn.poll(max(0.0, deadline - time.monotonic())):
        why = f"no answer within {self.start_timeout_s:.0f} s"
        raise EnvStartError(f"env worker {i} did not start: {why}", i, why)
      try:
        status, payload = w.conn.recv()
      except (EOFError, OSError):
        status, payload = "died", f"exit code {w.proc.exitcode} (a driver script needs `if __name__ == '__main__':`)"
      if status != "ready":
        raise EnvStartError(f"env worker {i} failed to start: {payload}", i, payload)
      w.awaiting_ready = False

  def _restart(self, i: int, why: EnvError) -> None:
    lines = why.message.strip().splitlines()
    cause = (lines[-1] if "Traceback (most recent call last)" in why.message else lines[0]) if lines else ""
    log.warning("env %d %s, restarting its worker: %s", i, why.kind, cause.strip()[:200])  # a traceback's last line
    self._workers[i].kill()
    self._workers[i] = _Worker(self.family, self.cfg)
    self.restarts += 1

  def _call(self, requests: Mapping[int, tuple[str, tuple]], timeout_s: float) -> dict[int, Any]:
    """Sends each request to its worker, then collects the replies until each worker's deadline."""
    out: dict[int, Any] = {}
    pending: dict[Connection, int] = {}
    deadlines: dict[int, float] = {}
    now = time.monotonic()
    for i, msg in requests.items():
      w = self._workers[i]
      try:
        w.conn.send(msg)
      except (OSError, ValueError) as e:
        out[i] = EnvError("crashed", f"env {i}: worker unreachable ({e!r})")
        self._restart(i, out[i])
        continue
      pending[w.conn] = i
      deadlines[i] = now + timeout_s + (self.start_timeout_s if w.awaiting_ready else 0.0)
    while pending:
      remaining = min(deadlines[i] for i in pending.values()) - time.monotonic()
      for conn in wait(list(pending), timeout=max(0.0, remaining)):
        i = pending[conn]
        w = self._workers[i]
        try:
          status, payload = conn.recv()
        except (EOFError, OSError):
          del pending[conn]
          out[i] = EnvError("crashed", f"env {i}: worker died (exit code {w.proc.exitcode})")
          self._restart(i, out[i])
          continue
        if w.awaiting_ready and status == "ready":
          w.awaiting_ready = False
          continue  # the reply to the request is still to come
        w.awaiting_ready = False
        del pending[conn]
        if status == "ok":
          out[i] = payload
        else:  # the simulator may be left half-broken (e.g. its JVM died under it): start afresh
          out[i] = EnvError("exception", f"env {i}: {payload}")
          self._restart(i, out[i])
      now = time.monotonic()
      for conn, i in list(pending.items()):
        if now >= deadlines[i]:
          del pending[conn]
          out[i] = EnvError("timeout", f"env {i}: no reply to {requests[i][0]!r} in time ({timeout_s:.0f} s)")
          self._restart(i, out[i])
    return out


@dataclasses.dataclass
class GoldEpisode:
  """One episode of the oracle agent: the reset observation, then one (action, result) per step."""
  task: Task
  first_observation: Observation | None
  actions: list[str]
  results: list[StepResult]
  error: EnvError | None = None

  @property
  def episode_return(self) -> float:
    return sum(r.reward for r in self.results)

  @property
  def success(self) -> bool:
    return bool(self.results) and bool(self.results[-1].info.get("success"))


def play_gold(pool: EnvPool, tasks: Sequence[Task], max_steps: int | None = None) -> list[GoldEpisode]:
  """The oracle agent: plays each task's gold path, `pool.num_envs` tasks at a time in lockstep, until the
  env says done, the path ends or `max_steps`. A task whose env fails gets its EnvError and no more steps."""
  episodes: list[GoldEpisode] = []
  for start in range(0, len(tasks), pool.num_envs):
    chunk = list(tasks[start:start + pool.num_envs])
    firsts = pool.reset(chunk)
    eps = [GoldEpisode(t, None if isinstance(o, EnvError) else o, [], [], o if isinstance(o, EnvError) else None)
           for t, o in zip(chunk, firsts)]
    paths: dict[int, list[str]] = {}
    for i, ep in enumerate(eps):
      gold = pool.gold_actions(i) if ep.error is None else None
      if isinstance(gold, EnvError):
        ep.error = gold
      elif gold:
        paths[i] = gold[:max_steps] if max_steps is not None else gold
    for k in range(max((len(p) for p in paths.values()), default=0)):
      active = {i: p[k] for i, p in paths.items() if k < len(p)}
      for i, res in pool.step(active).items():
        if isinstance(res, EnvError):
          eps[i].error = res
          del paths[i]
          continue
        eps[i].actions.append(active[i])
        eps[i].results.append(res)
        if res.done:
          del paths[i]
    episodes.extend(eps)
  return episodes
