"""Stage 1 end to end on TextWorldExpress with a tiny model: collection (resumed after a torn write) ->
annotation (oracle, external over loopback HTTP, local model) -> SFT -> the RL pipeline starting from the
export. Plus the external analyzer's failure modes, and a writer killed mid-run."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import textworld_express as twx_config
from seed_jax import loop, records, sft, skills, stage1
from seed_jax.config import validate
from seed_jax.envs.base import Task
from seed_jax.infra.mesh import make_mesh
from seed_jax.models import load
from seed_jax.sample import Sampler, SamplerConfig, SamplingParams
from stage1_helpers import step, tiny_model_folder, trajectory
from test_analyzers import _Server

pytestmark = pytest.mark.slow  # real simulators, the stage-1 runs and subprocesses

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_device_mesh():
  return make_mesh((1, 1, 1), jax.devices()[:1])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, embedded_tokenizer):
  """A random 1-layer model (dim 32) with the embedded SmolLM2 tokenizer's vocabulary, as an HF folder."""
  return tiny_model_folder(str(tmp_path_factory.mktemp("tiny") / "model"), embedded_tokenizer, dim=32, n_layers=1)


def _cfg(stage: str, model: str):
  cfg = twx_config.get_config(stage)
  cfg.model.path = model
  cfg.log.tensorboard = False
  cfg.env.max_steps = 2
  cfg.model.max_prompt_tokens = 512
  c = cfg.collect
  c.num_tasks, c.rollouts, c.tasks_per_batch, c.max_new_tokens = 1, 2, 2, 8
  a = cfg.annotate
  a.max_prompt_tokens, a.chunk, a.gold_envs, a.local_max_new_tokens = 1024, 3, 2, 8
  s = cfg.sft
  s.epochs, s.batch_size, s.max_len, s.val_frac, s.min_len_bucket = 1, 2, 1024, 0.25, 64
  validate(cfg)
  return cfg


class _EchoServer(_Server):
  """Answers analysis prompts; the behaviour (test_skills cases) is the word after "Task: " in the prompt."""

  def respond(self, h, case, n, body):
    m = re.search(r"^Task: (\S+)$", case, re.M)
    super().respond(h, m.group(1) if m else case, n, body)


def test_collect_annotate_sft_then_rl(tiny, tmp_path, monkeypatch):
  work = str(tmp_path)
  path = os.path.join(work, stage1.TRAJECTORIES_FILE)
  # Collection of task 0, then a crash in the middle of writing task 1's group (a torn last line).
  assert stage1.collect(_cfg("collect", tiny), work, mesh=one_device_mesh())["collect/groups_written"] == 1
  first = open(path, "rb").read()
  record = json.loads(first)
  assert (record["task_index"], record["task"]["task_id"]) == (0, "twx/coin/train/459")
  assert [t["traj_id"] for t in record["trajectories"]] == [0, 1]
  with open(path, "ab") as f:
    f.write(first.replace(b'"task_index": 0', b'"task_index": 1')[:len(first) // 2])
  cfg = _cfg("collect", tiny)
  cfg.collect.num_tasks = 2
  stats = stage1.collect(cfg, work, mesh=one_device_mesh())
  assert (stats["collect/groups_done_before"], stats["collect/groups_written"], stats["collect/trajectories"]) == (1, 1, 2)
  data = open(path, "rb").read()
  assert data.startswith(first) and data.endswith(b"\n")  # task 0 kept byte for byte, the torn line gone
  lines = [json.loads(l) for l in data.splitlines()]
  assert [l["task_index"] for l in lines] == [0, 1] and lines[1]["task"]["task_id"] == "twx/coin/train/206"
  assert stage1.collect(cfg, work)["collect/groups_written"] == 0  # complete: nothing to do (no model loaded)
  trajs = stage1.load_trajectories(path)
  assert [(i, t.traj_id) for i, t in trajs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
  assert all(1 <= t.length <= 2 and t.steps[0].observation.startswith("You are in the ") for _, t in trajs)

  # Oracle annotation: the random model never answers in the action format, so every trajectory fails at its
  # first step, where the gold path of these coin games says "look around".
  acfg = _cfg("annotate", tiny)
  stats = stage1.annotate(acfg, work)
  assert (stats["annotate/analysed"], stats["annotate/kept"], stats["annotate/keep_rate"]) == (4, 4, 1.0)
  assert stats["annotate/keep_rate_failure"] == 1.0 and "annotate/keep_rate_success" not in stats
  kept = records.read_records(os.path.join(work, stage1.RECORDS_FILE))
  assert [(r["task_index"], r["traj_id"], r["analyzer"], r["success"]) for r in kept] == [
      (0, 0, "oracle", False), (0, 1, "oracle", False), (1, 0, "oracle", False), (1, 1, "oracle", False)]
  for r, (_, t) in zip(kept, trajs):
    assert r["prompt"] == skills.analysis_prompt(t)
    reply = json.loads(r["response"])
    assert r["response"] == skills.format_skill_json(reply["episode_summary"], reply["episode_skill"])
    assert reply["episode_skill"].startswith('When you see "You are in the ')
    assert reply["episode_skill"].endswith('reply with a valid action in the required format: "look around".')
  # A second run finds everything analysed and rewrites the same records.
  assert stage1.annotate(acfg, work)["annotate/kept"] == 4
  assert records.read_records(os.path.join(work, stage1.RECORDS_FILE)) == kept

  # External annotation of the same trajectories through a loopback server.
  server = _EchoServer()
  try:
    monkeypatch.setenv("SEED_TEST_ANALYZER_KEY", "k")
    ecfg = _cfg("annotate", tiny)
    ecfg.annotate.analyzer = "external"
    ecfg.annotate.log, ecfg.annotate.output = os.path.join(work, "ext_log.jsonl"), os.path.join(work, "ext.jsonl")
    ecfg.analyzer.external.base_url, ecfg.analyzer.external.api_key_env = server.url, "SEED_TEST_ANALYZER_KEY"
    stats = stage1.annotate(ecfg, work)
  finally:
    server.close()
  assert (stats["annotate/kept"], stats["annotate/analyzer_requests"]) == (4, 4)
  ext = records.read_records(ecfg.annotate.output)
  assert [r["response"] for r in ext] == [skills.format_skill_json("s", "Avoid it.")] * 4
  assert [r["prompt"] for r in ext] == [r["prompt"] for r in kept]

  # The local analyzer (the tiny model itself, greedy) writes no parseable JSON: all dropped, nothing crashes.
  lcfg = _cfg("annotate", tiny)
  lcfg.annotate.analyzer, lcfg.annotate.local_model_path, lcfg.annotate.chunk = "local", tiny, 4
  lcfg.annotate.log, lcfg.annotate.output = os.path.join(work, "loc_log.jsonl"), os.path.join(work, "loc.jsonl")
  stats = stage1.annotate(lcfg, work, mesh=one_device_mesh())
  assert (stats["annotate/analysed"], stats["annotate/kept"], stats["annotate/analyzer_requests"]) == (4, 0, 4)
  assert all(not r["ok"] and r["error"] for r in records.read_records(lcfg.annotate.log))

  # SFT on the oracle records: 3 train / 1 validation record, 2 steps; the export is an HF folder.
  out = sft.train(_cfg("sft", tiny), work, mesh=one_device_mesh())
  m = out["metrics"]
  assert (m["sft/train_records"], m["sft/val_records"], m["sft/steps"]) == (3, 1, 2)
  assert np.isfinite(m["sft/loss"]) and np.isfinite(m["sft/val_loss"])
  export = out["export_dir"]
  assert export == os.path.join(work, "export")
  assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(os.listdir(export))

  # RL starts from the export: the pipeline's Runtime is built from it and runs one update.
  rcfg = twx_config.get_config("")
  rcfg.model.path = export
  rcfg.log.tensorboard = False
  rcfg.rollout.tasks_per_update, rcfg.rollout.group_size, rcfg.rollout.max_new_tokens = 1, 2, 8
  rcfg.env.max_steps, rcfg.model.max_prompt_tokens = 2, 512
  rcfg.analyzer.max_prompt_tokens, rcfg.analyzer.max_new_tokens = 1024, 8
  rcfg.learner.minibatch_size, rcfg.learner.micro_batch_size = 4, 2
  rcfg.train.num_updates, rcfg.eval.at_end = 1, False
  validate(rcfg)
  res = loop.train(rcfg, os.path.join(work, "rl"))
  rl = res["metrics"]
  assert rl["rollout/episodes"] == 2 and rl["update/optimizer_steps"] >= 1
  sft_params = load.load_model(export)[1]
  assert not np.array_equal(np.asarray(res["state"].params["embed"]), np.asarray(sft_params["embed"]))


def _traj_file(path: str, cases: list[str]) -> None:
  groups = []
  for i, case in enumerate(cases):
    task = Task(task_id=f"toy/{case}", split="train", env="textworld_express", spec={}, family="toy")
    t = trajectory(task, [step("You are in the kitchen.", "look around")], 0.0, "max_steps", description=case)
    groups.append(dict(task_index=i, task=task.to_json(), trajectories=[stage1.traj_to_json(t)]))
  records.append_records(path, groups)


def test_external_annotation_keeps_and_drops_correctly(tmp_path, monkeypatch):
  cases = ["valid", "fenced", "broken", "still_broken", "429", "500", "timeout"]
  _traj_file(str(tmp_path / stage1.TRAJECTORIES_FILE), cases)
  cfg = twx_config.get_config("annotate")
  cfg.annotate.analyzer = "external"
  e = cfg.analyzer.external
  e.api_key_env, e.timeout_s, e.max_retries, e.backoff_base_s, e.backoff_jitter, e.concurrency = "", 0.3, 1, 0.01, 0.0, 4
  server = _EchoServer()
  e.base_url = server.url
  try:
    stats = stage1.annotate(cfg, str(tmp_path))
    hits = {c: len(v) for c, v in server.hits.items()}
    again = stage1.annotate(cfg, str(tmp_path))  # everything analysed: no request at all
    assert {c: len(v) for c, v in server.hits.items()} == hits
  finally:
    server.close()
  log_lines = records.read_records(str(tmp_path / stage1.ANNOTATIONS_FILE))
  assert [(l["task_id"], l["ok"]) for l in log_lines] == [
      ("toy/valid", True), ("toy/fenced", True), ("toy/broken", True), ("toy/still_broken", False),
      ("toy/429", True), ("toy/500", True), ("toy/timeout", False)]
  assert [l["error"] for l in log_lines if not l["ok"]] == ["no JSON object found", "empty reply"]
  kept = records.read_records(str(tmp_path / stage1.RECORDS_FILE))
  assert [r["task_id"] for r in kept] == ["toy/valid", "toy/fenced", "toy/broken", "toy/429", "toy/500"]
  assert {r["response"] for r in kept} == {skills.format_skill_json("s", "Good skill.")}  # canonical JSON
  assert (stats["annotate/analysed"], stats["annotate/kept"]) == (7, 5) and stats["annotate/keep_rate"] == 5 / 7
  # requests: 1 + 1 + 2 (JSON retry) + 2 (JSON retry) + 2 (429) + 2 (500) + 2 (timeout, then given up)
  assert (stats["annotate/analyzer_requests"], stats["annotate/analyzer_retries"],
          stats["annotate/analyzer_failures"], stats["annotate/analyzer_json_retries"]) == (12, 3, 1, 2)
  assert again["annotate/kept"] == 5 and records.read_records(str(tmp_path / stage1.RECORDS_FILE)) == kept


_WRITER = """
import sys
from seed_jax import records
path, n = sys.argv[1], int(sys.argv[2])
done = {r["i"] for r in records.read_records(path, repair=True)}
for i in range(n):
  if i not in done:
    records.append_records(path, [{"i": i, "pad": str(i) * 3_000_000}])
"""


def test_writer_killed_midway_then_restarted_keeps_every_record_once(tmp_path):
  path = str(tmp_path / "groups.jsonl")
  cmd = [sys.executable, "-c", _WRITER, path, "12"]
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.Popen(cmd, env=env, cwd=REPO)
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline and (not os.path.exists(path) or os.path.getsize(path) < 9_000_000):
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  partial = len(records.read_records(path))
  assert 3 <= partial < 12
  subprocess.run(cmd, env=env, cwd=REPO, check=True, timeout=300)
  written = records.read_records(path)
  assert [r["i"] for r in written] == list(range(12))
  assert all(r["pad"] == str(r["i"]) * 3_000_000 for r in written)


def test_read_records_errors_and_config_validation(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
  with pytest.raises(ValueError, match="line 2 is not valid JSON"):
    records.read_records(str(bad))
  with pytest.raises(FileNotFoundError, match="run the collect stage first"):
    stage1.load_trajectories(str(tmp_path / "none.jsonl"))
  cfg = twx_config.get_config("annotate")
  cfg.annotate.analyzer = "local"
  with pytest.raises(ValueError, match="annotate.local_model_path is empty"):
    validate(cfg)
  cfg.annotate.analyzer = "teacher"
  with pytest.raises(ValueError, match=r"config.annotate.analyzer='teacher' is not allowed"):
    validate(cfg)
  cfg = twx_config.get_config("sft")
  cfg.sft.batch_size = 0
  with pytest.raises(ValueError, match="config.sft.batch_size=0 must be > 0"):
    validate(cfg)
  paper = twx_config.get_config("collect,paper")
  assert (paper.stage, paper.collect.num_tasks, paper.collect.rollouts, paper.collect.temperature) == ("collect", 180, 8, 0.4)
  paper = twx_config.get_config("sft,paper")
  assert (paper.sft.epochs, paper.sft.lr, paper.sft.batch_size, paper.sft.b1, paper.sft.b2, paper.sft.warmup_frac,
          paper.sft.weight_decay, paper.sft.max_grad_norm, paper.sft.schedule) == (
              3, 5e-6, 8, 0.9, 0.95, 0.1, 0.01, 1.0, "warmup_cosine")
  with pytest.raises(ValueError, match="variant 'sft,collect' .* names 2 Stage 1 stages"):
    twx_config.get_config("sft,collect")
