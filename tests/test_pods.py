"""Pods: the real `python -m seed_jax.main` on TextWorldExpress as 2 processes x 4 CPU devices (loopback
coordinator, config.distributed.*) against 1 process x 8 devices, same seed: equal metrics and parameters;
the 2-process checkpoint resumed in 1 process; a process that dies mid-update; bad multi-host input.

A seed_jax.main process spends most of its time starting (imports, tokenizer, tracing) and not in its updates,
so each run here serves as many checks as it can."""
import json
import re
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from test_pipeline import analyst_url  # noqa: F401  (the fixture: the stand-in analyzer on loopback)

pytestmark = pytest.mark.slow  # real simulators and several seed_jax.main processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Parameters: each process packs its own rows, so the same step-samples are summed in other groupings and the
# gradients differ in fp32 rounding (grad_norm ~6e-4 relative here: with zero advantages the gradient is the
# entropy bonus of a near-uniform random model, which cancels). Adam then steps each element by ~lr whatever its
# size, so elements whose gradient is at rounding level may step either way: the parameter changes agree to
# CHANGE_RTOL in L2 (measured 5e-3) and all but OFF_FRAC of the elements to 1e-5 (measured 1e-3 or less).
# With the distillation term's gradient (the runs with the stand-in analyzer's skills) they agree to OPD_RTOL in L2
# (measured 4e-6 in one layout, 2.4e-5 packed against padded) and all but OPD_OFF_FRAC of the elements to 1e-5
# (measured 1e-5 packed against padded).
CHANGE_RTOL, OFF_FRAC, OPD_RTOL, OPD_OFF_FRAC = 2e-2, 1e-2, 1e-4, 1e-4
EXACT = ("rollout/return", "rollout/success", "rollout/episode_length", "rollout/invalid_action_rate",
         "rollout/response_tokens", "rollout/episodes", "rollout/env_errors", "analysis/parse_rate",
         "advantages/nonzero_frac", "update/optimizer_steps", "opd/analyzed_row_frac") + tuple(
             f"tokens/{phase}_{part}" for phase in ("rollout", "analysis", "rescore", "update")
             for part in ("response_real", "rows_real")) + tuple(
             f"tokens/{phase}_real" for phase in ("rescore", "update"))
# Not compared exactly: tokens/rollout_real and analysis_real count the prompt positions prefilled, once per
# distinct prompt of a call; two tasks with the same first prompt share one prefill only on one process.
CLOSE = ("advantages/abs_mean", "update/loss", "update/pg_loss", "update/kl", "update/grad_norm",
         "update/pg_clipfrac", "update/entropy", "update/opd_loss")

CONFIG = """
import sys
sys.path.insert(0, {tests!r})
from configs import textworld_express as twx
from seed_jax.config import validate


def get_config():
  c = twx.get_config("")
  c.model.path, c.model.max_prompt_tokens = {model!r}, 512
  # 3 tasks x 2 rollouts: process 0 plays tasks 0 and 2, process 1 task 1 (an uneven split)
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 3, 2, 12
  c.env.max_steps = 3
  c.analyzer.max_new_tokens = 24
  c.learner.minibatch_size, c.learner.micro_batch_size = 8, 8
  c.learner.lr = 1e-3  # visible parameter changes
  c.train.num_updates, c.train.dump_trajectories = {updates}, 100
  c.eval.at_end, c.eval.every, c.eval.max_tasks = {evals}, 2, 5  # after update 2 and at the end; 5 games
  c.distributed.initialization_timeout_s, c.distributed.heartbeat_timeout_s = 60, 10
  if {analyst!r}:  # the OpenAI-compatible stand-in of tests/test_pipeline.py: skills for half the episodes
    c.analyzer.backend, c.analyzer.external.base_url, c.analyzer.external.api_key_env = "external", {analyst!r}, ""
    c.analyzer.external.json_retry = False
  validate(c)
  return c
"""


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(cfg_file, workdir, processes: int, devices: int, *extra: str, port: int | None = None):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
  port = port or _port()
  procs = []
  for p in range(processes):
    flags = [] if processes == 1 else [f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                                       f"--config.distributed.num_processes={processes}",
                                       f"--config.distributed.process_id={p}"]
    procs.append(subprocess.Popen([sys.executable, "-m", "seed_jax.main", f"--config={cfg_file}",
                                   f"--workdir={workdir}", *flags, *extra], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  return procs


def _wait(procs, timeout=900) -> list[str]:
  try:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return outs


def _config_text(model, updates, analyst="", evals=False):
  return CONFIG.format(tests=os.path.dirname(__file__), model=model, updates=updates, analyst=analyst,
                       evals=evals)


def _run(tmp_path, model, updates, processes, devices, workdir, tag, analyst="", extra=(), evals=False):
  """Runs the job to its end (every process exits 0); returns (wall seconds, each process's output)."""
  cfg_file = tmp_path / f"cfg_{tag}.py"
  cfg_file.write_text(_config_text(model, updates, analyst, evals))
  t0 = time.time()
  procs = _launch(cfg_file, workdir, processes, devices, *extra)
  outs = _wait(procs)
  assert [p.returncode for p in procs] == [0] * processes, "\n".join(o[-3000:] for o in outs)
  return time.time() - t0, outs


def _metrics(workdir, evals=False):
  """The update records (or with `evals` the evaluation records) of metrics.jsonl."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if ("eval/updates_done" in r) == evals]


def _params(workdir, model, step):
  from configs import base
  from seed_jax import update
  from seed_jax.infra import checkpoint as ckpt_lib
  from seed_jax.models import load
  _, params = load.load_model(model)
  state = update.init_state(params, update.make_optimizer(base.get_base().learner))
  with ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), base.get_base().train.checkpoint,
                             read_only=True) as ckpt:
    restored, _ = ckpt.restore(step, ckpt_lib.abstract_state(state))
  return jax.tree.map(np.asarray, restored.params)


def _init(model):
  from seed_jax.models import load
  return jax.tree.map(np.asarray, load.load_model(model)[1])


def _assert_same_change(p1, p2, init, rtol=CHANGE_RTOL, off_frac=OFF_FRAC):
  """p1 and p2 moved init the same way (L2 within rtol, all but off_frac of the elements within 1e-5), and
  visibly."""
  flat = lambda p: np.concatenate([(x - z).ravel() for x, z in zip(jax.tree.leaves(p), jax.tree.leaves(init))])
  d1, d2 = flat(p1), flat(p2)
  assert np.abs(d1).max() > 1e-4  # the updates moved the weights
  rel = np.linalg.norm(d2 - d1) / np.linalg.norm(d1)
  off = float(np.mean(np.abs(d2 - d1) > 1e-5))
  print(f"parameter change: L2 difference {rel:.1e} of its norm, {off:.1e} of the elements off by > 1e-5")
  assert rel <= rtol and off <= off_frac, (rel, off)


def _same_update(a: dict, b: dict):
  for k in EXACT:
    if k in a:
      assert b[k] == a[k], (k, a[k], b[k])
  for k in CLOSE:
    if k in a:
      np.testing.assert_allclose(b[k], a[k], rtol=2e-3, atol=1e-6, err_msg=k)


# The checkpoint drill of the 2 x 4 run: writing checkpoint 2, its last, fails on process 1 only; the heartbeat
# timeout is raised so that JAX's coordination service is not what ends process 0.
DRILL = ("--config.distributed.heartbeat_timeout_s=300", "--config.train.checkpoint.save_interval_steps=1",
         "--config.faults.plan=ckpt_write@1:p1")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, analyst_url, tmp_path_factory):
  """With the stand-in analyzer's skills: 1 x 8 for three updates in the packed layouts; 2 x 4 for two in the
  padded layouts (one sequence per row: every step-sample's rows in their process's block) through the
  checkpoint drill (DRILL: both processes end at checkpoint 2; the same command resumes from checkpoint 1 and
  redoes update 2), then resumed in 1 x 8, packed, for the third. Packed and padded give the same updates
  (tests/test_packing.py), so one set of runs checks both layouts across process counts and a resume across
  them."""
  tmp = tmp_path_factory.mktemp("pods")
  one, two = str(tmp / "one"), str(tmp / "two")
  padded = ("--config.rescore.pack_length=0", "--config.learner.pack_length=0")
  times = {"1x8, 3 updates": _run(tmp, tiny_model_dir, 3, 1, 8, one, "one", analyst_url, evals=True)[0]}
  cfg_two = tmp / "cfg_two.py"
  cfg_two.write_text(_config_text(tiny_model_dir, 2, analyst_url, evals=True))
  t0 = time.time()
  procs = _launch(cfg_two, two, 2, 4, *padded, *DRILL)
  ended = _ends(procs)
  drill = dict(exits=[p.returncode for p in procs], ended=ended, outs=_wait(procs, timeout=60),
               steps=[r["step"] for r in _metrics(two)])
  times["2x4, 2 updates, checkpoint 2 failing"] = time.time() - t0
  times["2x4 resuming, update 2"], drill["resumed"] = _run(tmp, tiny_model_dir, 2, 2, 4, two, "two", analyst_url,
                                                           padded + DRILL, evals=True)
  shutil.copytree(two, str(tmp / "two_after_2"))
  times["1x8 resuming 2x4, update 3"] = _run(tmp, tiny_model_dir, 3, 1, 8, two, "resume", analyst_url,
                                             evals=True)[0]
  print("wall times (s):", {k: round(v, 1) for k, v in times.items()})
  return dict(one=one, two=str(tmp / "two_after_2"), resumed=two, model=tiny_model_dir, drill=drill)


def test_two_processes_give_the_one_process_updates(runs):
  """The same episodes, skills, metrics and parameter change: the distillation term's gradient makes the change
  agree to OPD_RTOL, element by element."""
  one, two = _metrics(runs["one"]), _metrics(runs["two"])
  assert [r["step"] for r in two] == [0, 1]
  assert two[0]["rollout/episodes"] == 6 and two[0]["tokens/rollout_response_real"] > 0
  assert all(0 < r["opd/analyzed_row_frac"] < 1 and r["update/opd_active_tokens"] > 0 for r in one)
  for a, b in zip(one[:2], two):
    _same_update(a, b)
  _assert_same_change(_params(runs["one"], runs["model"], 2), _params(runs["two"], runs["model"], 2),
                      _init(runs["model"]), rtol=OPD_RTOL, off_frac=OPD_OFF_FRAC)
  with open(os.path.join(runs["two"], "dumps", "trajectories_step000001.jsonl")) as f:
    assert len(f.readlines()) == 6  # process 0 dumps every process's episodes


def test_two_processes_evaluate_as_one(runs):
  """The evaluation after update 2 (5 panel games, 3 played by process 0 and 2 by process 1) equals the
  1-process one: the same games, the same draws."""
  (e1,) = [r for r in _metrics(runs["one"], evals=True) if r["step"] == 2]
  (e2,) = _metrics(runs["two"], evals=True)
  assert e2["step"] == 2 and e2["eval/eval/episodes"] == 5
  for k, v in e1.items():
    if k.startswith("eval/") and "tokens_per_s" not in k:
      assert e2[k] == v, (k, v, e2[k])


def test_the_eval_stage_on_two_processes_equals_one(runs, tmp_path):
  """`stage=eval` of the resumed run's checkpoint 3 on 5 panel games at two temperatures: 2 x 4 writes the same
  results as 1 x 8 (each process plays its share of every chunk); only process 0 writes and prints them."""
  cfg_file = tmp_path / "cfg_eval.py"
  cfg_file.write_text(_config_text(runs["model"], 3))
  flags = ("--config.stage=eval", f"--config.eval.checkpoint={runs['resumed']}", "--config.eval.max_tasks=5",
           "--config.eval.temperatures=(0.4,1.0)")
  results = {}
  for processes, devices in ((1, 8), (2, 4)):
    workdir = str(tmp_path / f"eval{processes}")
    procs = _launch(cfg_file, workdir, processes, devices, *flags)
    outs = _wait(procs, timeout=600)
    assert [p.returncode for p in procs] == [0] * processes, "\n".join(o[-3000:] for o in outs)
    assert all(("seed_jax: eval done." in o) == (i == 0) for i, o in enumerate(outs)), outs[-1][-2000:]
    with open(os.path.join(workdir, "eval_results.json")) as f:
      results[processes] = json.load(f)
    with open(os.path.join(workdir, "eval_episodes.jsonl")) as f:  # the fingerprint: every sampled reply
      results[processes]["chunks"] = [(c["panel"], c["chunk"], c["fingerprint"]) for c in map(json.loads, f)]
  assert results[1]["evaluated"].endswith("step 3") and set(results[1]["table"]) == {"eval", "eval_t1"}
  assert results[1]["table"]["eval"]["overall"]["episodes"] == 5 and len(results[1]["chunks"]) >= 2
  assert results[2]["table"] == results[1]["table"] and results[2]["chunks"] == results[1]["chunks"]


def test_two_process_checkpoint_resumes_in_one_process(runs):
  one, resumed = _metrics(runs["one"]), _metrics(runs["resumed"])
  assert [r["step"] for r in resumed] == [0, 1, 2]
  _same_update(one[2], resumed[2])
  (e1,), (e2,) = ([r for r in _metrics(w, evals=True) if r["step"] == 3] for w in (runs["one"], runs["resumed"]))
  assert e2["eval/eval/success"] == e1["eval/eval/success"] and e2["eval/eval/return"] == e1["eval/eval/return"]
  _assert_same_change(_params(runs["one"], runs["model"], 3), _params(runs["resumed"], runs["model"], 3),
                      _init(runs["model"]), rtol=OPD_RTOL, off_frac=OPD_OFF_FRAC)


DIE = """
import os
import jax
from seed_jax import pipeline
_rescore = pipeline.rescore_samples


def _rescore_or_die(rt, params, samples, with_skills, **kw):
  how = rt.cfg.get("die_in_update", "")
  if jax.process_index() == 1 and how == "exit":
    print("process 1 dies in the re-score", flush=True)
    os._exit(3)
  if jax.process_index() == 1 and how == "raise":
    raise RuntimeError("process 1 cannot re-score (injected)")
  return _rescore(rt, params, samples, with_skills, **kw)


pipeline.rescore_samples = _rescore_or_die
"""


def _dying_config(model, tmp_path, how: str):
  cfg_file = tmp_path / f"cfg_die_{how}.py"
  cfg_file.write_text(_config_text(model, 2) + DIE + "\n_get = get_config\n\n\ndef get_config():\n  c = _get()\n"
                      f"  c.die_in_update = {how!r}\n  return c\n")
  return cfg_file


def test_an_error_raised_on_one_process_ends_both_with_its_line_within_seconds(tiny_model_dir, tmp_path):
  """Process 1 raises in update 1's re-score while process 0 goes on into the next collective: process 1 prints
  its traceback, and both end with exit 1 and the same last line naming process 1 and the error, seconds apart
  (the heartbeat timeout is raised to 300 s, so it is not what ends process 0)."""
  procs = _launch(_dying_config(tiny_model_dir, tmp_path, "raise"), str(tmp_path / "w"), 2, 4,
                  "--config.distributed.heartbeat_timeout_s=300")
  ended = _ends(procs)
  outs = _wait(procs, timeout=60)
  assert [p.returncode for p in procs] == [1, 1], "\n".join(o[-3000:] for o in outs)
  lines = [o.strip().splitlines()[-1] for o in outs]
  assert lines[0] == lines[1] and re.fullmatch(
      r"fatal error: process 1 of 2 \(.+\): RuntimeError: process 1 cannot re-score \(injected\)", lines[0]), lines
  assert "Traceback" in outs[1] and "Traceback" not in outs[0] and "heartbeat" not in outs[0], outs[0][-3000:]
  assert abs(ended[0] - ended[1]) < 30, ended


def _ends(procs, timeout=600) -> list[float]:
  """When each process ended (polled every 0.1 s)."""
  ended: dict[int, float] = {}
  deadline = time.time() + timeout
  while len(ended) < len(procs) and time.time() < deadline:
    for i, p in enumerate(procs):
      if i not in ended and p.poll() is not None:
        ended[i] = time.time()
    time.sleep(0.1)
  print("process end times, s after the first:", {i: round(t - min(ended.values()), 1) for i, t in ended.items()})
  return [ended.get(i, float("inf")) for i in range(len(procs))]


def test_a_process_dying_mid_update_ends_the_other_within_seconds(tiny_model_dir, tmp_path):
  """Process 1 exits in update 1's re-score without a word. Process 0, in the next collective, sees its peer's
  connection close and ends at once with one line saying so; were it waiting elsewhere (a barrier), JAX's
  coordination service would end it within heartbeat_timeout_s (10 s here) with a line naming task 1."""
  t0 = time.time()
  procs = _launch(_dying_config(tiny_model_dir, tmp_path, "exit"), str(tmp_path / "w"), 2, 4)
  outs = _wait(procs, timeout=300)
  assert procs[1].returncode == 3 and "process 1 dies in the re-score" in outs[1], outs[1][-3000:]
  assert procs[0].returncode != 0, outs[0][-3000:]
  last = outs[0].strip().splitlines()[-1]
  assert (last.startswith("fatal error: process 0 of 2 (") and "another process left the job without a word" in last
          or re.search(r"Task 1 heartbeat timeout|unhealthy \(stopped sending heartbeats\):\s*1", outs[0])), last
  assert "Traceback" in outs[0] or "heartbeat" in outs[0]  # the collective's own error is shown too
  assert time.time() - t0 < 240


def test_a_checkpoint_write_failing_on_one_process_ends_both_with_its_line_and_the_run_resumes(runs):
  """The fixture's 2 x 4 drill: writing checkpoint 2, the last, fails on process 1 only while process 0 goes on
  into the save, a collective process 1 never joins. Both end within seconds with the same one line naming
  process 1, exit 1, and update 2's record is left to the resumed run; the same command then resumed both from
  checkpoint 1 and redid update 2, whose record, parameters and evaluation the other tests compare with 1 x 8's."""
  drill = runs["drill"]
  outs = drill["outs"]
  assert drill["exits"] == [1, 1], "\n".join(o[-3000:] for o in outs)
  assert abs(drill["ended"][0] - drill["ended"][1]) < 30, drill["ended"]
  lines = [o.strip().splitlines()[-1] for o in outs]
  assert lines[0] == lines[1], lines
  assert re.fullmatch(r"checkpoint error: process 1 of 2 \(.+\): checkpoint 2 could not be written in .*a fault "
                      r"drill.*the latest saved checkpoint is 1", lines[0]), lines[0]
  assert not any(re.search(r"heartbeat|Traceback", o) for o in outs), "\n".join(o[-3000:] for o in outs)
  assert drill["steps"] == [0, 1]  # update 2's record is rewound and redone by the resumed run
  assert "resumed" in drill["resumed"][0] and "after 1 updates" in drill["resumed"][0], drill["resumed"][0][-3000:]
  with open(os.path.join(runs["two"], "faults_fired.jsonl")) as f:
    assert [(r["kind"], r["update"]) for r in map(json.loads, f)] == [("ckpt_write", 1)]
  assert [r["step"] for r in _metrics(runs["two"])] == [0, 1]


def test_generate_on_two_processes_prints_the_one_process_reply_once(tiny_model_dir, tmp_path):
  """`stage=generate` with the weights sharded over 2 x 4 devices: process 0 prints the reply 1 x 8 prints
  (same seed: same draws), process 1 prints none."""
  flags = ("--config.model.path=" + tiny_model_dir, "--config.generate.prompt=Open the door.",
           "--config.generate.max_new_tokens=12", "--config.generate.temperature=1.0",
           "--config.distributed.initialization_timeout_s=60")
  outs = {}
  for processes, devices in ((1, 8), (2, 4)):
    procs = _launch(os.path.join(ROOT, "configs", "generate.py"), str(tmp_path / "g"), processes, devices, *flags)
    outs[processes] = _wait(procs, timeout=300)
    assert [p.returncode for p in procs] == [0] * processes, "\n".join(o[-3000:] for o in outs[processes])
  reply = outs[1][0].rstrip("\n").splitlines()[-1]
  assert reply.strip() and outs[2][0].rstrip("\n").splitlines()[-1] == reply, (outs[1][0][-500:], outs[2][0][-500:])
  assert reply not in outs[2][1].splitlines(), outs[2][1][-500:]


@pytest.mark.parametrize("flags,message", [
    (("--config.distributed.process_id=2",), "distributed.process_id (in [0, num_processes)) must be too; got "
                                              "num_processes=2, process_id=2"),
    (("--config.distributed.process_id=1", "--config.distributed.initialization_timeout_s=3"),
     "the coordinator 127.0.0.1:{port} did not come up within distributed.initialization_timeout_s=3"),
])
def test_bad_process_settings_are_one_line(flags, message, tmp_path):
  port = _port()
  proc = subprocess.run([sys.executable, "-m", "seed_jax.main", "--config=configs/textworld_express.py",
                         f"--workdir={tmp_path / 'w'}", f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                         "--config.distributed.num_processes=2", *flags], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 1 and last.startswith("multi-host error: "), proc.stderr[-2000:]
  assert message.format(port=port) in last, last


def test_data_axes_that_do_not_split_over_the_processes_are_one_line(tiny_model_dir, tmp_path):
  """A mesh whose only axis is tensor (data x fsdp = 1) cannot give 2 processes rows of their own."""
  cfg_file = tmp_path / "cfg.py"
  cfg_file.write_text(_config_text(tiny_model_dir, 1))
  procs = _launch(cfg_file, str(tmp_path / "w"), 2, 4, "--config.mesh.shape=(1,1,-1)")
  outs = _wait(procs, timeout=300)
  assert [p.returncode for p in procs] == [1, 1], outs
  lines = [out.strip().splitlines()[-1] for out in outs]
  # Both meet the error; the first to post it names itself, and the other ends with that line.
  assert lines[0] == lines[1] and re.match(r"multi-host error: process [01] of 2 \(.+\): data x fsdp = 1 devices "
                                           r"do not divide over 2 processes", lines[0]), lines


STAGE1_CONFIG = """
from configs import textworld_express as twx
from seed_jax.config import validate


def get_config():
  c = twx.get_config({stage!r})
  c.model.path, c.model.max_prompt_tokens, c.log.tensorboard = {model!r}, 512, False
  c.env.max_steps = 2
  # 3 demo tasks, then 3 self-play episodes in batches of 2 (process 0 plays tasks 0 and 2, process 1 task 1);
  # SFT rows 8 to a micro-batch: each process supplies its 4
  c.warmstart.num_tasks, c.warmstart.envs, c.warmstart.self_play_rollouts = 3, 2, 3
  c.rollout.max_new_tokens, c.analyzer.max_prompt_tokens = 8, 1024
  c.sft.epochs, c.sft.batch_size, c.sft.max_len, c.sft.val_frac, c.sft.micro_rows = 1, 4, 1024, 0.25, 8
  c.sft.lr, c.sft.schedule = 1e-3, "constant"
  # Then the oracle annotation of the self-play episodes (stage1.collect's file) in one chunk of 3
  c.annotate.input = {episodes!r}
  c.annotate.max_prompt_tokens, c.annotate.chunk, c.annotate.gold_envs = 1024, 3, 2
  c.distributed.initialization_timeout_s, c.distributed.heartbeat_timeout_s = 60, 10
  validate(c)
  return c
"""


def test_stage1_and_the_warm_start_on_two_processes_equal_one(tiny_model_dir, tmp_path):
  """A warm start with self-play (demos, SFT, self-play collection by Stage 1's collect, SFT again), then the
  oracle annotation of those episodes, on 2 processes x 4 devices write the 1 x 8 files: the same
  trajectories, annotations and records exactly, and exported weights equal to fp32 summation order (the same
  rows on the same 8-device mesh; only the cross-process reductions group them differently)."""
  from seed_jax.models import load
  dirs = {}
  for processes, devices in ((1, 8), (2, 4)):
    workdir = dirs[processes] = str(tmp_path / f"{processes}x{devices}")
    for stage in ("warmstart", "annotate"):
      cfg_file = tmp_path / f"cfg_{stage}.py"
      cfg_file.write_text(STAGE1_CONFIG.format(stage=stage, model=tiny_model_dir,
                                               episodes=os.path.join(workdir, "self_play_trajectories.jsonl")))
      procs = _launch(cfg_file, workdir, processes, devices)
      outs = _wait(procs, timeout=600)
      assert [p.returncode for p in procs] == [0] * processes, "\n".join(o[-3000:] for o in outs)
  read = lambda d, name: [json.loads(line) for line in open(os.path.join(dirs[d], name))]
  for name in ("warmstart_records.jsonl", "self_play_trajectories.jsonl", "self_play_records.jsonl",
               "annotations.jsonl", "sft_records.jsonl"):
    assert read(1, name) == read(2, name), name
  assert len(read(1, "self_play_trajectories.jsonl")) == 3 and len(read(1, "annotations.jsonl")) == 3
  one, two = (jax.tree.map(np.asarray, load.load_model(os.path.join(dirs[d], "export"))[1]) for d in (1, 2))
  init = _init(tiny_model_dir)
  _assert_same_change(one, two, init, rtol=1e-5, off_frac=0.0)


VL_CONFIG = """
from configs import sokoban
from seed_jax.config import validate


def get_config():
  c = sokoban.get_config("vl")  # the tiny random Qwen2.5-VL seeing each step's RGB frame
  # 3 tasks x 2 rollouts of 2 steps: process 0 plays tasks 0 and 2, process 1 task 1 (unequal patch counts)
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 3, 2, 12
  c.env.max_steps, c.analyzer.max_new_tokens = 2, 12
  c.learner.minibatch_size, c.learner.micro_batch_size, c.learner.lr = 8, 8, 1e-3
  # π_old re-scored in the padded layout (rows per context); the update packed
  c.rescore.pack_length, c.rescore.old_logps = 0, "rescore"
  c.train.num_updates, c.eval.at_start, c.eval.at_end = 1, False, False
  c.distributed.initialization_timeout_s, c.distributed.heartbeat_timeout_s = 60, 10
  validate(c)
  return c
"""


def test_image_observations_on_two_processes_equal_one(tmp_path):
  """The VL policy on Sokoban frames, one update: 2 x 4 against 1 x 8. Each process lays out its own rows'
  frames as its block of every call's image batch (prefill, the padded re-score, the packed update): the same
  episodes, metrics and parameter change as one process holding every frame."""
  cfg_file = tmp_path / "cfg_vl.py"
  cfg_file.write_text(VL_CONFIG)
  dirs, times = {}, {}
  for processes, devices in ((1, 8), (2, 4)):
    workdir = dirs[processes] = str(tmp_path / f"vl{processes}x{devices}")
    t0 = time.time()
    procs = _launch(cfg_file, workdir, processes, devices)
    outs = _wait(procs, timeout=600)
    assert [p.returncode for p in procs] == [0] * processes, "\n".join(o[-3000:] for o in outs)
    times[f"{processes}x{devices}"] = round(time.time() - t0, 1)
  print("wall times (s):", times)
  one, two = _metrics(dirs[1]), _metrics(dirs[2])
  assert [r["step"] for r in two] == [0] and two[0]["rollout/episodes"] == 6
  for a, b in zip(one, two):
    _same_update(a, b)
  _assert_same_change(_params(dirs[1], "embedded-vl", 1), _params(dirs[2], "embedded-vl", 1), _init("embedded-vl"))
