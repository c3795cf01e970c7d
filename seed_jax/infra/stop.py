"""SIGTERM / SIGINT as a request to stop at the next safe point.

A preempted spot or queued TPU VM gets SIGTERM and some seconds before it goes; Ctrl-C is SIGINT. The first
signal only sets a flag: the training loop checks it between phases (`check`) and, once it is set, saves the
last completed update's checkpoint, closes the envs and ends with one line. A second signal ends the process
at once, with one line and no traceback.

Multi-process runs leave SIGTERM to JAX's preemption notifier, which tells every process: `at_sync_point(step)`
is then true on all of them at the same step, so every host saves the same update (a preempted TPU pod). A
SIGINT reaches one host: there `check` does not raise mid-update (the others would wait in a collective), and
`at_sync_point` agrees over the processes, so every host stops before the same update.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(Exception):
  """Raised by `StopSignals.check` at a safe point once a stop signal has arrived."""

  def __init__(self, signame: str):
    super().__init__(f"stop requested by {signame}")
    self.signame = signame


class StopSignals:
  """While active (a context manager; main thread only, elsewhere a no-op), the first SIGTERM/SIGINT sets
  `requested` (the signal's name); `check()` raises StopRequested from then on."""

  def __init__(self, multi_process: bool = False):
    self.requested: str | None = None
    self.multi_process = multi_process
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.requested is not None:
      sys.stderr.write(f"seed_jax: second {name}: exiting now, without a checkpoint of the current update\n")
      sys.stderr.flush()
      os._exit(128 + signum)  # no interpreter shutdown: it can hang or crash inside native JAX/JVM threads
    self.requested = name
    sys.stderr.write(f"seed_jax: {name} received: stopping at the next safe point (again to exit now)\n")
    sys.stderr.flush()

  def check(self) -> None:
    if self.requested is not None and not self.multi_process:
      raise StopRequested(self.requested)

  def at_sync_point(self, step: int) -> bool:
    """Multi-process: whether a SIGTERM reached any process, agreed by all at this step (call it at the same
    increasing steps on every process); it then counts as requested here too. Single process: `requested`."""
    if self.multi_process:
      from jax.experimental import multihost_utils
      from seed_jax.infra import distributed
      if multihost_utils.reached_preemption_sync_point(step) and self.requested is None:
        self.requested = "SIGTERM"
      names = [n for n in distributed.allgather_objects(self.requested) if n]  # a signal on any process
      if names and self.requested is None:
        self.requested = names[0]
    return self.requested is not None

  def __enter__(self) -> "StopSignals":
    if threading.current_thread() is threading.main_thread():
      for s in SIGNALS:
        if not (self.multi_process and s == signal.SIGTERM):  # JAX's notifier has it (at_sync_point)
          self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for s, h in self._previous.items():
      signal.signal(s, h)
    self._previous.clear()


def exit_after_stop(out: dict, workdir: str) -> None:
  """One line for a run (loop.train's result) that a signal ended early, then the signal's exit status."""
  saved = (f"checkpoint saved in {os.path.join(workdir, 'checkpoints')}" if out["updates_done"]
           else "no update had finished")
  print(f"seed_jax: stopped by {out['stopped']} after {out['updates_done']} updates, {saved}; the same command "
        f"with --workdir={workdir} resumes", flush=True)
  sys.exit(128 + int(getattr(signal, out["stopped"])))
