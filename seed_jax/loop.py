"""The resumable RL loop: checkpoints, stops on a signal, periodic evaluations, and the end-of-run summary
(a table of the updates and curves.png)."""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from seed_jax import evaluate, pipeline, report
from seed_jax import update as update_lib
from seed_jax.infra import checkpoint as ckpt_lib
from seed_jax.infra import distributed
from seed_jax.infra import faults as faults_lib
from seed_jax.infra import host_memory
from seed_jax.infra import mesh as mesh_lib
from seed_jax.infra import preflight
from seed_jax.infra import stop as stop_lib
from seed_jax.infra.metrics import MetricsWriter
from seed_jax.runtime import build

log = logging.getLogger(__name__)


def fingerprint(cfg) -> dict[str, Any]:
  return ckpt_lib.config_fingerprint(cfg, ["model.path", "env.name", "seed", "rollout.tasks_per_update",
                                           "rollout.group_size", "learner.minibatch_size", "learner.micro_batch_size"])


def train(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """The resumable RL loop; returns the last update's metrics (and the final eval's), the state, and `stopped`
  (the signal's name when SIGTERM/SIGINT ended it early, after saving the last completed update). Evaluations
  are records of their own at step = updates done (0 = the starting weights, with eval.at_start). A finished
  run prints its summary table and writes curves.png into the workdir."""
  preflight.check_workdir(workdir)
  if cfg.warmstart.before_rl:
    from seed_jax import warmstart
    distributed.initialize(cfg.distributed)  # [scale] on a pod every process takes part (its cache: a shared folder)
    cfg = warmstart.with_warm_policy(cfg)
  preflight.check_disk(workdir, cfg)
  rt = build(cfg)
  is_writer = distributed.is_writer()  # [scale]
  writer = MetricsWriter(workdir, is_writer, cfg.log, run_config=cfg.to_dict())
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), cfg.train.checkpoint, fingerprint(cfg))
  faults = faults_lib.Faults(cfg.faults.plan, workdir, cfg.seed, jax.process_index())
  if jax.process_count() > 1 and (problem := faults_lib.multi_process_problem(cfg.faults.plan)):
    raise distributed.SetupError(problem)
  total = cfg.train.num_updates
  try:
    with stop_lib.StopSignals(multi_process=jax.process_count() > 1) as stop:
      state = update_lib.init_state(jax.tree.map(jnp.copy, rt.init_params), rt.optimizer)
      if cfg.mesh.ref_params_memory == "pinned_host":  # [scale] the frozen KL reference waits in host RAM
        rt.init_params = mesh_lib.with_memory_kind(rt.init_params, "pinned_host")
      start, history, restarts_before = 0, [], 0
      if (found := ckpt.restore_latest(ckpt_lib.abstract_state(state))) is not None:
        state, meta = found
        start, history = int(meta["next_update"]), list(meta.get("history", []))
        restarts_before = int(meta.get("env_restarts", 0))
        log.info("resumed from %s after %d updates (next: update %d/%d)", workdir, start, start + 1, total)
      if writer.rewind(start):
        log.info("metrics: dropped the records after the last checkpoint (they are redone)")
      last: dict[str, Any] = {}
      if cfg.eval.at_start and start == 0:
        evaluate.evaluate_record(rt, writer, state.params, 0)
      saved, restarts_seen, restarts = start, 0, 0  # restarts: every process's pool's, this run
      meta = lambda done: dict(next_update=done, task_position=done * cfg.rollout.tasks_per_update, history=history,
                               env_restarts=restarts_before + restarts)
      for u in range(start, total):
        t0 = time.time()
        if stop.at_sync_point(u):  # every process of a preempted pod stops before the same update
          return _stop(ckpt, state, u, saved, meta, stop.requested, last)
        if faults.take("env_kill", u):
          rt.pool.kill_simulator_before_step(faults.env_index(u, rt.pool.num_envs), 2)
        boundaries = [0]

        def check():  # at each phase boundary of the update
          boundaries[0] += 1
          if boundaries[0] == 2 and faults.take("sigterm", u):  # after the rollout
            os.kill(os.getpid(), signal.SIGTERM)
          stop.check()
          ckpt.poll()
        try:
          state, metrics = pipeline.rl_update(rt, state, u, writer, check, nan_advantages=faults.take("nan_grad", u))
        except stop_lib.StopRequested as e:  # state is still that of update u - 1, the last one completed
          return _stop(ckpt, state, u, saved, meta, e.signame, last)
        finally:
          rt.pool.disarm()
        metrics["time/update_total_s"] = time.time() - t0
        restarts = sum(distributed.allgather_objects(rt.pool.restarts))
        metrics["env/restarts"] = restarts - restarts_seen
        metrics["env/restarts_total"] = restarts_before + restarts
        restarts_seen = restarts
        if faults.plan:
          metrics["faults/fired_total"] = len(faults.fired)
        metrics.update(host_memory.release())  # the update's host buffers are garbage now
        last = writer.write(u, metrics)
        log.info("%s", report.summary_line(u, total, last))
        if cfg.eval.every and (u + 1) % cfg.eval.every == 0 and u + 1 < total:
          evaluate.evaluate_record(rt, writer, state.params, u + 1)
        history.append({k: v for k, v in last.items() if isinstance(v, (int, float)) and "/" in k and "time" not in k})
        if faults.take("ckpt_write", u):
          raise ckpt_lib.CheckpointWriteError(f"checkpoint {u + 1} could not be written in {ckpt.directory}: a fault "
                                              f"drill (config.faults.plan); the latest saved checkpoint is {saved}")
        if ckpt.save(u + 1, state, metadata=meta(u + 1), force=u + 1 == total):
          saved = u + 1
        if faults.take("kill9", u):  # the process dies while the checkpoint is being written
          os._exit(137)
        # The final evaluation too is left for the resumed run. Several processes agree at the next sync point.
        if stop.requested and not stop.multi_process:
          return _stop(ckpt, state, u + 1, saved, meta, stop.requested, last)
      if cfg.eval.at_end and (total > start or not writer.has_record(total, "eval/updates_done")):
        last.update(evaluate.evaluate_record(rt, writer, state.params, total))
      ckpt.wait()
      if is_writer:  # every record is flushed: the summary reads the whole run's metrics file
        print(report.run_summary(os.path.join(workdir, cfg.log.jsonl_name), workdir))
      return {"metrics": last, "state": state, "stopped": None}
  finally:
    ckpt.close()
    writer.close()
    rt.close()


def _stop(ckpt, state, done: int, saved: int, meta, signame: str, last) -> dict[str, Any]:
  """Ends the loop after `done` completed updates: their checkpoint is written (if the save interval skipped
  it) and committed before returning."""
  if done > saved:
    ckpt.save(done, state, metadata=meta(done), force=True)
  ckpt.wait()
  log.info("stopped by %s after %d updates; %s", signame, done,
           f"checkpoint {done} saved" if done else "no update finished, nothing saved")
  return {"metrics": last, "state": state, "stopped": signame, "updates_done": done}
