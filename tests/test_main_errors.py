"""A bad input ends `python -m seed_jax.main` with exactly one line naming it and exit status 1, and leaves nothing
in the workdir, whether validation catches it (a loss range, a mesh shape, an unknown variant, a config file that
does not exist, a bad type, an unknown env, an unusable analyzer URL or key) or the build or a stage does (a mesh
that asks for more devices than are present, a stage input that was never written)."""
import concurrent.futures
import os
import subprocess
import sys

import pytest

from helpers import REPO

T = "--config=configs/textworld_express.py"
# name -> (arguments, the start of the one line). The first ones run in make test-fast; all run in make test.
CASES = {
    "clip_c": ([T, "--config.objectives.clip_c=0.5"], "config error: config.objectives.clip_c=0.5 must be > 1"),
    "variant": (["--config=configs/textworld_express.py:nope"],
                "config error: unknown variant 'nope' of configs/textworld_express.py; known: ''"),
    "file": (["--config=configs/nope.py", "--config.seed=1"], "config error: no config file 'configs/nope.py'"),
    "mesh": ([T, "--config.mesh.shape=(1,-1,-1)"], "config error: config.mesh.shape may contain at most one -1"),
    "build": ([T, "--config.mesh.shape=(3,1,1)", "--config.warmstart.before_rl=False"],
              "config error: mesh.shape [3, 1, 1] holds 3 devices but"),
}
MORE = {
    "clip_low": ([T, "--config.objectives.clip_low=1.5"], "config error: config.objectives.clip_low=1.5 must be in [0, 1)"),
    "mesh_len": ([T, "--config.mesh.shape=(2,2)"], "config error: config.mesh.shape must have 3 entries"),
    "mesh_preset": ([T, "--config.mesh.preset=nope"], "config error: unknown mesh preset 'nope'"),
    "model_path": ([T, "--config.model.path=/nonexistent/model"],
                   "config error: config.model.path='/nonexistent/model' does not exist"),
    "group_size": ([T, "--config.rollout.group_size=0"], "config error: config.rollout.group_size=0 must be > 0"),
    "lr": ([T, "--config.learner.lr=-1.0"], "config error: config.learner.lr=-1.0 must be >= 0"),
    "eval_checkpoint": ([T, "--config.stage=eval", "--config.eval.checkpoint=/nonexistent/ckpt"],
                        "config error: config.eval.checkpoint='/nonexistent/ckpt' does not exist"),
    "template_file": ([T, "--config.templates.step_first=/nonexistent/t.txt"],
                      "config error: config.templates.step_first: /nonexistent/t.txt: cannot read it"),
    "max_new_tokens": ([T, "--config.rollout.max_new_tokens=0"], "config error: config.rollout.max_new_tokens=0 must be > 0"),
    "temperature": ([T, "--config.rollout.temperature=-1.0"], "config error: config.rollout.temperature=-1.0 must be >= 0"),
    "not_an_int": ([T, "--config.rollout.group_size=abc"], "config error: flag --config.rollout.group_size=abc: invalid literal"),
    "not_a_bool": ([T, "--config.log.tensorboard=maybe"], "config error: flag --config.log.tensorboard=maybe"),
    "unknown_field": ([T, "--config.rollout.nope=1"], "config error: unknown config field 'nope'"),
    "env_name": ([T, "--config.env.name=nope"], "config error: config.env.name='nope' is not an environment; known: alfworld"),
    "game": ([T, "--config.env.games=nope"], "config error: config.games='nope': unknown or empty game names"),
    "stage": ([T, "--config.stage=nope"], "config error: config.stage='nope' is not allowed"),
    "backend": ([T, "--config.analyzer.backend=nope"], "config error: config.analyzer.backend='nope' is not allowed"),
    "external_url": ([T, "--config.analyzer.backend=external", "--config.analyzer.external.base_url=notaurl"],
                     "config error: config.analyzer.external.base_url='notaurl' is not an http(s) URL"),
    "external_key": ([T, "--config.analyzer.backend=external", "--config.analyzer.external.api_key_env=SEED_NO_SUCH_KEY"],
                     "config error: environment variable 'SEED_NO_SUCH_KEY' (analyzer.external.api_key_env) is not set"),
    "analysis_window": ([T, "--config.analyzer.start_update=5", "--config.analyzer.stop_update=2"],
                        "config error: config.analyzer.stop_update=2 must be < 0 (never stop) or after"),
    "sampler_dtype": ([T, "--config.sampler.dtype=float8"], "config error: config.sampler.dtype='float8' is not allowed"),
    "no_repeat_ngram": ([T, "--config.analyzer.no_repeat_ngram=-2"],
                        "config error: config.analyzer.no_repeat_ngram=-2 must be >= 0"),
    "opd_coef": ([T, "--config.objectives.opd_coef=-1.0"], "config error: config.objectives.opd_coef=-1.0 must be >= 0"),
    "eval_temperatures": ([T, "--config.eval.temperatures=(-1.0,)"], "config error: config.eval.temperatures=(-1.0,)"),
    "self_play": ([T, "--config.warmstart.self_play_rollouts=-1", "--config.warmstart.before_rl=True"],
                  "config error: config.warmstart.self_play_rollouts=-1 must be >= 0"),
    "micro_batch": ([T, "--config.learner.micro_batch_size=512"], "config error: config.learner.minibatch_size=16 must be a multiple"),
    "top_p": ([T, "--config.rollout.top_p=1.5"], "config error: config.rollout.top_p=1.5 must be in (0, 1]"),
    "frame_pixels": ([T, "--config.model.frame_pixels=(65536,100)"],
                     "config error: config.model.frame_pixels=(65536, 100) must be (min, max) pixel counts"),
    "action_list": ([T, "--config.templates.action_list=bullets"],
                    "config error: config.templates.action_list='bullets' is not allowed"),
    "distributed": ([T, "--config.distributed.mode=nope"], "multi-host error: distributed.mode must be 'auto', 'on' or 'off'"),
    "workdir_is_a_file": ([T, "--workdir={tmp}/file"], "workdir error: workdir '{tmp}/file' is not usable"),
    "sft_records": ([T, "--config.stage=sft", "--config.sft.data=/nonexistent.jsonl"],
                    "sft error: no SFT records at '/nonexistent.jsonl'"),
    "eval_draws": ([T, "--config.eval.draws=128", "--config.eval.max_tasks=8"],
                   "config error: config.eval.draws=128 (tasks drawn with replacement) and config.eval.max_tasks=8"),
    "faults_plan": ([T, "--config.faults.plan=boom@x"], "config error: config.faults.plan item 'boom@x': want kind@update"),
    "annotate_input": ([T, "--config.stage=annotate", "--config.annotate.input=/nonexistent.jsonl"],
                       "annotate error: no trajectory file '/nonexistent.jsonl'"),
}


def _run(args, tmp_path):
  """(exit status, stderr) of seed_jax.main on `args`; the workdir is a fresh folder unless the case names one."""
  (tmp_path / "file").write_text("")
  args = [a.replace("{tmp}", str(tmp_path)) for a in args]
  if not any(a.startswith("--workdir=") for a in args):
    args.append(f"--workdir={tmp_path / 'run'}")
  env = {k: v for k, v in os.environ.items() if k != "SEED_NO_SUCH_KEY"}
  env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  res = subprocess.run([sys.executable, "-m", "seed_jax.main", *args], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
  return res.returncode, res.stderr


def _check(name, start, rc, stderr, tmp_path):
  start = start.replace("{tmp}", str(tmp_path))
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert rc == 1, f"{name}: {stderr}"
  assert "Traceback" not in stderr and len(lines) == 1, f"{name}: {stderr}"
  assert lines[0].startswith(start), f"{name}: {stderr}"
  run = tmp_path / "run"  # nothing a later good run in the same workdir would trip on
  assert not run.exists() or not any(p.is_file() for p in run.rglob("*")), f"{name}: {sorted(run.rglob('*'))}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_build_time_value_is_one_config_error_line(case, tmp_path):
  args, start = CASES[case]
  _check(case, start, *_run(args, tmp_path), tmp_path)


@pytest.mark.slow  # 32 subprocesses, two at a time
def test_every_bad_input_of_the_table_is_one_line_naming_it(tmp_path):
  assert len(CASES) + len(MORE) >= 25
  folders = {name: tmp_path / name for name in MORE}
  for f in folders.values():
    f.mkdir()
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(MORE, pool.map(lambda n: _run(MORE[n][0], folders[n]), MORE)))
  for name, (rc, stderr) in results.items():
    _check(name, MORE[name][1], rc, stderr, folders[name])
