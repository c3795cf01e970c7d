"""A storm: one 6-update TextWorldExpress run (tiny model) through five planned faults (config.faults.plan) — an
env JVM killed mid-rollout, NaN advantages, a failed checkpoint write, SIGTERM mid-update, kill -9 while a
checkpoint is written — driven as a user would: the same `seed_jax.main` command again after each exit. It ends
with one metrics record per update, each fault in its metric, no process left behind, and the final state of one
uninterrupted run meeting the same faults inside its updates (env_kill, nan_grad: the plan is part of the seed),
bit for bit: every exit and resume on the way changed nothing."""
import json
import os
import subprocess
import sys
import uuid

import pytest

from configs import textworld_express as twx_config
from helpers import REPO
from seed_jax.infra import checkpoint

PLAN = "env_kill@1,nan_grad@2,ckpt_write@3,sigterm@4,kill9@5"
IN_UPDATE = "env_kill@1,nan_grad@2"  # the faults a run lives through without exiting


def storm_config(model_dir: str, plan: str = PLAN):
  c = twx_config.get_config("")
  c.model.path, c.model.max_prompt_tokens = model_dir, 512
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 2, 2, 8
  c.env.max_steps = 3  # a random tiny model never finishes: every episode steps past the env_kill
  c.analyzer.max_new_tokens = 16
  c.learner.minibatch_size, c.learner.micro_batch_size, c.learner.lr = 8, 4, 1e-3
  c.train.num_updates = 6
  c.train.checkpoint.save_interval_steps = 1
  c.eval.at_end, c.eval.every = False, 0
  c.log.tensorboard = False
  c.faults.plan = plan
  return c


def _storm(cfg_file, workdir, mark):
  """Runs the command until it exits 0 (at most 6 times); returns [(exit status, stderr)]."""
  env = dict(os.environ, PYTHONPATH=str(REPO), SEED_STORM_MARK=mark)
  out = []
  for _ in range(6):
    p = subprocess.run([sys.executable, "-m", "seed_jax.main", f"--config={cfg_file}", f"--workdir={workdir}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out.append((p.returncode, p.stderr))
    if p.returncode == 0:
      break
  return out


def _marked(mark):
  """Live processes whose environment carries `mark` (the runs' children inherit it)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if f"SEED_STORM_MARK={mark}".encode() in f.read():
          found.append(int(pid))
    except OSError:
      pass
  return found


@pytest.mark.slow  # a storm of four seed_jax.main processes and one uninterrupted run
def test_a_run_through_a_storm_of_faults_ends_whole_and_equals_the_uninterrupted_run(tiny_model_dir, tmp_path):
  sums = []
  for name, plan, exits in (("storm", PLAN, [1, 143, 137, 0]), ("uninterrupted", IN_UPDATE, [0])):
    cfg_file = tmp_path / f"{name}.py"
    cfg_file.write_text(f"import sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                        f"from test_storm import storm_config\n\n\ndef get_config():\n"
                        f"  return storm_config({tiny_model_dir!r}, {plan!r})\n")
    workdir, mark = str(tmp_path / name), uuid.uuid4().hex
    runs = _storm(cfg_file, workdir, mark)
    assert [rc for rc, _ in runs] == exits, [(rc, err[-1500:]) for rc, err in runs]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == list(range(6))  # one record per update, the redone ones replaced
    assert [r["env/restarts"] for r in rows] == [0, 1, 0, 0, 0, 0]
    assert [r["update/update_skipped"] for r in rows] == [0, 0, 1, 0, 0, 0]
    ck = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), storm_config(tiny_model_dir).train.checkpoint,
                                 read_only=True)
    assert ck.latest_step() == 6
    sums.append(ck.restore_metadata(6)["checksums"])
    ck.close()
    assert not _marked(mark)  # no worker or JVM outlived its run
    assert rows[-1]["faults/fired_total"] == len(plan.split(",")) and rows[1]["rollout/env_errors"] >= 1
    with open(os.path.join(workdir, "faults_fired.jsonl")) as f:
      assert sorted((r["kind"], r["update"]) for r in map(json.loads, f)) == sorted(
          (k, int(u)) for k, u in (x.split("@") for x in plan.split(",")))
    if plan == PLAN:
      lines = [l for l in runs[0][1].splitlines() if l.strip()]
      assert lines[-1].startswith("checkpoint error: checkpoint 4 could not be written") and "Traceback" not in runs[0][1]
  assert sums[0] == sums[1]  # every array of the final state, bit for bit (checksum.py)
