"""The experiment's paired statistics against hand-computed values."""
import math

import pytest

from seed_jax import paired_stats as ps


def test_mcnemar_p_is_the_exact_two_sided_binomial():
  assert ps.mcnemar_p(7, 1) == 2 * (1 + 8) / 2 ** 8 == 0.0703125  # 2 * sum_{k<=1} C(8, k) / 2^8
  assert ps.mcnemar_p(1, 7) == 0.0703125
  assert ps.mcnemar_p(5, 1) == 2 * (1 + 6) / 2 ** 6 == 0.21875
  assert ps.mcnemar_p(10, 0) == 2 / 2 ** 10
  assert ps.mcnemar_p(3, 3) == 1.0  # 2 * 42/64 > 1: capped
  assert ps.mcnemar_p(0, 0) == 1.0  # no discordant pair: no evidence


def test_mcnemar_counts_only_discordant_pairs():
  pairs = [(True, False)] * 7 + [(False, True)] + [(True, True)] * 4 + [(False, False)] * 3
  assert ps.mcnemar(pairs) == ps.McNemar(b=7, c=1, p=0.0703125)


def test_mean_se_over_seeds_and_curves():
  m, se = ps.mean_se([0.1, 0.3, 0.2])
  assert m == pytest.approx(0.2) and se == pytest.approx(0.1 / math.sqrt(3))  # sd 0.1 with ddof 1
  m, se = ps.mean_se([[0.0, 1.0], [0.5, 1.0]])
  assert m.tolist() == [0.25, 1.0] and se.tolist() == pytest.approx([0.25, 0.0])
  assert ps.mean_se([0.4]) == (0.4, 0.0)
  assert all(math.isnan(v) for v in ps.mean_se([]))


def test_paired_differences_over_shared_seeds():
  assert ps.paired_differences({0: 0.75, 1: 0.5, 2: 1.0}, {0: 0.25, 1: 0.5, 3: 0.1}) == {0: 0.5, 1: 0.0}


def _row(split, temperature, task, success, termination="done"):
  return dict(split=split, temperature=temperature, task_id=f"t{task}", index=task, success=success,
              termination=termination, panel=split)


def test_outcomes_per_panel_leave_env_errors_out():
  rows = [_row("eval", 0.0, 0, True), _row("eval", 0.0, 1, False), _row("eval", 0.4, 0, False),
          _row("eval", 0.4, 1, True, "env_error")]
  out = ps.outcomes(rows)
  assert out == {("eval", 0.0): {("t0", 0): True, ("t1", 1): False}, ("eval", 0.4): {("t0", 0): False}}
  assert list(out) == [("eval", 0.0), ("eval", 0.4)]  # the dump's order: first temperature first
  assert ps.success_rate(out[("eval", 0.0)]) == 0.5 and math.isnan(ps.success_rate({}))


def test_pair_episodes_pools_seeds_and_matches_episodes():
  arm = {0: {"a": True, "b": True}, 1: {"a": False, "c": True}, 2: {"a": True}}
  base = {0: {"a": False, "b": True}, 1: {"a": True}}  # seed 2 and episode (1, "c") have no partner
  assert sorted(ps.pair_episodes(arm, base)) == sorted([(True, False), (True, True), (False, True)])


def test_first_divergence():
  assert ps.first_divergence({1: 5, 2: 6, 3: 7}, {1: 5, 2: 9, 3: 8}) == (2, 3)
  assert ps.first_divergence({1: 5, 2: 6}, {1: 5, 2: 6, 3: 1}) == (None, 2)  # update 3: one run only
  assert ps.first_divergence({1: math.nan, 2: 6}, {1: 4, 2: 6}) == (None, 1)  # NaN / None: not measured
  assert ps.first_divergence({1: None}, {1: 4}) == (None, 0)
  big = 2 ** 60 + 1  # integers compare exactly, never through floats
  assert ps.first_divergence({1: big}, {1: big - 1}) == (1, 1)
