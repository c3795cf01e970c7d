"""The experiment runner: 2 arms x 2 seeds x 1 update on a tiny model write the JSONL, a real PNG and the
summary; a killed experiment continues without repeating a finished run; bad arms are one clear error; the
summary's numbers, paired tables and fingerprint divergence against hand-computed values on a fake workdir."""
import json
import os
import subprocess
import sys
import time

import pytest

from seed_jax import experiment

from helpers import REPO as ROOT


def _command(model_dir, workdir, cache):
  return [sys.executable, "-m", "seed_jax.experiment", f"--config={ROOT}/configs/textworld_express.py",
          "--arms=seed,grpo", "--seeds=0,1", f"--workdir={workdir}", f"--config.model.path={model_dir}",
          "--config.warmstart.before_rl=False", "--config.train.num_updates=1", "--config.eval.every=1",
          "--config.eval.max_tasks=2", "--config.rollout.tasks_per_update=1", "--config.rollout.group_size=2",
          "--config.rollout.max_new_tokens=8", "--config.env.max_steps=2", "--config.model.max_prompt_tokens=512",
          "--config.analyzer.max_new_tokens=16", "--config.analyzer.max_prompt_tokens=1024",
          "--config.learner.minibatch_size=4", "--config.learner.micro_batch_size=4",
          f"--config.warmstart.cache_dir={cache}"]


@pytest.mark.slow  # subprocesses running the pipeline
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
      assert [r["updates"] for r in evals if (r["arm"], r["seed"]) == (arm, seed)] == [0, 1]
  png = (workdir / "curves.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
  summary = (workdir / "summary.md").read_text()
  assert "| seed | 2 |" in summary and "| grpo | 2 |" in summary
  assert "| seed | eval | 0.4 | 2 |" in summary  # paired at the one eval temperature
  assert "| 0 | seed |" in summary and "| 1 | seed |" in summary  # fingerprint divergence per seed


@pytest.mark.slow  # a subprocess
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


# The fake workdir's final evaluation (after 2 updates): per arm, seed and temperature the outcomes of tasks t0..t3
# (1 solved, 0 not, None an env error). Hand-computed from these:
#   T=0:   seed - grpo per seed +0.5, 0, +0.5: mean 1/3, s.e. sqrt(1/12)/sqrt(3) = 1/6; McNemar b=5, c=1,
#          p = 2 (C(6,0) + C(6,1)) / 2^6 = 0.21875.
#   T=0.4: +0.75, +0.25, 2/3 - 1/4 = 5/12: mean 17/36 = 0.472, s.e. 0.147; b=7, c=1 (seed 2's t3 is an env error:
#          no pair), p = 2 (1 + 8) / 2^8 = 0.0703125.
FINAL = {
    "seed": {0: {0.0: [1, 1, 1, 0], 0.4: [1, 1, 1, 1]}, 1: {0.0: [1, 1, 0, 0], 0.4: [1, 1, 0, 0]},
             2: {0.0: [1, 1, 1, 1], 0.4: [1, 1, 0, None]}},
    "grpo": {0: {0.0: [1, 0, 0, 0], 0.4: [0, 0, 0, 1]}, 1: {0.0: [0, 1, 0, 1], 0.4: [0, 0, 1, 0]},
             2: {0.0: [1, 1, 0, 0], 0.4: [0, 0, 0, 1]}},
}
# Per update 1, 2: seed 0's arms sample alike at update 1 and differ at 2; seed 1's agree; seed 2 has no fingerprint.
FINGERPRINTS = {"seed": {0: [11, 12], 1: [21, 22], 2: None}, "grpo": {0: [11, 99], 1: [21, 22], 2: None}}


def _eval_record(done, outcomes_by_t):
  """What evaluate_record writes: the first temperature's panel untagged and first, the others tagged."""
  r = {"step": done, "wall_time": 0.0}
  for i, (t, outs) in enumerate(outcomes_by_t.items()):
    good = [o for o in outs if o is not None]
    name = "eval" if i == 0 else f"eval_t{t:g}"
    r.update({f"eval/{name}/episodes": len(outs), f"eval/{name}/success": sum(good) / len(good),
              f"eval/{name}/return": 10 * sum(good) / len(good)})
  r["eval/updates_done"] = done
  return r


def _fake_workdir(root):
  for arm, seeds in FINAL.items():
    for seed, final in seeds.items():
      run = root / f"{arm}-s{seed}"
      (run / "dumps").mkdir(parents=True)
      fps = FINGERPRINTS[arm][seed]
      updates = [{"step": u, "rollout/return": 0.0, "rollout/success": 0.0,
                  **({"rollout/fingerprint": fps[u]} if fps else {})} for u in range(2)]
      start = _eval_record(0, {t: [1, 0, 0, 0] for t in final})  # the shared warm start: 0.25
      rows = [start] + updates + [_eval_record(2, final)]
      (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
      episodes = [dict(panel="eval" if t == 0.0 else f"eval_t{t:g}", split="eval", temperature=t, chunk=0, index=k,
                       task_id=f"t{k}", family="all", success=bool(o), ret=10.0 * bool(o), length=1,
                       termination="env_error" if o is None else "done", invalid=0, steps=1)
                  for t, outs in final.items() for k, o in enumerate(outs)]
      (run / "dumps" / "eval_episodes_step000002.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
      (run / experiment.DONE_FILE).write_text("{}")


def test_paired_summary_on_a_fake_workdir(tmp_path):
  _fake_workdir(tmp_path)
  experiment.write_outputs(str(tmp_path), ["seed", "grpo"], [0, 1, 2])
  text = (tmp_path / "summary.md").read_text()
  # final success of the first temperature: seed 0.75, 0.5, 1.0 (s.e. 0.25/sqrt(3)); grpo 0.25, 0.5, 0.5
  assert "| seed | 3 | 0.250 | 0.750 ± 0.144 | 2 |" in text
  assert "| grpo | 3 | 0.250 | 0.417 ± 0.083 | 2 |" in text
  greedy = "| seed | eval | 0 | 3 | s0 +0.500, s1 +0.000, s2 +0.500 | +0.333 ± 0.167 | 5 | 1 | 0.2188 |"
  warm = "| seed | eval | 0.4 | 3 | s0 +0.750, s1 +0.250, s2 +0.417 | +0.472 ± 0.147 | 7 | 1 | 0.07031 |"
  assert greedy in text and warm in text and text.index(greedy) < text.index(warm)
  assert "| 0 | seed | 2 | 2 |" in text  # first differing update, updates compared
  assert "| 1 | seed | never | 2 |" in text
  assert "| 2 | seed | - | 0 |" in text
  assert "| grpo | eval |" not in text and "| 0 | grpo |" not in text  # the baseline is not paired with itself
  rows = [json.loads(line) for line in open(tmp_path / "experiment.jsonl")]
  train = [(r["updates"], r["fingerprint"]) for r in rows if (r["kind"], r["arm"], r["seed"]) == ("train", "grpo", 0)]
  assert train == [(1, 11), (2, 99)]


def test_summary_without_dumps_or_fingerprints_keeps_the_one_table():
  ev = [dict(updates=0, success=0.2, ret=2.0)]
  text = experiment.summarize({"seed": {0: dict(eval=ev, train=[])}, "grpo": {0: dict(eval=ev, train=[])}})
  assert "McNemar" not in text and text.count("| 0 | seed | - | 0 |") == 1
