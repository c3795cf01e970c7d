"""The eval stage on TextWorldExpress with the tiny model: a run's checkpoint scores exactly what the run's own
final evaluation measured, a killed evaluation resumes without replaying finished chunks, and bad sources are
one line. Several eval temperatures (a stand-in player, no model): tagged metric keys, the same draws' keys at
every temperature, and the per-episode dump."""
import json
import logging
import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from configs import textworld_express as twx_config
from seed_jax import evaluate, loop
from seed_jax.config import validate
from seed_jax.envs.base import Task, Trajectory
from seed_jax.infra.metrics import MetricsWriter

slow = pytest.mark.slow  # real simulators and the pipeline

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


def test_draws_are_seeded_with_replacement_and_independent_across_splits():
  from seed_jax import tasks
  panel = [Task(task_id=f"t{i}", split="eval", env="x", spec={}) for i in range(5)]
  a = tasks.draws(panel, 128, seed=0, split="eval")
  assert a == tasks.draws(panel, 128, seed=0, split="eval") and len(a) == 128
  assert len({t.task_id for t in a}) == 5 and {t.task_id for t in a} <= {t.task_id for t in panel}  # repeats
  assert [t.task_id for t in a] != [t.task_id for t in tasks.draws(panel, 128, seed=0, split="test")]
  assert [t.task_id for t in a] != [t.task_id for t in tasks.draws(panel, 128, seed=1, split="eval")]
  counts = np.bincount([int(t.task_id[1:]) for t in a], minlength=5)
  assert counts.min() >= 10  # uniform: each of 5 tasks ~25.6 times in 128 draws (P(any < 10) < 1e-4)


@slow
def test_the_eval_stage_plays_the_drawn_tasks(tiny_model_dir, tmp_path):
  """eval.draws=6 plays the split's 6 seeded draws, in order, and the workdir's source names the protocol."""
  from seed_jax import tasks
  from seed_jax.envs import get_family
  cfg = _config(tiny_model_dir, eval_stage=True, eval__max_tasks=0, eval__draws=6)
  results = evaluate.run(cfg, str(tmp_path))
  assert results["table"]["eval"]["overall"]["episodes"] == 6 and results["source"]["draws"] == 6
  with open(tmp_path / evaluate.EPISODES) as f:
    played = [e["task_id"] for c in map(json.loads, f) for e in c["episodes"]]
  family = get_family(cfg.env.name)
  assert played == [t.task_id for t in tasks.draws(family.tasks(cfg.env, "eval"), 6, cfg.seed, "eval")]


@slow
def test_checkpoint_scores_what_the_run_measured(run, tiny_model_dir, tmp_path):
  workdir, metrics = run
  results = evaluate.run(_config(tiny_model_dir, eval_stage=True, eval__checkpoint=workdir), str(tmp_path))
  overall = results["table"]["eval"]["overall"]
  assert overall["episodes"] == metrics["eval/eval/episodes"] == 10
  assert overall["success"] == metrics["eval/eval/success"]
  assert overall["ret"] == pytest.approx(metrics["eval/eval/return"], abs=1e-12)
  assert overall["score"] == pytest.approx(metrics["eval/eval/score"], abs=1e-12)
  assert overall["invalid_action_rate"] == pytest.approx(metrics["eval/eval/invalid_action_rate"], abs=1e-12)
  assert results["table"]["eval"]["coin"]["success"] == metrics["eval/eval/success/coin"]
  assert results["evaluated"] == f"checkpoint {workdir}/checkpoints step 1"
  md = (tmp_path / "eval_results.md").read_text()
  assert "| eval | **overall** | 10 |" in md and "| eval | coin | 10 |" in md
  assert json.loads((tmp_path / "eval_results.json").read_text()) == results


@slow
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


@slow
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


def _stand_in_player(temperatures, temperature, played):
  """A player whose episodes are decided by the sampling temperature (greedy solves the even panel indices, any
  other temperature the odd ones); `played` gets (temperature, panel indices, key data) per chunk."""
  cfg = twx_config.get_config("")
  cfg.rollout.tasks_per_update, cfg.rollout.group_size = 1, 2  # chunks of 2: 5 games in 3 chunks
  cfg.eval.temperature, cfg.eval.temperatures = temperature, temperatures

  def run_episodes(pool, family, env_cfg, tasks, group_ids, traj_ids, sp, tokenizer, key, **kw):
    played.append((sp.temperature, list(group_ids), jax.random.key_data(key).tolist()))
    return [Trajectory(task=t, group_id=g, traj_id=0, steps=[], success=(g % 2 == 0) == (sp.temperature == 0),
                       episode_return=1.0) for t, g in zip(tasks, group_ids)]

  tasks = [Task(task_id=f"g{k}", split="eval", env="textworld_express", spec={}, family="coin") for k in range(5)]
  # The episodes see the sampling params; turn by turn (slots.server reads cfg.refill).
  sampler = types.SimpleNamespace(rollout_fn=lambda params, sp, stop: sp, cfg=types.SimpleNamespace(refill=False))
  rt = types.SimpleNamespace(cfg=cfg, eval_tasks={"eval": tasks}, pool=None, family=None, tokenizer=None,
                             stop_sequences=(), sampler=sampler)
  return rt, run_episodes


def test_temperatures_tag_metrics_share_keys_and_dump_episodes(monkeypatch, tmp_path):
  played = []
  rt, fake = _stand_in_player((0.0, 0.4), 0.0, played)
  monkeypatch.setattr(evaluate, "run_episodes", fake)
  cfg_log = twx_config.get_config("").log
  cfg_log.tensorboard = False
  with MetricsWriter(str(tmp_path), True, cfg_log) as writer:
    m = evaluate.evaluate_record(rt, writer, None, 3)
  greedy = {k[len("eval/eval/"):] for k in m if k.startswith("eval/eval/")}
  tagged = {k[len("eval/eval_t0.4/"):] for k in m if k.startswith("eval/eval_t0.4/")}
  assert greedy == tagged and "success" in greedy and "success/coin" in greedy
  assert m["eval/eval/success"] == 3 / 5 and m["eval/eval_t0.4/success"] == 2 / 5  # eval/eval: the first temperature
  assert [(t, g) for t, g, _ in played] == [(0.0, [0, 1]), (0.0, [2, 3]), (0.0, [4]), (0.4, [0, 1]), (0.4, [2, 3]),
                                            (0.4, [4])]
  assert [k for t, _, k in played if t == 0.0] == [k for t, _, k in played if t == 0.4]  # same chunk keys
  with open(tmp_path / "dumps" / "eval_episodes_step000003.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [(r["panel"], r["temperature"], r["index"], r["task_id"], r["success"]) for r in rows[4:7]] == \
      [("eval", 0.0, 4, "g4", True), ("eval_t0.4", 0.4, 0, "g0", False), ("eval_t0.4", 0.4, 1, "g1", True)]
  assert len(rows) == 10 and {r["split"] for r in rows} == {"eval"}


def test_one_temperature_keeps_the_untagged_keys(monkeypatch):
  played = []
  rt, fake = _stand_in_player((), 0.4, played)
  monkeypatch.setattr(evaluate, "run_episodes", fake)
  m, episodes = evaluate.evaluate(rt, None, evaluate.eval_key(rt.cfg, 0))
  assert {k.split("/")[1] for k in m} == {"eval"} and m["eval/eval/success"] == 2 / 5
  assert {t for t, _, _ in played} == {0.4} and len(episodes) == 5
  assert evaluate.source(rt.cfg).keys() == {"model", "checkpoint", "step", "env", "split", "max_tasks",
                                            "temperature", "max_new_tokens", "seed"}  # eval_source.json as before


@pytest.mark.parametrize("temperatures", [(0.4, 0.0), (0.0, 0.0)])
def test_inconsistent_temperatures_are_one_line(temperatures):
  rt, _ = _stand_in_player(temperatures, 0.0, [])
  with pytest.raises(ValueError, match=r"config.eval.temperatures=.* must hold distinct temperatures, the first "
                                       r"config.eval.temperature=0.0"):
    evaluate.temperatures(rt.cfg)
