"""The eval stage on TextWorldExpress with the tiny model: a run's checkpoint scores exactly what the run's own
final evaluation measured, a killed evaluation resumes without replaying finished chunks, and bad sources are
one line."""
import json
import logging
import os
import subprocess
import sys

import pytest

from configs import textworld_express as twx_config
from seed_jax import evaluate, loop
from seed_jax.config import validate

pytestmark = pytest.mark.slow  # real simulators and the pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(model_dir, eval_stage=False, **kw):
  c = twx_config.get_config("")
  c.model.path = model_dir
  c.model.max_prompt_tokens = 512
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 2, 2, 12
  c.env.max_steps = 2
  c.analyzer.enabled = False
  c.learner.minibatch_size, c.learner.micro_batch_size, c.learner.lr = 8, 4, 1e-3
  c.train.num_updates = 1
  c.eval.at_start, c.eval.at_end, c.eval.every, c.eval.max_tasks = False, True, 0, 10  # 3 chunks of 4 envs
  c.eval.temperature = 1.0  # varied episodes, so a replayed chunk with other draws would show
  c.stage = "eval" if eval_stage else "rl"
  for k, v in kw.items():
    section, field = k.split("__")
    c[section][field] = v
  validate(c)
  return c


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("run"))
  out = loop.train(_config(tiny_model_dir), workdir)
  return workdir, out["metrics"]


def test_checkpoint_scores_what_the_run_measured(run, tiny_model_dir, tmp_path):
  workdir, metrics = run
  results = evaluate.run(_config(tiny_model_dir, eval_stage=True, eval__checkpoint=workdir), str(tmp_path))
  overall = results["table"]["eval"]["overall"]
  assert overall["episodes"] == metrics["eval/eval/episodes"] == 10
  assert overall["success"] == metrics["eval/eval/success"]
  assert overall["ret"] == pytest.approx(metrics["eval/eval/return"], abs=1e-12)
  assert overall["invalid_action_rate"] == pytest.approx(metrics["eval/eval/invalid_action_rate"], abs=1e-12)
  assert results["table"]["eval"]["coin"]["success"] == metrics["eval/eval/success/coin"]
  assert results["evaluated"] == f"checkpoint {workdir}/checkpoints step 1"
  md = (tmp_path / "eval_results.md").read_text()
  assert "| eval | **overall** | 10 |" in md and "| eval | coin | 10 |" in md
  assert json.loads((tmp_path / "eval_results.json").read_text()) == results


def test_killed_evaluation_resumes_without_replaying(run, tiny_model_dir, tmp_path, caplog):
  cfg = _config(tiny_model_dir, eval_stage=True, eval__checkpoint=run[0])
  full = evaluate.run(cfg, str(tmp_path / "full"))
  part = tmp_path / "part"
  evaluate.run(cfg, str(part))
  lines = (part / evaluate.EPISODES).read_text().splitlines()
  assert len(lines) == 3
  (part / evaluate.EPISODES).write_text(lines[0] + "\n" + lines[1][:40])  # killed while writing chunk 1
  with caplog.at_level(logging.INFO, logger="seed_jax.evaluate"):
    resumed = evaluate.run(cfg, str(part))
  played = [r.getMessage() for r in caplog.records if " chunk " in r.getMessage()]
  assert [m.split(":")[1].strip() for m in played] == ["eval chunk 1", "eval chunk 2"]
  assert resumed == full
  assert (part / evaluate.EPISODES).read_text() == (tmp_path / "full" / evaluate.EPISODES).read_text()


def test_bad_sources_are_one_line(run, tiny_model_dir, tmp_path):
  workdir = str(tmp_path / "ev")
  evaluate.run(_config(tiny_model_dir, eval_stage=True, eval__max_tasks=4), workdir)  # the model's own weights
  with pytest.raises(evaluate.EvalSourceError, match=r"holds episodes of another evaluation \(checkpoint: ''"):
    evaluate.run(_config(tiny_model_dir, eval_stage=True, eval__max_tasks=4, eval__checkpoint=run[0]), workdir)
  with pytest.raises(evaluate.EvalSourceError, match="no checkpoint for step 7"):
    evaluate.run(_config(tiny_model_dir, eval_stage=True, eval__checkpoint=run[0], eval__checkpoint_step=7),
                 str(tmp_path / "ev7"))
  proc = subprocess.run([sys.executable, "-m", "seed_jax.main", "--config=configs/textworld_express.py",
                         "--config.stage=eval", f"--config.eval.checkpoint={tmp_path / 'nowhere'}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == \
      f"config error: config.eval.checkpoint='{tmp_path / 'nowhere'}' does not exist"
