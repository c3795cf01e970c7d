"""Every environment config in configs/: both variants load, validate, name a registered env whose splits
exist, and the "paper" variants carry SEED's settings (docs/algorithm.md §3, §5)."""
import importlib

import pytest

from helpers import FIXTURES, REPO
from seed_jax import config as config_lib
from seed_jax.envs import _MODULES, get_family

ENV_CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.py") if p.stem not in ("__init__", "base", "generate", "stage1", "variants",
                                                                                  "vl"))
# env -> (tasks per update B, group size G, max_steps, history_length) of the paper variant
PAPER = {
    "alfworld": (16, 8, 30, 5),
    "webshop": (16, 8, 15, 2),
    "search": (128, 8, 4, 4),
    "sokoban": (32, 8, 15, 0),
    "ezpoints": (16, 8, 8, 0),
    "sciworld": (16, 8, 30, 5),
    "textworld_express": (16, 8, 30, 5),
}
SEED_TABLE = tuple(PAPER)  # every paper variant carries SEED's model-side settings
# env -> (invalid_penalty, kl_coef, entropy_coef, norm_mode), in both variants
LOSS = {name: (0.1, 0.01, 0.001, "mean_std_norm") for name in PAPER}
LOSS["search"] = (0.01, 0.001, 0.0, "mean_std_norm")
LOSS["webshop"] = (0.1, 0.01, 0.001, "mean_norm")


def test_every_registered_env_has_a_config():
  assert ENV_CONFIGS == sorted(_MODULES) == sorted(PAPER)


def _with_data(cfg, tmp_path):
  """Points the data fields of the envs that need user data at small local data."""
  name = cfg.env.name
  if name == "alfworld":  # empty split folders: the panel is empty but the split names are checked
    for split in ("train", "valid_seen", "valid_unseen"):
      (tmp_path / "json_2.1.1" / split).mkdir(parents=True, exist_ok=True)
    cfg.env.data_dir = str(tmp_path)
  elif name == "webshop":
    # 3 human goals / 2 synthetic ones in the fixture: one of them trains
    cfg.env.data_dir = str(FIXTURES / "webshop")
    cfg.env.num_test_goals = 2 if cfg.env.human_goals else 1
  elif name == "search":
    cfg.env.train_files = cfg.env.test_files = str(FIXTURES / "search" / "questions.jsonl")
  return cfg


@pytest.mark.parametrize("name", ENV_CONFIGS)
@pytest.mark.parametrize("variant", ["", "paper"])
def test_config_loads_validates_and_names_real_splits(name, variant, tmp_path):
  module = importlib.import_module(f"configs.{name}")
  cfg = module.get_config(variant)
  if variant == "paper":
    assert cfg.model.path == ""  # the paper's checkpoint must be given on the command line
    cfg.model.path = "embedded"
    assert (cfg.rollout.tasks_per_update, cfg.rollout.group_size, cfg.env.max_steps,
            cfg.env.history_length) == PAPER[name]
    if name in SEED_TABLE:  # the per-env prompt limits and mini-batches: tests/test_paper_configs.py
      assert (cfg.sampler.dtype, cfg.learner.dtype, cfg.analyzer.max_new_tokens) == ("bfloat16", "bfloat16", 4096)
  else:
    assert cfg.model.path == "embedded"
    assert (cfg.rollout.tasks_per_update, cfg.rollout.group_size, cfg.train.num_updates) == (2, 2, 2)
  config_lib.validate(cfg)
  obj = cfg.objectives
  assert (obj.invalid_penalty, obj.kl_coef, obj.entropy_coef, obj.norm_mode) == LOSS[name]
  assert cfg.env.name == name and get_family(name).name == name
  for field in ("train_split", "step_timeout_s", "reset_timeout_s", "start_timeout_s", "require_think"):
    assert field in cfg.env, field  # read by the pipeline, the pool and the prompts
  family = get_family(name)
  _with_data(cfg, tmp_path)
  for split in [cfg.env.train_split] + cfg.eval.split.split(","):
    tasks = family.tasks(cfg.env, split)
    assert name == "alfworld" or tasks, split
  with pytest.raises(ValueError, match="variant"):
    module.get_config("huge")


def test_search_stops_generation_after_its_answer_tags():
  from configs import search
  from seed_jax.envs import search as search_env
  assert search.get_config("").rollout.stop_strings == ("</search>", "</answer>")
  assert search.get_config("").rollout.stop_strings == tuple(f"</{t}>" for t in search_env.TAGS)


def test_env_config_data_matches_the_package_tables():
  """Config files hold plain data; where it lists the package's names, the lists agree."""
  from configs import sciworld, textworld_express
  from seed_jax.envs import sciworld as sciworld_env, textworld_express as twx_env
  assert sorted(textworld_express.env_config().game_params) == sorted(twx_env.GAMES)
  unseen = sciworld.env_config().unseen_task_types.split(",")
  assert len(unseen) == 10 and set(unseen) <= set(sciworld_env.TASK_TYPES)


@pytest.mark.parametrize("name", ENV_CONFIGS)
def test_env_config_is_the_env_section_before_the_variant(name):
  module = importlib.import_module(f"configs.{name}")
  env = module.env_config()
  assert "name" not in env
  assert set(env) <= set(module.get_config("").env) == set(env) | {"name", "train_split"}


@pytest.mark.parametrize("name", ENV_CONFIGS)
@pytest.mark.parametrize("stage", ["collect", "annotate", "sft", "warmstart"])
def test_every_env_has_the_stage1_variants(name, stage, tmp_path, monkeypatch):
  """Each env config takes `:<stage>` and `:<stage>,paper`; the paper's annotation goes through the external
  analyzer (a strong LLM, its key in the environment), the CPU one through the env's gold-path oracle."""
  module = importlib.import_module(f"configs.{name}")
  monkeypatch.setenv(module.get_config("").analyzer.external.api_key_env, "k")
  for paper in (False, True):
    cfg = module.get_config(stage + (",paper" if paper else ""))
    assert cfg.stage == stage and cfg.env.name == name
    assert cfg.annotate.analyzer == ("external" if paper and stage != "warmstart" else "oracle")
    assert cfg.learner.minibatch_size == module.get_config("paper" if paper else "").learner.minibatch_size
    cfg.model.path = "embedded"
    config_lib.validate(_with_data(cfg, tmp_path))


def test_experiment_sizes():
  """The CPU experiment and its accelerator size: same game, warm start and losses; the accelerator size has
  a few hundred envs per update and 30-50 updates."""
  twx = importlib.import_module("configs.textworld_express")
  cpu, big = twx.get_config("experiment"), twx.get_config("experiment,accelerator")
  for c in (cpu, big):
    c.model.path = "embedded"
    config_lib.validate(c)
    assert (c.env.game_params.coin, c.env.max_steps, c.warmstart.num_tasks, c.objectives.kl_coef) == \
        ("numLocations=4,includeDoors=0,numDistractorItems=0", 8, 4, 0.0)
  assert (cpu.rollout.tasks_per_update * cpu.rollout.group_size, cpu.train.num_updates) == (16, 3)
  assert big.rollout.tasks_per_update * big.rollout.group_size == 256 and 30 <= big.train.num_updates <= 50
  assert cpu.eval.temperature == cpu.rollout.temperature  # the CPU race plays the panel as it trains
  assert (big.eval.temperature, tuple(big.eval.temperatures)) == (0.0, (0.0, 0.4))  # greedy and the paper's 0.4
