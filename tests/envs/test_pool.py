"""Pool faults on real TextWorldExpress JVMs: killed and hung workers, shutdown with no survivors."""
import os
import pickle
import signal
import time

import pytest

from envs_helpers import live_processes_in_groups, wait_until_gone
from configs import textworld_express as twx_config
from seed_jax.envs import _MODULES, get_family
from seed_jax.envs import textworld_express as twx
from seed_jax.envs.base import EnvError, Observation, StepResult
from seed_jax.envs.pool import EnvPool, EnvStartError


@pytest.fixture(scope="module")
def cfg():
  return twx_config.env_config()


@pytest.fixture(scope="module")
def tasks(cfg):
  return twx.task_panel(cfg, "eval")[:2]


def test_every_family_pickles_by_reference():
  # The pool sends the family to each spawned worker; its functions must resolve to the module's own.
  for name in _MODULES:
    family = get_family(name)
    copy = pickle.loads(pickle.dumps(family))
    assert copy == family and copy.name == name
    assert all(getattr(copy, f) is getattr(family, f) for f in ("make_env", "tasks", "render_prompt", "parse_action"))


def _jvms(pgids):
  return [p for p in live_processes_in_groups(pgids) if "java" in p[1]]


@pytest.mark.slow
def test_killed_worker_returns_error_then_serves_again(cfg, tasks):
  pool = EnvPool(twx.FAMILY, cfg, num_envs=2)
  first_groups = set(pool.worker_pids())
  assert len(_jvms(first_groups)) == 2  # each worker owns one simulator JVM in its process group
  obs = pool.reset(tasks)
  assert all(isinstance(o, Observation) for o in obs)
  pool.step({0: "look around", 1: "look around"})

  victim = pool.worker_pids()[1]
  os.kill(victim, signal.SIGKILL)  # mid-episode
  out = pool.step({0: "inventory", 1: "inventory"})
  assert isinstance(out[0], StepResult) and out[0].observation.text.startswith("Inventory")
  assert isinstance(out[1], EnvError) and out[1].kind == "crashed"
  assert pool.restarts == 1 and pool.worker_pids()[1] != victim
  assert wait_until_gone({victim}) == []  # the dead worker's JVM went with its process group

  again = pool.step({1: "look around"})[1]
  assert isinstance(again, EnvError) and again.kind == "not_reset"
  [obs1] = pool.reset([tasks[1]], indices=[1])
  assert obs1 == obs[1]  # a fresh worker restores the identical start
  for action in pool.gold_actions(1):
    res = pool.step({1: action})[1]
  assert res.reward == 10.0 and res.done

  groups = first_groups | set(pool.worker_pids())
  pool.close()
  assert wait_until_gone(groups) == []
  with pytest.raises(RuntimeError, match="closed"):
    pool.step({0: "look around"})


@pytest.mark.slow
def test_hung_worker_times_out_and_is_replaced(cfg, tasks):
  with EnvPool(twx.FAMILY, cfg, num_envs=1, timeout_s=1.5) as pool:
    pool.reset(tasks[:1])
    stuck = pool.worker_pids()[0]
    os.kill(stuck, signal.SIGSTOP)  # the worker stops answering but stays alive
    t0 = time.monotonic()
    res = pool.step({0: "look around"})[0]
    waited = time.monotonic() - t0
    assert isinstance(res, EnvError) and res.kind == "timeout"
    assert 1.4 < waited < 10.0
    assert wait_until_gone({stuck}) == []
    [obs] = pool.reset(tasks[:1])
    assert isinstance(obs, Observation)
    assert isinstance(pool.step({0: "look around"})[0], StepResult)
    groups = set(pool.worker_pids()) | {stuck}
  assert wait_until_gone(groups) == []


@pytest.mark.slow
def test_exception_inside_with_block_closes_everything(cfg, tasks):
  with pytest.raises(KeyboardInterrupt):
    with EnvPool(twx.FAMILY, cfg, num_envs=2) as pool:
      groups = set(pool.worker_pids())
      pool.reset(tasks)
      assert len(_jvms(groups)) == 2
      raise KeyboardInterrupt  # what Ctrl-C raises in the driver
  assert wait_until_gone(groups) == []


@pytest.mark.slow
def test_env_that_cannot_start_fails_the_pool_loudly(cfg):
  broken = cfg.copy_and_resolve_references()
  del broken["success_reward"]
  with pytest.raises(EnvStartError, match=r"(?s)env worker 0 failed to start: make_env failed.*success_reward") as e:
    EnvPool(twx.FAMILY, broken, num_envs=1)
  assert "\n" not in e.value.line and "success_reward" in e.value.line, e.value.line  # main's one line
  assert e.value.line.startswith("env worker 0 failed to start: "), e.value.line


@pytest.mark.slow
def test_bad_arguments_are_rejected(cfg, tasks):
  with pytest.raises(ValueError, match="num_envs"):
    EnvPool(twx.FAMILY, cfg, num_envs=0)
  with EnvPool(twx.FAMILY, cfg, num_envs=1) as pool:
    with pytest.raises(ValueError, match=r"env indices \[3\] out of range"):
      pool.step({3: "look around"})
    with pytest.raises(ValueError, match=r"2 tasks for indices \[0\]"):
      pool.reset(tasks, indices=[0])
    with pytest.raises(ValueError, match="one task per distinct index"):
      pool.reset(tasks, indices=[0, 0])
    assert pool.step({0: "look around"})[0].kind == "not_reset"
