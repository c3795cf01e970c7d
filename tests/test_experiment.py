"""The experiment runner: 2 arms x 2 seeds x 2 updates on a tiny model write the JSONL, a real PNG and the
summary; a killed experiment continues without repeating a finished run; bad arms are one clear error."""
import json
import os
import subprocess
import sys
import time

import pytest

from seed_jax import experiment

from helpers import REPO as ROOT
pytestmark = pytest.mark.slow


def _command(model_dir, workdir, cache):
  return [sys.executable, "-m", "seed_jax.experiment", f"--config={ROOT}/configs/textworld_express.py",
          "--arms=seed,grpo", "--seeds=0,1", f"--workdir={workdir}", f"--config.model.path={model_dir}",
          "--config.warmstart.before_rl=False", "--config.train.num_updates=2", "--config.eval.every=1",
          "--config.eval.max_tasks=2", "--config.rollout.tasks_per_update=1", "--config.rollout.group_size=2",
          "--config.rollout.max_new_tokens=8", "--config.env.max_steps=2", "--config.model.max_prompt_tokens=512",
          "--config.analyzer.max_new_tokens=16", "--config.analyzer.max_prompt_tokens=1024",
          "--config.learner.minibatch_size=4", "--config.learner.micro_batch_size=4",
          f"--config.warmstart.cache_dir={cache}"]


def test_arms_and_seeds_resume_and_outputs(tiny_model_dir, tmp_path):
  workdir = tmp_path / "exp"
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  cmd = _command(tiny_model_dir, workdir, tmp_path / "cache")
  # Kill the experiment once its first run has finished; the rerun must not repeat that run.
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  first = workdir / "seed-s0" / experiment.DONE_FILE
  deadline = time.time() + 900
  while not first.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.5)
  proc.kill()
  proc.wait()
  assert first.exists(), "the first run did not finish"
  stamp = os.path.getmtime(workdir / "seed-s0" / "metrics.jsonl")
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "seed seed 0 already finished" in out.stdout
  assert os.path.getmtime(workdir / "seed-s0" / "metrics.jsonl") == stamp
  rows = [json.loads(line) for line in open(workdir / "experiment.jsonl")]
  evals = [r for r in rows if r["kind"] == "eval"]
  assert {(r["arm"], r["seed"]) for r in evals} == {("seed", 0), ("seed", 1), ("grpo", 0), ("grpo", 1)}
  for arm in ("seed", "grpo"):
    for seed in (0, 1):
      assert [r["updates"] for r in evals if (r["arm"], r["seed"]) == (arm, seed)] == [0, 1, 2]
  png = (workdir / "curves.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
  summary = (workdir / "summary.md").read_text()
  assert "| seed | 2 |" in summary and "| grpo | 2 |" in summary


def test_unknown_arm_is_one_clear_error(tmp_path):
  with pytest.raises(ValueError, match="unknown experiment arm.*known: grpo, seed"):
    experiment.parse_arms("seed,ppo")
  out = subprocess.run([sys.executable, "-m", "seed_jax.experiment", f"--config={ROOT}/configs/textworld_express.py",
                        "--arms=nope", f"--workdir={tmp_path}"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1].startswith("experiment error: unknown experiment arm")


def test_summary_numbers():
  """Final success mean ± s.e. over seeds and the first update at which the mean curve reaches GRPO's final."""
  ev = lambda ys: [dict(updates=u, success=y, ret=10 * y) for u, y in enumerate(ys)]
  results = {"seed": {0: dict(eval=ev([0.2, 0.6, 0.8]), train=[]), 1: dict(eval=ev([0.2, 0.4, 0.6]), train=[])},
             "grpo": {0: dict(eval=ev([0.2, 0.3, 0.5]), train=[]), 1: dict(eval=ev([0.2, 0.5, 0.5]), train=[])}}
  text = experiment.summarize(results)
  assert "| seed | 2 | 0.200 | 0.700 ± 0.100 | 1 |" in text  # mean curve 0.2, 0.5, 0.7 reaches 0.5 at update 1
  assert "| grpo | 2 | 0.200 | 0.500 ± 0.000 | 2 |" in text
