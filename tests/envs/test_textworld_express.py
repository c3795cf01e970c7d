"""TextWorldExpress through the pool: gold paths, wrong actions, identical group starts, fixed panels."""
import dataclasses

import pytest

from envs_helpers import panel_in_subprocess
from configs import textworld_express as twx_config
from seed_jax.envs import get_family
from seed_jax.envs import textworld_express as twx
from seed_jax.envs.base import EnvError, Task
from seed_jax.envs.pool import EnvPool, play_gold

pytestmark = pytest.mark.slow  # TextWorldExpress's JVM


@pytest.fixture(scope="module")
def cfg():
  return twx_config.env_config()


@pytest.fixture(scope="module")
def pool(cfg):
  with EnvPool(twx.FAMILY, cfg, num_envs=4) as p:
    yield p


def test_get_family():
  assert get_family("textworld_express") is twx.FAMILY
  with pytest.raises(ValueError, match="unknown environment 'nope'"):
    get_family("nope")


def test_seed_folds_match_the_simulator():
  from textworld_express import TextWorldExpressEnv
  sim = TextWorldExpressEnv()
  try:
    for game in twx.GAMES:
      assert sim.server.load(game, "") == ""
      assert list(sim.server.getSeedsTrain()) == list(twx.SEED_FOLDS["train"])
      assert list(sim.server.getSeedsDev()) == list(twx.SEED_FOLDS["dev"])
      assert list(sim.server.getSeedsTest()) == list(twx.SEED_FOLDS["test"])
  finally:
    sim.close()


def test_gold_path_of_every_game_succeeds(pool, cfg):
  all_games = cfg.copy_and_resolve_references()
  all_games.games = ",".join(twx.GAMES)
  tasks = [twx.task_panel(all_games, "eval")[k * 50] for k in range(len(twx.GAMES))]
  assert [t.family for t in tasks] == list(twx.GAMES)
  episodes = play_gold(pool, tasks)
  for ep in episodes:
    assert ep.error is None, ep.error
    assert ep.success and ep.episode_return == 10.0, (ep.task.task_id, ep.actions)
    assert [r.reward for r in ep.results] == [0.0] * (len(ep.results) - 1) + [10.0]
    assert ep.results[-1].done and ep.results[-1].info["score"] == 1.0
  # tiny coin (2 rooms, no doors): at most look, move, take
  assert len(episodes[0].actions) <= 3 and episodes[0].actions[-1] == "take coin"


def test_wrong_action_is_answered(pool, cfg):
  task = twx.task_panel(cfg, "eval")[0]
  [obs] = pool.reset([task])
  assert obs.task_description.startswith("Your task is to search the environment and find the coin")
  res = pool.step({0: "fly to the moon"})[0]
  assert res.observation.text == "Unknown action: I'm not sure what you mean."
  assert (res.reward, res.done, res.info["success"]) == (0.0, False, False)
  assert res.observation.admissible == obs.admissible  # nothing changed
  gold = pool.gold_actions(0)
  for a in gold:
    res = pool.step({0: a})[0]
  assert res.reward == 10.0 and res.done
  after_end = pool.step({0: "look around"})[0]  # stepping a finished episode is a caller error, not a crash
  assert isinstance(after_end, EnvError) and after_end.kind == "exception"
  assert "reset first" in after_end.message


def test_group_starts_identical_and_stays_in_lockstep(pool, cfg):
  a, b = twx.task_panel(cfg, "eval")[3], twx.task_panel(cfg, "eval")[4]
  obs = pool.reset([a, a, a, b])
  assert obs[0] == obs[1] == obs[2]
  assert obs[0].admissible == sorted(obs[0].admissible)
  gold = pool.gold_actions(0)
  assert gold == pool.gold_actions(1) == pool.gold_actions(2)
  for action in ["inventory"] + gold[:-1]:
    res = pool.step({0: action, 1: action, 2: action})
    assert res[0] == res[1] == res[2]


def test_panels_are_fixed(cfg):
  eval_panel = twx.task_panel(cfg, "eval")
  assert eval_panel == twx.task_panel(twx_config.env_config(), "eval")
  assert len(eval_panel) == 50 and len(twx.task_panel(cfg, "dev")) == 50
  assert len(twx.task_panel(cfg, "train")) == 1000
  assert [t.spec["seed"] for t in eval_panel[:4]] == [20000, 20051, 20052, 20076]
  assert [t.spec["seed"] for t in twx.task_panel(cfg, "dev")[:4]] == [10022, 10042, 10058, 10064]
  assert eval_panel[0] == Task("twx/coin/test/20000", "eval", "textworld_express",
                               {"game": "coin", "params": "numLocations=2,includeDoors=0,numDistractorItems=0",
                                "seed": 20000, "fold": "test"}, "coin")
  assert [t.to_json() for t in eval_panel] == panel_in_subprocess("textworld_express", "eval", "4321")


def test_config_errors_name_the_field(cfg):
  bad = cfg.copy_and_resolve_references()
  bad.games = "coin,chess"
  with pytest.raises(ValueError, match=r"config.games=.*chess"):
    twx.task_panel(bad, "eval")
  with pytest.raises(ValueError, match="split='test'"):
    twx.task_panel(cfg, "test")


def test_bad_task_is_an_env_error_and_the_pool_recovers(pool, cfg):
  good = twx.task_panel(cfg, "eval")[0]
  bad = dataclasses.replace(good, spec=dict(good.spec, seed=5))  # a train seed in the test fold
  out = pool.reset([bad, good])
  assert isinstance(out[0], EnvError) and out[0].kind == "exception" and "seed 5 is not in fold" in out[0].message
  assert out[1].text  # the other env of the same call is fine
  again = pool.reset([good])[0]
  assert again == out[1]


COIN_4 = "numLocations=4,includeDoors=0,numDistractorItems=0"
COIN_DOORS = "numLocations=11,includeDoors=1,numDistractorItems=0"


def _coin(seed, params):
  return Task(f"twx/coin/train/{seed}", "train", "textworld_express",
              {"game": "coin", "params": params, "seed": seed, "fold": "train"}, "coin")


def test_coin_gold_path_is_the_shortest_and_the_same_on_every_reset(cfg):
  """The simulator's own coin gold path is a random walk (seed 3 of 4 rooms: 3, 17, 19, 5 steps on successive
  resets); the env's is the breadth-first shortest, the same on every reset of every env."""
  want = {(3, COIN_4): ["look around", "move south", "take coin"],
          (4, COIN_4): ["look around", "move west", "take coin"],
          (4, COIN_DOORS): ["look around", "move west", "open door to north", "move north", "open door to west",
                            "move west", "take coin"]}
  env = twx.make_env(cfg)
  try:
    for _ in range(3):
      for (seed, params), gold in want.items():
        first = env.reset(_coin(seed, params))
        assert env.gold_actions() == gold
        again = env.reset(_coin(seed, params))  # the search leaves the game at its start
        assert again == first
        results = [env.step(a) for a in gold]
        assert results[-1].done and results[-1].reward == 10.0 and not any(r.done for r in results[:-1])
  finally:
    env.close()
