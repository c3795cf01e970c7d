"""The SEED pipeline end to end on real environments with a tiny model: metrics, dumps, OPD masking,
kill-and-resume, the analyzer-off GRPO case, and config errors (the train step itself: test_update.py)."""
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jax
import numpy as np
import pytest

from configs import textworld_express as twx_config
from seed_jax import loop, pipeline, report, runtime
from seed_jax.config import validate

pytestmark = pytest.mark.slow  # real simulators, the full pipeline and a seed_jax.main subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every per-update metric DESIGN.md lists (returns, success, length, invalid rate, parse rate, OPD stats, KL,
# entropy, clip fraction, grad norm, per-phase timings, tokens/s).
REQUIRED = ("rollout/return", "rollout/success", "rollout/episode_length", "rollout/invalid_action_rate",
            "analysis/parse_rate", "update/opd_loss", "update/opd_gate_mean", "update/opd_gate_high_frac",
            "update/opd_gap_mean", "update/opd_active_tokens", "update/kl", "update/entropy", "update/pg_clipfrac",
            "update/grad_norm", "time/rollout_s", "time/analysis_s", "time/rescore_s", "time/update_s",
            "rollout/tokens_per_s", "advantages/abs_mean", "advantages/nonzero_frac")


class _Analyst(BaseHTTPRequestHandler):
  """OpenAI-compatible stand-in analyzer on loopback: valid JSON for prompts whose trajectory id digit is even
  (a deterministic half of the trajectories), prose otherwise. Keeps the Authorization headers it was sent."""
  auth: list = []

  def do_POST(self):
    _Analyst.auth.append(self.headers.get("Authorization"))
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    prompt = body["messages"][-1]["content"]
    ok = sum(map(ord, prompt)) % 2 == 0 and "JSON object only" not in prompt
    content = ('{"episode_summary": "s", "episode_skill": "Pick up the coin first."}' if ok else "no idea")
    data = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *a):
    pass


@pytest.fixture(scope="module")
def analyst_url():
  server = ThreadingHTTPServer(("127.0.0.1", 0), _Analyst)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_address[1]}/v1"
  server.shutdown()


def _config(model_dir, url, num_updates=2):
  c = twx_config.get_config("")
  c.model.path = model_dir
  c.model.max_prompt_tokens = 512
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 2, 2, 12
  c.env.max_steps = 2
  c.analyzer.backend, c.analyzer.external.base_url, c.analyzer.external.api_key_env = "external", url, ""
  c.analyzer.external.json_retry = False
  c.learner.minibatch_size, c.learner.micro_batch_size = 8, 4
  c.learner.lr = 1e-3  # visible parameter changes for the resume comparison
  c.train.num_updates, c.train.dump_trajectories = num_updates, 100
  c.eval.at_end, c.eval.every = False, 0
  c.log.tensorboard = True
  validate(c)
  return c


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


# Metrics of the machine, not of the run: wall times, speeds, the driver's memory.
VOLATILE = ("time/", "wall_time", "rollout/tokens_per_s", "mem/")
SECRET = "sk-seed-test-" + "5eed" * 8  # the analyzer's API key in the full run: sent, and written nowhere


class _Records(logging.Handler):
  def __init__(self):
    super().__init__(logging.DEBUG)
    self.messages = []

  def emit(self, record):
    self.messages.append(self.format(record))


@pytest.fixture(scope="module")
def full_run(tiny_model_dir, analyst_url, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("full"))
  cfg = _config(tiny_model_dir, analyst_url)
  cfg.analyzer.external.api_key_env = "SEED_TEST_ANALYZER_KEY"
  logs, root = _Records(), logging.getLogger()
  level = root.level
  root.addHandler(logs)
  root.setLevel(logging.DEBUG)
  try:
    with pytest.MonkeyPatch.context() as mp:
      mp.setenv("SEED_TEST_ANALYZER_KEY", SECRET)
      out = loop.train(cfg, workdir)
  finally:
    root.removeHandler(logs)
    root.setLevel(level)
  return workdir, dict(out, logs=logs.messages)


def test_the_analyzer_key_is_sent_and_written_nowhere(full_run):
  workdir, out = full_run
  assert _Analyst.auth and f"Bearer {SECRET}" in _Analyst.auth
  files = [os.path.join(d, f) for d, _, fs in os.walk(workdir) for f in fs]
  kinds = {os.path.relpath(f, workdir).split(os.sep)[0] for f in files}
  assert {"metrics.jsonl", "dumps", "tb", "checkpoints"} <= kinds, kinds  # every kind of output is searched
  for f in files:
    with open(f, "rb") as fh:
      assert SECRET.encode() not in fh.read(), f
  assert out["logs"] and not [m for m in out["logs"] if SECRET in m]


def test_end_to_end_metrics_dumps_and_opd_mask(full_run):
  workdir, out = full_run
  rows = _read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1]
  for r in rows:
    missing = [k for k in REQUIRED if k not in r]
    assert not missing, missing
    assert r["rollout/episodes"] == 4 and r["update/update_skipped"] == 0
  assert os.listdir(os.path.join(workdir, "tb"))
  for u, r in enumerate(rows):
    skills = _read_jsonl(os.path.join(workdir, "dumps", f"skills_step{u:06d}.jsonl"))
    trajs = _read_jsonl(os.path.join(workdir, "dumps", f"trajectories_step{u:06d}.jsonl"))
    assert len(skills) == len(trajs) == 4
    ok = {(s["group"], s["traj"]) for s in skills if s["ok"]}
    assert all(s["skill"] == "Pick up the coin first." for s in skills if s["ok"])
    # The OPD mask is 1 exactly on the step-samples of trajectories whose analysis parsed.
    n_rows = sum(len(t["steps"]) for t in trajs)
    n_ok = sum(len(t["steps"]) for t in trajs if (t["group"], t["traj"]) in ok)
    assert r["opd/analyzed_row_frac"] == pytest.approx(n_ok / n_rows)
    assert r["analysis/parse_rate"] == pytest.approx(len(ok) / 4)
    assert r["update/opd_tokens"] > 0 if ok else r["update/opd_tokens"] == 0
    # Token accounting: the rollout decodes the step responses, the analyzer here is external (no sampler).
    assert r["tokens/rollout_response_real"] == pytest.approx(r["rollout/response_tokens"] * n_rows)
    assert r["tokens/analysis_forwarded"] == 0 and r["tokens/update_rows_real"] == n_rows
    assert all(0 < r[f"tokens/{p}_real"] <= r[f"tokens/{p}_forwarded"] for p in ("rollout", "rescore", "update"))
    # The re-score: every row under the KL reference, only the analyzed ones under their skill (π_old: the sampler's)
    assert r["tokens/rescore_rows_real"] == n_rows + n_ok
  line = report.summary_line(1, 2, rows[1])
  assert line.startswith(f"update 2/2: return {rows[1]['rollout/return']:.3f} success {rows[1]['rollout/success']:.3f} ")
  assert f"skill-parse {rows[1]['analysis/parse_rate']:.2f} opd-tokens {rows[1]['update/opd_tokens']:.0f} " in line
  assert f"|A| {rows[1]['advantages/abs_mean']:.3f} " in line
  assert f"| rollout {rows[1]['time/rollout_s']:.0f}s analysis " in line and "nan" not in line


def test_resume_after_interruption_equals_uninterrupted_run(full_run, tiny_model_dir, analyst_url, tmp_path):
  workdir, out = full_run
  part = str(tmp_path / "part")
  loop.train(_config(tiny_model_dir, analyst_url, num_updates=1), part)  # stops after update 0
  resumed = loop.train(_config(tiny_model_dir, analyst_url, num_updates=2), part)  # resumes at update 1
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               out["state"].params, resumed["state"].params)
  full_rows, part_rows = (_read_jsonl(os.path.join(d, "metrics.jsonl")) for d in (workdir, part))
  assert [r["step"] for r in part_rows] == [0, 1]
  for a, b in zip(full_rows, part_rows):
    for k, v in a.items():
      if not k.startswith(VOLATILE):
        assert b[k] == v, k


def test_a_damaged_newest_checkpoint_is_named_set_aside_and_the_update_redone(full_run, tiny_model_dir, analyst_url,
                                                                               tmp_path, caplog):
  """64 bytes flipped in the middle of the newest step's largest data file (TensorStore restores that without an
  error): the resumed run names the step in one line, moves it aside, resumes from the step before and ends on
  the uninterrupted run's parameters and metrics."""
  workdir = str(tmp_path / "run")
  shutil.copytree(full_run[0], workdir)
  newest = os.path.join(workdir, "checkpoints", "2", "state")
  data = max((os.path.join(d, f) for d, _, fs in os.walk(newest) for f in fs), key=os.path.getsize)
  blob = bytearray(open(data, "rb").read())
  blob[len(blob) // 2:len(blob) // 2 + 64] = bytes(b ^ 0xFF for b in blob[len(blob) // 2:len(blob) // 2 + 64])
  open(data, "wb").write(bytes(blob))
  with caplog.at_level(logging.WARNING):
    resumed = loop.train(_config(tiny_model_dir, analyst_url, num_updates=2), workdir)
  lines = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
  assert len(lines) == 1 and lines[0].startswith("checkpoint 2 is damaged (") and lines[0].endswith("resuming from 1")
  assert os.path.isdir(os.path.join(workdir, "checkpoints.damaged", "2"))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full_run[1]["state"].params, resumed["state"].params)
  rows, full_rows = (_read_jsonl(os.path.join(d, "metrics.jsonl")) for d in (workdir, full_run[0]))
  assert [r["step"] for r in rows] == [0, 1]
  assert [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows] == \
      [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in full_rows]


def test_kill_between_metrics_and_checkpoint_redoes_the_update_once(full_run, tiny_model_dir, analyst_url, tmp_path):
  """A `seed_jax.main` process dies (os._exit, no cleanup) after update 2's metrics and dumps are written but
  before its checkpoint: the resumed run redoes update 2 once. metrics.jsonl then holds one record per update,
  equal to the uninterrupted run's, and update 2's dumps are the redone ones."""
  workdir = str(tmp_path / "run")
  cfg_file = tmp_path / "cfg.py"
  cfg_file.write_text(
      f"import os, sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
      f"from test_pipeline import _config\nfrom seed_jax.infra import checkpoint\n"
      f"_save = checkpoint.Checkpointer.save\n\n\n"
      f"def _save_or_die(self, step, *a, **k):\n"
      f"  if step == 2:\n    os._exit(137)\n  return _save(self, step, *a, **k)\n\n\n"
      f"checkpoint.Checkpointer.save = _save_or_die\n\n\n"
      f"def get_config():\n  return _config({tiny_model_dir!r}, {analyst_url!r}, num_updates=2)\n")
  proc = subprocess.run([sys.executable, "-m", "seed_jax.main", f"--config={cfg_file}", f"--workdir={workdir}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 137, proc.stderr[-3000:]
  assert [r["step"] for r in _read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == [0, 1]
  dumps = [os.path.join("dumps", f"{kind}_step000001.jsonl") for kind in ("trajectories", "skills")]
  for d in dumps:
    with open(os.path.join(workdir, d), "a") as f:
      f.write('{"stale": true}\n')  # left by the killed run: the redone update must replace it
  resumed = loop.train(_config(tiny_model_dir, analyst_url, num_updates=2), workdir)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full_run[1]["state"].params, resumed["state"].params)
  rows, full_rows = (_read_jsonl(os.path.join(d, "metrics.jsonl")) for d in (workdir, full_run[0]))
  assert [r["step"] for r in rows] == [0, 1]
  for a, b in zip(full_rows, rows):
    assert {k: v for k, v in a.items() if not k.startswith(VOLATILE)} == \
        {k: v for k, v in b.items() if not k.startswith(VOLATILE)}
  for d in dumps:
    assert _read_jsonl(os.path.join(workdir, d)) == _read_jsonl(os.path.join(full_run[0], d))


def test_sigterm_saves_the_last_update_and_resume_matches(full_run, tiny_model_dir, analyst_url, tmp_path):
  """SIGTERM to a `seed_jax.main` run during its second update: it ends at the next safe point with one line
  and exit status 143, checkpoint and metrics.jsonl agree (one record per finished update), and resuming gives
  the uninterrupted run's parameters."""
  workdir = str(tmp_path / "run")
  cfg_file = tmp_path / "cfg.py"
  cfg_file.write_text(f"import sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                      f"from test_pipeline import _config\n\n\ndef get_config():\n"
                      f"  return _config({tiny_model_dir!r}, {analyst_url!r}, num_updates=3)\n")
  proc = subprocess.Popen([sys.executable, "-m", "seed_jax.main", f"--config={cfg_file}", f"--workdir={workdir}"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    for line in proc.stderr:
      if "update 1/3:" in line:
        break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
  finally:
    proc.kill()
  assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
  assert "Traceback" not in err
  stopped = [line for line in out.splitlines() if line.startswith("seed_jax: stopped by SIGTERM after ")]
  assert len(stopped) == 1, out
  done = int(re.search(r"after (\d+) updates", stopped[0]).group(1))
  assert done in (1, 2)
  assert [r["step"] for r in _read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == list(range(done))
  resumed = loop.train(_config(tiny_model_dir, analyst_url, num_updates=2), workdir)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               full_run[1]["state"].params, resumed["state"].params)
  assert [r["step"] for r in _read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == [0, 1]


def test_killed_jvm_is_one_log_line_and_restarts_carry_across_resume(tiny_model_dir, analyst_url, tmp_path,
                                                                    monkeypatch, caplog, capfd):
  """An env's JVM killed at the start of update 1: one warning line, the worker restarts, `env/restarts` counts
  it in that update, and `env/restarts_total` still counts it after a resume."""
  from envs_helpers import live_processes_in_groups
  real_rollout = pipeline._rollout

  def rollout_after_a_kill(rt, params, u, key, clock=None):
    if u == 0:
      [jvm] = [pid for pid, cmd in live_processes_in_groups({rt.pool.worker_pids()[0]}) if "java" in cmd]
      os.kill(jvm, signal.SIGKILL)
    return real_rollout(rt, params, u, key, clock)

  monkeypatch.setattr(pipeline, "_rollout", rollout_after_a_kill)
  workdir = str(tmp_path / "run")
  with caplog.at_level("INFO"):
    loop.train(_config(tiny_model_dir, analyst_url, num_updates=1), workdir)
    loop.train(_config(tiny_model_dir, analyst_url, num_updates=2), workdir)  # resumed: update 2 kills none
  rows = _read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [(r["step"], r["env/restarts"], r["env/restarts_total"]) for r in rows] == [(0, 1, 1), (1, 0, 1)]
  restarts = [r for r in caplog.records if "restarting its worker" in r.getMessage()]
  assert len(restarts) == 1 and "\n" not in restarts[0].getMessage()
  err = capfd.readouterr().err  # the env workers' stderr too (they inherit the descriptor)
  assert "py4j" not in err and "Traceback" not in err, err[-2000:]


def _with_file_size_limit(limit_kib, argv):
  """argv run with writes past `limit_kib` KiB failing with EFBIG (File too large), like a full disk: a real
  failed write that needs no privileges (a tmpfs mount would). SIGXFSZ is ignored so the write fails instead of
  killing the process; bash sets both before exec."""
  return ["bash", "-c", f"trap '' XFSZ; ulimit -f {limit_kib}; exec \"$@\"", "bash", *argv]


def test_failed_checkpoint_write_is_one_line_and_stops_the_run(tiny_model_dir, analyst_url, tmp_path):
  """A checkpoint that cannot be written (files capped at 1 MiB; the tiny model's state needs more) ends the
  run with one line naming the step, the folder and the OS's cause, before another update is recorded."""
  workdir = str(tmp_path / "run")
  cfg_file = tmp_path / "cfg.py"
  cfg_file.write_text(f"import sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                      f"from test_pipeline import _config\n\n\ndef get_config():\n"
                      f"  c = _config({tiny_model_dir!r}, {analyst_url!r}, num_updates=3)\n"
                      f"  c.compile_cache.enabled = False\n  return c\n")
  argv = [sys.executable, "-m", "seed_jax.main", f"--config={cfg_file}", f"--workdir={workdir}"]
  proc = subprocess.run(_with_file_size_limit(1024, argv), cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last == (f"checkpoint error: checkpoint 1 could not be written in {workdir}/checkpoints: File too large "
                  "(errno 27); no checkpoint is saved"), proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr
  steps = [r["step"] for r in _read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  assert steps in ([0], [0, 1]), steps  # stopped at the first phase boundary after the failure (or the next save)


def test_unusable_workdir_is_one_line_before_loading(tmp_path):
  (tmp_path / "file").write_text("x")
  proc = subprocess.run([sys.executable, "-m", "seed_jax.main", "--config=configs/textworld_express.py",
                         f"--workdir={tmp_path / 'file' / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert f"workdir error: workdir '{tmp_path / 'file' / 'run'}' is not usable: Not a directory" in proc.stderr
  assert "compiling" not in proc.stderr  # nothing was loaded


def test_analyzer_off_means_plain_grpo():
  c = twx_config.get_config("")
  assert runtime.effective_loss_config(c).opd_variant == "gated"
  c.analyzer.enabled = False
  assert runtime.effective_loss_config(c).opd_variant == "none"


@pytest.mark.parametrize("flag,message", [
    ("--config.not_a_field=1", "not_a_field"),
    ("--config.rollout.group_size=0", "config.rollout.group_size=0 must be > 0"),
    ("--config.objectives.opd_variant=kl", "config.objectives.opd_variant='kl' is not allowed"),
    ("--config.model.path=", "config.model.path is empty"),
    ("--config.model.path=/no/such/model", "config.model.path='/no/such/model' does not exist"),
    ("--config.model.attention=splash", "config.model.attention='splash' needs a TPU (this backend: cpu); choose "
     "auto, blocked or xla_blockwise"),
    ("--config.model.attention=cudnn", "config.model.attention='cudnn' needs an NVIDIA GPU (this backend: cpu); "
     "choose auto, blocked or xla_blockwise (or splash on a TPU)"),
])
def test_config_errors_are_one_clear_line(flag, message):
  proc = subprocess.run([sys.executable, "-m", "seed_jax.main", "--config=configs/textworld_express.py", flag],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert message in proc.stderr
  assert "Traceback" not in proc.stderr


def test_sciworld_smoke_update_with_policy_analyzer(tiny_model_dir, tmp_path):
  from configs import sciworld as sciworld_config
  c = sciworld_config.get_config("")
  c.model.path, c.model.max_prompt_tokens = tiny_model_dir, 1024
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 1, 2, 8
  c.env.max_steps, c.env.task_types = 2, "boil"
  c.analyzer.max_new_tokens, c.analyzer.max_prompt_tokens = 8, 1024  # the policy itself analyzes (greedy)
  c.learner.minibatch_size, c.learner.micro_batch_size = 4, 2
  c.train.num_updates, c.eval.at_end = 1, False
  # The config's warm start first (SciWorld's gold-path demos, SFT), at its smallest: 2 demo tasks, one epoch
  c.warmstart.num_tasks, c.warmstart.envs, c.sft.epochs = 2, 2, 1
  c.warmstart.cache_dir = str(tmp_path / "warmstart_cache")
  validate(c)
  out = loop.train(c, str(tmp_path / "run"))
  m = out["metrics"]
  assert m["rollout/episodes"] == 2 and m["rollout/env_errors"] == 0 and m["rollout/episode_length"] == 2
  assert 0.0 <= m["analysis/parse_rate"] <= 1.0 and m["update/optimizer_steps"] == 1
  assert os.path.exists(os.path.join(str(tmp_path), "run", "dumps", "skills_step000000.jsonl"))
  assert len(os.listdir(tmp_path / "warmstart_cache")) == 1  # the warm start it trained
