"""The skill sources reach the re-score and the loss (oracle, shuffled control, policy), and one update from the
same state on the same samples: the OPD arm's weights differ from GRPO's, and equal them at OPD weight 0."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax import analyzers, paired, pipeline, runtime, shares, skills, templates
from seed_jax import update as update_lib
from seed_jax.batch import collect_samples
from seed_jax.infra.metrics import PhaseTimer

from configs import textworld_express as twx_config
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
  c = twx_config.get_config("")
  c.model.path, c.warmstart.before_rl, c.analyzer.enabled = tiny_model_dir, False, True
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 3, 2, 8
  c.env.max_steps, c.model.max_prompt_tokens = 2, 512
  c.analyzer.max_new_tokens, c.analyzer.max_prompt_tokens = 8, 1024
  c.learner.minibatch_size, c.learner.micro_batch_size, c.learner.lr = 16, 4, 1e-3
  c.analyzer.teacher_metrics = False
  templates.use(c.templates)
  rt = runtime.build(c)
  played = pipeline.play(rt, rt.init_params, 0, PhaseTimer(progress=False))
  yield rt, played
  rt.close()


def _rescored(rt, analysis, played):
  samples = collect_samples(played.good, analysis.skills, rt.tokenizer, rt.cfg.model.max_prompt_tokens)
  old, skill, _ = pipeline.rescore_samples(rt, rt.init_params, samples, with_skills=True)
  return samples, old, skill


@pytest.mark.parametrize("source", ["oracle", "oracle-shuffled"])
def test_gold_path_sources_reach_the_rescore(setup, source):
  rt, played = setup
  src = dataclasses.replace(rt, cfg=paired.source_config(rt.cfg, source))
  analysis, m = pipeline.self_analysis(src, rt.init_params, played, PhaseTimer(progress=False), None)
  assert m["analysis/parse_rate"] > 0
  samples, old, skill = _rescored(src, analysis, played)
  rows = np.flatnonzero(samples.opd_mask_N)
  assert rows.size
  for i in rows:
    text = skills.augment_prompt("", analysis.skills[samples.traj_index_N[i]])
    assert rt.tokenizer.decode(samples.skill_prompts[i]).count(text.strip()[:40]) == 1
    assert not np.array_equal(old[i], skill[i])  # the skill context was scored, not the plain one reused
  if source == "oracle-shuffled":  # every skill is another task's
    oracle = pipeline.self_analysis(dataclasses.replace(rt, cfg=paired.source_config(rt.cfg, "oracle")),
                                    rt.init_params, played, PhaseTimer(progress=False), None)[0]
    tasks = [t.task.task_id for t in played.good]
    by_task = {}
    for k, s in enumerate(oracle.skills):
      by_task.setdefault(tasks[k], set()).add(s)
    moved = [s for s in analysis.skills if s is not None]
    assert moved
    for k, s in enumerate(analysis.skills):  # each comes from another task's oracle skills
      assert s is None or any(s in v for t, v in by_task.items() if t != tasks[k])


def test_policy_backend_replies_reach_the_rescore(setup):
  rt, played = setup
  analysis, _ = pipeline.self_analysis(rt, rt.init_params, played, PhaseTimer(progress=False), None)
  assert len(analysis.replies) == len(played.good)  # the policy decoded one reply per trajectory
  # The tiny random policy writes no JSON; a policy that does goes through the same parse and re-score:
  reply = skills.format_skill_json("The agent looked around.", "Open the door before you go east.")
  backend = analyzers.PolicyAnalyzer(lambda texts: [reply] * len(texts))
  forced = skills.analyze_trajectories(backend, played.good, rt.cfg.analyzer)
  samples, old, skill = _rescored(rt, forced, played)
  assert samples.opd_mask_N.all() and all(not np.array_equal(o, s) for o, s in zip(old, skill))


def test_one_update_seed_differs_from_grpo_and_equals_it_at_weight_zero(setup):
  rt, played = setup
  oracle = pipeline.self_analysis(dataclasses.replace(rt, cfg=paired.source_config(rt.cfg, "oracle")),
                                  rt.init_params, played, PhaseTimer(progress=False), None)[0]
  assert any(oracle.skills)
  out = {}
  for arm in (paired.Arm("grpo", "none", None, 0.0), paired.Arm("w0", "gated", "oracle", 0.0),
              paired.Arm("w1", "gated", "oracle", 1.0)):
    ac = paired.arm_config(rt.cfg, arm)
    learner = dataclasses.replace(rt, cfg=ac, **runtime.learner(ac, rt.spec, rt.init_params, *runtime.learner_plan(ac)))
    state = update_lib.init_state(jax.tree.map(jnp.copy, rt.init_params), learner.optimizer)
    state, m = pipeline.learn(learner, state, played, None if arm.source is None else oracle, played.metrics,
                              PhaseTimer(progress=False), None)
    out[arm.name] = (jax.tree.leaves(jax.device_get(state.params)), m)
  assert out["w1"][1]["update/opd_tokens"] > 0 and out["w0"][1]["update/opd_tokens"] > 0
  grpo, w0, w1 = (out[k][0] for k in ("grpo", "w0", "w1"))
  for a, b in zip(grpo, w0):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=1e-7)
  assert max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)))) for a, b in zip(grpo, w1)) > 1e-5


def _one_step_by_pi_old_source(rt, played, analysis, teacher_metrics=False):
  """One update of the OPD arm from the initial weights on `played` with these skills, π_old re-scored
  (rescore.old_logps="rescore") and taken by the update ("update"): each one's (parameters, metrics, the
  positions the re-score computed)."""
  out = []
  for mode in ("rescore", "update"):
    ac = paired.arm_config(rt.cfg, paired.Arm("w1", "gated", "oracle", 1.0))
    ac.rescore.old_logps, ac.analyzer.teacher_metrics = mode, teacher_metrics
    learner = dataclasses.replace(rt, cfg=ac, **runtime.learner(ac, rt.spec, rt.init_params,
                                                                *runtime.learner_plan(ac)))
    state = update_lib.init_state(jax.tree.map(jnp.copy, rt.init_params), learner.optimizer)
    before = learner.rescorer.tokens.copy()
    state, m = pipeline.learn(learner, state, played, analysis, played.metrics, PhaseTimer(progress=False), None)
    out.append((jax.tree.leaves(jax.device_get(state.params)), m, learner.rescorer.tokens - before))
  return out

def test_pi_old_from_the_update_equals_pi_old_rescored_in_a_one_step_update(setup):
  """rescore.old_logps="update": with every step-sample in one optimizer step, the update takes π_old's
  log-probs from its own forward (stop-gradient) instead of a re-score of the ordinary context; the step is the
  re-scored one's, with skills (the skill context still re-scored) and without (its stand-in masked out)."""
  rt, played = setup
  oracle = pipeline.self_analysis(dataclasses.replace(rt, cfg=paired.source_config(rt.cfg, "oracle")),
                                  rt.init_params, played, PhaseTimer(progress=False), None)[0]
  assert any(oracle.skills) and len(shares.step_keys(played.good)) <= rt.cfg.learner.minibatch_size
  for skills_now in (oracle, None):
    (p_r, m_r, t_r), (p_u, m_u, t_u) = _one_step_by_pi_old_source(rt, played, skills_now)
    assert m_u["rescore/old_logps_from_update"] == 1.0 and m_r["rescore/old_logps_from_update"] == 0.0
    assert t_u.response_real < t_r.response_real  # one context fewer re-scored
    np.testing.assert_allclose(m_u["update/loss"], m_r["update/loss"], rtol=1e-5, atol=1e-7)
    assert m_u["update/ratio_max"] == 1.0  # π_θ over itself, exactly
    for a, b in zip(p_r, p_u):
      np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(a, np.float32), rtol=0, atol=1e-6)
    moved = max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
                for a, b in zip(jax.tree.leaves(jax.device_get(rt.init_params)), p_u))
    assert moved > 1e-4  # the step moved the weights: equal steps are not both zero


def test_teacher_metrics_read_pi_old_on_the_skill_rows_and_the_update_still_takes_its_own(setup):
  """With the teacher metrics on, π_old is needed before the update, but only where a row has a skill: in a
  one-step update (rescore.old_logps="update") it is re-scored on those rows alone and the update takes its own.
  The metrics and the step equal those of a re-score of every row."""
  rt, played = setup
  oracle = pipeline.self_analysis(dataclasses.replace(rt, cfg=paired.source_config(rt.cfg, "oracle")),
                                  rt.init_params, played, PhaseTimer(progress=False), None)[0]
  oracle.parses = [p if k % 2 else dataclasses.replace(p, ok=False) for k, p in enumerate(oracle.parses)]  # half
  samples = collect_samples(played.good, oracle.skills, rt.tokenizer, rt.cfg.model.max_prompt_tokens)
  n, n_skill = len(samples), int(samples.opd_mask_N.sum())
  assert 0 < n_skill < n and rt.family.has_gold_paths
  (p_r, m_r, t_r), (p_u, m_u, t_u) = _one_step_by_pi_old_source(rt, played, oracle, teacher_metrics=True)
  assert m_u["rescore/old_logps_from_update"] == 1.0 and m_u["update/ratio_max"] == 1.0
  assert t_r.rows_real - t_u.rows_real == n - n_skill  # π_old on the rows with a skill only
  teacher = sorted(k for k in m_r if k.startswith("teacher/"))
  assert teacher and m_r["teacher/rows"] == n_skill
  for k in teacher:
    np.testing.assert_allclose(m_u[k], m_r[k], rtol=1e-5, atol=1e-6, err_msg=k)
  np.testing.assert_allclose(m_u["update/loss"], m_r["update/loss"], rtol=1e-5, atol=1e-7)
  for a, b in zip(p_r, p_u):
    np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(a, np.float32), rtol=0, atol=1e-6)
