"""ScienceWorld through the pool: gold paths, wrong actions, identical group starts, fixed panels."""
import pytest

from envs_helpers import panel_in_subprocess, wait_until_gone
from configs import sciworld as sw_config
from seed_jax.envs import get_family
from seed_jax.envs import sciworld as sw
from seed_jax.envs.base import Task
from seed_jax.envs.pool import EnvPool, play_gold

pytestmark = pytest.mark.slow  # ScienceWorld's JVM


@pytest.fixture(scope="module")
def cfg():
  return sw_config.env_config()


@pytest.fixture(scope="module")
def pool(cfg):
  p = EnvPool(sw.FAMILY, cfg, num_envs=3)
  groups = set(p.worker_pids())
  yield p
  p.close()
  assert wait_until_gone(groups) == [], "a simulator process outlived the pool"


def _task(cfg, split, family, k=0):
  return [t for t in sw.task_panel(cfg, split) if t.family == family][k]


def test_variation_table_matches_the_simulator():
  from scienceworld import ScienceWorldEnv
  sim = ScienceWorldEnv("")
  try:
    assert sorted(sim.get_task_names()) == list(sw.TASK_TYPES)
    for name, (n_train, n_dev, n_test) in sw.VARIATION_SPLITS.items():
      sim.server.load(name, 0, "", False)
      assert list(sim.server.getVariationsTrain()) == list(range(n_train)), name
      assert list(sim.server.getVariationsDev()) == list(range(n_train, n_train + n_dev)), name
      assert list(sim.server.getVariationsTest()) == list(range(n_train + n_dev, n_train + n_dev + n_test)), name
  finally:
    sim.close()


def test_gold_paths_succeed_through_the_pool(pool, cfg):
  tasks = [_task(cfg, "eval_l0", "lifespan-longest-lived"), _task(cfg, "eval_l0", "find-non-living-thing"),
           _task(cfg, "eval_l2", "find-animal")]
  for ep in play_gold(pool, tasks):
    assert ep.error is None, ep.error
    assert ep.success and ep.episode_return == 10.0, (ep.task.task_id, ep.actions)
    assert ep.results[-1].info["score"] == 100 and ep.results[-1].done
    assert all(r.reward == 0.0 for r in ep.results[:-1])
    assert ep.first_observation.task_description.startswith("Your task is to")


def test_wrong_action_is_answered(pool, cfg):
  [obs] = pool.reset([_task(cfg, "eval_l0", "melt")])
  assert "agent" in obs.info["objects"] and "focus on OBJ" in obs.admissible
  assert "reset task" not in obs.admissible and "go to OBJ" in obs.admissible
  res = pool.step({0: "fly to the moon"})[0]
  assert res.observation.text == "No known action matches that input."
  assert (res.reward, res.done, res.info["success"], res.info["score"]) == (0.0, False, False, 0)
  res = pool.step({0: "abcdefghijklmnopqrstuvwxyz1234"})[0]  # what an unparsable response sends
  assert res.observation.text == "No known action matches that input." and not res.done


def test_group_starts_identical(pool, cfg):
  a, b = _task(cfg, "eval_l0", "boil"), _task(cfg, "eval_l0", "chemistry-mix")
  obs = pool.reset([a, a, b])
  assert obs[0] == obs[1] and obs[0] != obs[2]
  for action in ["look around", "open door to kitchen", "go to kitchen", "pick up thermometer"]:
    res = pool.step({0: action, 1: action})
    assert res[0] == res[1]
  assert "thermometer" in pool.step({0: "inventory"})[0].observation.text
  # a gold path asked for mid-episode is made by reloading and replaying: the episode's state is kept
  gold = pool.gold_actions(1)
  assert gold[:2] == ["open door to kitchen", "go to kitchen"] and len(gold) > 10
  assert "thermometer" in pool.step({1: "inventory"})[1].observation.text


def test_panels_are_fixed(cfg):
  sizes = {split: len(sw.task_panel(cfg, split)) for split in sw.SPLITS}
  assert sizes == {"train": 2512, "dev": 60, "eval_l0": 100, "eval_l2": 92}
  l0, l2 = sw.task_panel(cfg, "eval_l0"), sw.task_panel(cfg, "eval_l2")
  assert l0 == sw.task_panel(sw_config.env_config(), "eval_l0")
  assert [t.task_id for t in l0[:3]] == ["sciworld/boil/21", "sciworld/boil/23", "sciworld/boil/24"]
  assert l0[0] == Task("sciworld/boil/21", "eval_l0", "sciworld",
                       {"task_name": "boil", "variation": 21, "simplification": "easy"}, "boil")
  seen, unseen = {t.family for t in sw.task_panel(cfg, "train")}, {t.family for t in l2}
  assert len(seen) == 20 and unseen == set(sw_config.env_config().unseen_task_types.split(",")) and not seen & unseen
  for t in l0 + l2:  # eval variations come from the simulator's test range
    n_train, n_dev, _ = sw.VARIATION_SPLITS[t.family]
    assert t.spec["variation"] >= n_train + n_dev
  assert [t.to_json() for t in l2] == panel_in_subprocess("sciworld", "eval_l2", "999")


def test_config_errors_name_the_field(cfg):
  bad = cfg.copy_and_resolve_references()
  bad.simplification = "easy,fly"
  with pytest.raises(ValueError, match=r"config.simplification=.*fly"):
    sw.task_panel(bad, "train")
  bad = cfg.copy_and_resolve_references()
  bad.task_types = "boil,find-animal"
  with pytest.raises(ValueError, match="share.*find-animal"):
    sw.task_panel(bad, "train")
  bad.task_types = "boil,cook"
  with pytest.raises(ValueError, match=r"config.task_types: unknown task types \['cook'\]"):
    sw.task_panel(bad, "train")
  assert get_family("sciworld") is sw.FAMILY
