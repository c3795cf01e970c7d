"""Every formula in seed_jax.advantages against numbers worked out by hand."""
import math

import numpy as np
import pytest

from configs import base
from seed_jax import advantages
from seed_jax.envs.base import Step, Task, Trajectory

E = 1e-6  # the σ epsilon


def close(a, b, tol=1e-6):
  np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


# ----------------------------------------------- GRPO -----------------------------------------------

def test_penalized_scores():
  close(advantages.penalized_scores(np.array([10., 10., 0.]), np.array([False, True, True]), 0.1), [10., 9.9, -0.1])


def test_grpo_step_vs_trajectory_statistics_differ():
  # Group "a": trajectory 0 has 2 steps with R=10, trajectory 1 has 1 step with R=0.
  scores = np.array([10., 10., 0.])
  groups, trajs = np.array(["a", "a", "a"]), np.array([0, 0, 1])
  # Step-samples: μ = 20/3, unbiased σ² = ((10/3)²·2 + (20/3)²)/2 = 100/3, σ = 5.773503.
  close(advantages.grpo_step_advantages(scores, groups, "mean_std_norm"),
        [(10 / 3) / (5.7735027 + E), (10 / 3) / (5.7735027 + E), -(20 / 3) / (5.7735027 + E)])
  close(advantages.grpo_step_advantages(scores, groups, "mean_std_norm"), [0.5773502, 0.5773502, -1.1547005])
  # Trajectories: returns {10, 0}: μ = 5, population σ = 5 → ±5/(5 + 1e-6), broadcast to each step.
  close(advantages.grpo_trajectory_advantages(scores, scores, groups, trajs, "mean_std_norm"),
        [0.9999998, 0.9999998, -0.9999998])
  close(advantages.grpo_step_advantages(scores, groups, "mean_norm"), [10 / 3, 10 / 3, -20 / 3])
  close(advantages.grpo_trajectory_advantages(scores, scores, groups, trajs, "mean_norm"), [5., 5., -5.])


def test_grpo_trajectory_variant_keeps_penalty_in_numerator():
  # Step 1 of trajectory 0 is invalid: score 9.9; statistics still use R(τ) = {10, 0}.
  returns = np.array([10., 10., 0.])
  scores = advantages.penalized_scores(returns, np.array([False, True, False]), 0.1)
  close(advantages.grpo_trajectory_advantages(scores, returns, np.zeros(3), np.array([0, 0, 1]), "mean_std_norm"),
        [5 / (5 + E), 4.9 / (5 + E), -5 / (5 + E)])


def test_grpo_group_of_one_and_all_equal():
  # Group 7: one sample (μ=0, σ=1). Group 8: two steps of one trajectory, equal scores.
  scores, groups, trajs = np.array([10., 10., 10.]), np.array([7, 8, 8]), np.array([0, 0, 0])
  close(advantages.grpo_step_advantages(scores, groups, "mean_std_norm"), [10 / (1 + E), 0., 0.])
  # Per trajectory both groups hold one trajectory: μ=0, σ=1.
  close(advantages.grpo_trajectory_advantages(scores, scores, groups, trajs, "mean_std_norm"), [10 / (1 + E)] * 3)
  close(advantages.grpo_step_advantages(np.array([10.]), np.array([0]), "mean_norm"), [10.])
  # All-equal rewards in a group of 4 trajectories: A = 0 exactly, no NaN.
  close(advantages.grpo_trajectory_advantages(np.full(4, 3.), np.full(4, 3.), np.zeros(4), np.arange(4),
                                              "mean_std_norm"), [0.] * 4)
  close(advantages.grpo_step_advantages(np.zeros(5), np.zeros(5), "mean_std_norm"), [0.] * 5)


def test_grpo_bad_input():
  with pytest.raises(ValueError, match="norm_mode"):
    advantages.grpo_step_advantages(np.ones(2), np.zeros(2), "std")
  with pytest.raises(ValueError, match="differ in length"):
    advantages.grpo_step_advantages(np.ones(3), np.zeros(2), "mean_norm")
  with pytest.raises(ValueError, match="constant within each trajectory"):
    advantages.grpo_trajectory_advantages(np.ones(2), np.array([1., 2.]), np.zeros(2), np.zeros(2), "mean_norm")


# ----------------------------------------------- GiGPO -----------------------------------------------

def _traj(group, tid, obs, rewards, valid=None):
  valid = valid or [True] * len(obs)
  steps = [Step("p", [1], "r", [2], [-0.5], o, "a", v, reward=r) for o, r, v in zip(obs, rewards, valid)]
  return Trajectory(Task(f"t{group}", "train", "x", {}), group, tid, steps, episode_return=float(sum(rewards)))


# Group 1: τ0 start→kitchen→fridge (rewards 0,0,10), τ1 start→hall→kitchen→sink (all 0), τ2 start→kitchen (1,3).
# Group 2: τ0 sees "start" too, but anchor groups never cross task groups.
GIGPO_TRAJS = [
    _traj(1, 0, ["start", "kitchen", "fridge"], [0., 0., 10.]),
    _traj(1, 1, ["start", "hall", "kitchen", "sink"], [0., 0., 0., 0.]),
    _traj(1, 2, ["start", "kitchen"], [1., 3.]),
    _traj(2, 0, ["start"], [0.]),
]


def test_discounted_returns():
  s = advantages.StepSamples.from_trajectories(GIGPO_TRAJS)
  # γ = 0.5: τ0 [0 + .5·(0 + .5·10), 0 + .5·10, 10] = [2.5, 5, 10]; τ2 [1 + .5·3, 3] = [2.5, 3].
  close(advantages.discounted_returns(s.rewards_N, s.group_ids_N, s.traj_ids_N, s.step_idx_N, 0.5),
        [2.5, 5., 10., 0., 0., 0., 0., 2.5, 3., 0.])
  close(advantages.discounted_returns(np.array([0., 0., 10.]), np.zeros(3), np.zeros(3), np.arange(3), 0.95),
        [9.025, 9.5, 10.])
  # Steps may come in any order; returns follow the step index, not the row order.
  close(advantages.discounted_returns(np.array([10., 0.]), np.zeros(2), np.zeros(2), np.array([1, 0]), 0.5), [10., 5.])
  with pytest.raises(ValueError, match="step_idx_N"):
    advantages.discounted_returns(np.ones(2), np.zeros(2), np.zeros(2), np.array([0, 0]), 0.5)
  with pytest.raises(ValueError, match="step_idx_N"):
    advantages.discounted_returns(np.ones(2), np.zeros(2), np.zeros(2), np.array([0, 2]), 0.5)


def test_anchor_groups():
  s = advantages.StepSamples.from_trajectories(GIGPO_TRAJS)
  # start(g1)=0, kitchen(g1)=1, fridge=2, hall=3, sink=4, start(g2)=5.
  np.testing.assert_array_equal(advantages.anchor_groups(s.observations, s.group_ids_N, 1.0),
                                [0, 1, 2, 0, 3, 1, 4, 0, 1, 5])
  obs = ["you are in the kitchen.", "you are in the kitchen!", "a dark cellar"]
  np.testing.assert_array_equal(advantages.anchor_groups(obs, np.zeros(3), 1.0), [0, 1, 2])
  np.testing.assert_array_equal(advantages.anchor_groups(obs, np.zeros(3), similarity=0.9), [0, 0, 1])
  with pytest.raises(ValueError, match="similarity"):
    advantages.anchor_groups(obs, np.zeros(3), similarity=0.0)


def test_gigpo_step_and_combined_advantages():
  s = advantages.StepSamples.from_trajectories(GIGPO_TRAJS)
  ret = advantages.discounted_returns(s.rewards_N, s.group_ids_N, s.traj_ids_N, s.step_idx_N, 0.5)
  anchor_N = advantages.anchor_groups(s.observations, s.group_ids_N, 1.0)
  step_adv = advantages.gigpo_step_advantages(ret, anchor_N, "mean_std_norm")
  # "start" (g1) returns {2.5, 0, 2.5}: μ = 5/3, σ² = (2·(5/6)² + (5/3)²)/2 = 25/12, σ = 1.4433757.
  # "kitchen" returns {5, 0, 3}: μ = 8/3, σ² = ((7/3)² + (8/3)² + (1/3)²)/2 = 57/9, σ = 2.5166115.
  # fridge, hall, sink and start (g2) are singletons: 0.
  a, b = 1.4433757 + E, 2.5166115 + E
  expect_S = [(5 / 6) / a, (7 / 3) / b, 0., -(5 / 3) / a, 0., -(8 / 3) / b, 0., (5 / 6) / a, (1 / 3) / b, 0.]
  close(step_adv, expect_S)
  close(step_adv[:3], [0.5773502, 0.9271726, 0.])
  # A^E over step-samples of group 1: scores 10×3, 0×4, 4×2 → μ = 38/9, σ² = (3(10−μ)² + 4μ² + 2(4−μ)²)/8.
  mu = 38 / 9
  sd = math.sqrt((3 * (10 - mu) ** 2 + 4 * mu ** 2 + 2 * (4 - mu) ** 2) / 8)
  close(sd, 4.6308147)
  ae = {10.: (10 - mu) / (sd + E), 0.: -mu / (sd + E), 4.: (4 - mu) / (sd + E)}
  expect_E = [ae[10.]] * 3 + [ae[0.]] * 4 + [ae[4.]] * 2 + [0.]  # group 2: one sample, μ=0, σ=1, score 0
  cfg = base.get_base().objectives
  cfg.adv_estimator, cfg.gigpo_gamma, cfg.gigpo_weight = "gigpo", 0.5, 2.0
  close(advantages.compute_advantages(s, cfg), np.array(expect_E) + 2.0 * np.array(expect_S))
  cfg.adv_estimator = "grpo"
  close(advantages.compute_advantages(s, cfg), expect_E)


def test_compute_advantages_trajectory_stats_with_penalty():
  trajs = [_traj(0, 0, ["o", "o"], [0., 10.], valid=[False, True]), _traj(0, 1, ["o"], [0.])]
  cfg = base.get_base().objectives
  cfg.grpo_stats = "trajectory"
  # Returns {10, 0}: μ = 5, σ = 5; the invalid step scores 10 − 0.1.
  close(advantages.compute_advantages(advantages.StepSamples.from_trajectories(trajs), cfg),
        [4.9 / (5 + E), 5 / (5 + E), -5 / (5 + E)])
  cfg.adv_estimator = "ppo"
  with pytest.raises(ValueError, match="adv_estimator"):
    advantages.compute_advantages(advantages.StepSamples.from_trajectories(trajs), cfg)
