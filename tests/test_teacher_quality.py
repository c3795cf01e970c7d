"""Teacher-quality statistics against hand-computed values, the shuffled control, the oracle backend, the rollout
fingerprint, and the paired report's tables on a fixture."""
import json
import math

import numpy as np
import pytest

from seed_jax import analyzers, paired_report, report, sft_oracle, skills, teacher_quality
from seed_jax.envs.base import Step, Task, Trajectory


def _traj(actions, task="t0", success=False, group=0, traj=0, tokens=None):
  steps = [Step(prompt_text="", prompt_tokens=[1], response_text=a, response_tokens=tokens or [7, len(a)], logps=[],
                observation=f"obs {k}", action=a, action_valid=True) for k, a in enumerate(actions)]
  return Trajectory(task=Task(task, "train", "textworld_express", {}), group_id=group, traj_id=traj, steps=steps,
                    episode_return=1.0 if success else 0.0, success=success)


def test_gold_labels_mark_the_prefix_the_first_divergence_and_nothing_after():
  gold = ["open door", "go east", "take coin"]
  assert teacher_quality.gold_labels(_traj(["open door", "go east", "take coin"]), gold) == [1, 1, 1]
  assert teacher_quality.gold_labels(_traj(["open door", "go west", "go east", "x"]), gold) == [1, 0, -1, -1]
  assert teacher_quality.gold_labels(_traj(["open door", "go east", "take coin", "look"]), gold) == [1, 1, 1, -1]
  assert teacher_quality.gold_labels(_traj(["look"]), None) == [-1]


def test_auc_counts_pairs_with_ties_half():
  # pairs (pos > neg): 3 > 1, 3 > 2, 2 > 1, and 2 == 2 counts half: (3 + 0.5) / 4
  assert teacher_quality.auc([3.0, 2.0], [1.0, 2.0]) == pytest.approx(3.5 / 4)
  assert teacher_quality.auc([0.0], [1.0]) == 0.0
  assert math.isnan(teacher_quality.auc([], [1.0]))


def test_clustered_mean_by_hand():
  # mean 2; deviations -1, 1 (cluster a: sum 0), 2, -2 (cluster b: sum 0) -> a zero clustered s.e.
  m, lo, hi = teacher_quality.clustered_mean([1.0, 3.0, 4.0, 0.0], ["a", "a", "b", "b"])
  assert (m, lo, hi) == (2.0, 2.0, 2.0)
  # three singleton clusters: the plain s.e. with the G/(G-1) factor: sqrt(3/2 * (1 + 0 + 1)) / 3
  m, lo, hi = teacher_quality.clustered_mean([1.0, 2.0, 3.0], [0, 1, 2])
  se = math.sqrt(1.5 * 2.0) / 3
  assert m == 2.0 and lo == pytest.approx(2.0 - 1.959964 * se) and hi == pytest.approx(2.0 + 1.959964 * se)


def _row(state, gain, on_gold=1, gap=0.0, success=False, u=0, group=0, traj=0):
  return dict(u=u, task="t", group=group, traj=traj, step=0, success=success, on_gold=on_gold, gap=gap,
              gold_gain=gain, state=state)


def test_paired_by_state_pairs_state_means():
  rows = [_row("s1", 1.0), _row("s1", 3.0), _row("s2", 0.5), _row("s3", 9.0)]
  control = [_row("s1", 0.0), _row("s2", 1.5), _row("s4", 1.0)]
  mean, lo, hi, n = teacher_quality.paired_by_state(rows, control)
  # s1: 2 - 0 = 2, s2: 0.5 - 1.5 = -1 -> mean 0.5, s.e. sqrt(2 * (1.5^2 + 1.5^2)) / 2
  se = math.sqrt(2 * 4.5) / 2
  assert n == 2 and mean == 0.5 and lo == pytest.approx(0.5 - 1.959964 * se) and hi == pytest.approx(0.5 + 1.959964 * se)


def test_metrics_of_an_update_by_hand():
  rows = [_row("a", 0.4, 1, 0.3, True), _row("a", 0.2, 1, 0.1, True), _row("b", None, 0, -0.2, False),
          _row(None, None, -1, 0.5, False)]
  m = teacher_quality.metrics(rows)
  assert m["teacher/gap_success"] == pytest.approx(0.2) and m["teacher/gap_failure"] == pytest.approx(0.15)
  assert m["teacher/gap_on_gold"] == pytest.approx(0.2) and m["teacher/gap_off_gold"] == pytest.approx(-0.2)
  assert m["teacher/auc"] == 1.0 and m["teacher/gold_gain"] == pytest.approx(0.3)
  assert (m["teacher/rows"], m["teacher/on_gold"], m["teacher/off_gold"]) == (4.0, 2.0, 1.0)


def _analysis(skill_texts):
  parses = [skills.SkillParse(s, None, s is not None) for s in skill_texts]
  return skills.Analysis(parses, [""] * len(parses), [""] * len(parses))


def test_shuffled_control_gives_every_trajectory_another_tasks_skill():
  tasks = ["a", "a", "b", "b", "c", "c"]
  out = analyzers.shuffled_skills(_analysis([f"skill of {t}{k % 2}" for k, t in enumerate(tasks)]), tasks, seed=3)
  for t, s in zip(tasks, out.skills):
    assert s is not None and not s.startswith(f"skill of {t}")
  assert sorted(out.skills) == sorted(f"skill of {t}{k % 2}" for k, t in enumerate(tasks))  # a permutation
  assert out.skills == analyzers.shuffled_skills(_analysis([f"skill of {t}{k % 2}" for k, t in enumerate(tasks)]),
                                                 tasks, seed=3).skills  # seeded
  assert analyzers.shuffled_skills(_analysis(["x", "y"]), ["a", "a"], seed=0).skills == [None, None]


def test_oracle_backend_replies_are_the_gold_path_oracles():
  gold = ["open door", "go east"]
  trajs = [_traj(["open door", "go west"]), _traj(["open door", "go east"], success=True)]
  backend = analyzers.OracleAnalyzer(trajs, [gold, gold], 1.0)
  replies = backend.analyze(["p0", "p1"])
  assert replies == [sft_oracle.oracle_reply(t, gold, 1.0) for t in trajs]
  assert 'do "go east" instead of "go west"' in skills.parse_skill(replies[0]).skill
  with pytest.raises(ValueError, match="3 prompts for 2 trajectories"):
    backend.analyze(["a", "b", "c"])


def test_rollout_fingerprint_changes_with_any_sampled_token_and_not_with_order():
  a, b = _traj(["go east"], group=0), _traj(["go west"], group=1)
  assert report.fingerprint([a, b]) == report.fingerprint([b, a])
  c = _traj(["go west"], group=1, tokens=[7, 8])
  assert report.fingerprint([a, c]) != report.fingerprint([a, b])
  assert 0 <= report.fingerprint([a]) < 2**32


def test_paired_report_tables_by_hand(tmp_path):
  arms = []
  gains = {"grpo": [0.10, 0.20, 0.00], "opd-oracle-w1": [0.40, 0.50, 0.30], "opd-oracle-shuffled-w1": [0.20, 0.20, 0.10]}
  for b in range(3):
    for arm, g in gains.items():
      arms.append(dict(batch=b, arm=arm, probe_gain=g[b], margin=g[b] - gains["grpo"][b], kl=0.01, param_delta=1.0,
                       opd_tokens=10, fingerprint=255, rollout_success=0.5, rollout_invalid=0.1, episodes=16,
                       **{"parse_success/policy": 1.0, "parse_failure/policy": 0.5}))
  trows = []
  for source, gain in (("oracle", 1.0), ("oracle-shuffled", 0.25), ("policy", 0.0), ("policy-shuffled", 0.0)):
    trows += [dict(_row("s1", gain + 0.5, 1, 0.3), source=source), dict(_row("s2", gain - 0.5, 1, 0.2, traj=1), source=source),
              dict(_row("s3", None, 0, 0.25 if source == "oracle" else 0.4, traj=2), source=source)]
  with open(tmp_path / "paired.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in arms)
  with open(tmp_path / "teacher.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in trows)
  out = paired_report.write(str(tmp_path), {"probe_states": 3})
  p = out["paired"]
  assert p["opd-oracle-w1"]["margins"] == pytest.approx([0.3, 0.3, 0.3]) and p["opd-oracle-w1"]["wins"] == 3
  assert p["opd-oracle-shuffled-w1"]["mean_margin"] == pytest.approx(0.2 / 3)
  assert p["opd-oracle-w1"]["control_ratio"] == pytest.approx(0.3 / (0.2 / 3))
  t = out["teacher"]
  assert t["sources"]["oracle"]["auc"] == 0.5 and t["sources"]["oracle-shuffled"]["auc"] == 0.0  # 0.3 > 0.25 > 0.2
  assert t["contrasts"]["oracle"]["auc_diff"] == 0.5
  mean, lo, hi = t["contrasts"]["oracle"]["gain_diff"]
  assert mean == pytest.approx(0.75) and lo == pytest.approx(0.75) and hi == pytest.approx(0.75)  # both states +0.75
  assert "| opd-oracle-w1 | +0.4000, +0.5000, +0.3000 | +0.3000, +0.3000, +0.3000 | +0.3000 ± 0.0000 | 3/3 | 4.5 |" \
      in out["text"]
  png = (tmp_path / "paired.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("field, value, message", [
    ("analyzer.control", "shuffle", "analyzer.control"),
    ("analyzer.backend", "gold", "analyzer.backend"),
    ("eval.temperatures", (0.4, 0.0), "eval.temperatures"),
    ("warmstart.self_play_rollouts", -1, "warmstart.self_play_rollouts")])
def test_bad_fields_of_the_signal_experiment_are_one_line(field, value, message):
  from configs import textworld_express
  from seed_jax.config import validate
  c = textworld_express.get_config("experiment")
  c.model.path = "embedded"
  a, b = field.split(".")
  c[a][b] = value
  with pytest.raises(ValueError, match=message.replace(".", r"\.")):
    validate(c)
