"""`:paper` holds the reference's numbers per environment, so they cannot drift (SEED_ALGORITHM.md §3 and §5, and
the reference launchers for the mini-batch sizes, prompt limits, warm-up, Search's reward scale, Sokoban's
generator depth, EZPoints' update count and the envs that use the JSON-retry turn)."""
import importlib

import pytest

from seed_jax.config import validate

# env: B, G, max_steps, history, mini-batch, prompt limit, updates
TABLE = {
    "alfworld": (16, 8, 30, 5, 256, 2048, 150),
    "webshop": (16, 8, 15, 2, 64, 4096, 150),
    "search": (128, 8, 4, 4, 512, 4096, 150),
    "sokoban": (32, 8, 15, 0, 64, 1024, 150),
    "ezpoints": (16, 8, 8, 0, 128, 1024, 100),
}
JSON_RETRY = {"webshop", "sokoban", "ezpoints"}


def _paper(env):
  return importlib.import_module(f"configs.{env}").get_config("paper")


@pytest.mark.parametrize("env", sorted(TABLE))
def test_paper_values(env):
  c = _paper(env)
  got = (c.rollout.tasks_per_update, c.rollout.group_size, c.env.max_steps, c.env.history_length,
         c.learner.minibatch_size, c.model.max_prompt_tokens, c.train.num_updates)
  assert got == TABLE[env]
  search = env == "search"
  assert (c.learner.lr, c.learner.b1, c.learner.b2, c.learner.weight_decay, c.learner.max_grad_norm) == \
      (1e-6, 0.9, 0.999, 0.01, 1.0)
  assert (c.learner.schedule, c.learner.warmup_frac) == (("warmup_constant", 0.1) if search else ("constant", 0.0))
  assert (c.objectives.kl_coef, c.objectives.entropy_coef) == ((0.001, 0.0) if search else (0.01, 0.001))
  assert c.objectives.invalid_penalty == (0.01 if search else 0.1)
  assert (c.objectives.opd_coef, c.objectives.opd_beta, c.learner.ppo_epochs) == (0.01, 5.0, 1)
  assert (c.analyzer.max_prompt_tokens, c.analyzer.max_new_tokens) == (16384, 4096)
  assert c.analyzer.salvage_truncated is False  # the reference drops replies cut off by the token limit
  assert c.analyzer.external.json_retry is (env in JSON_RETRY)
  assert c.rollout.stop_strings == ()  # every reply sampled to EOS, Search's too
  assert c.analyzer.max_skill_chars == 0  # the skill enters the teacher prompt uncut
  assert (c.eval.temperature, c.rollout.temperature) == (0.4, 1.0)


def test_env_specific_paper_values():
  assert _paper("webshop").env.human_goals is False  # synthetic goals
  assert _paper("search").env.success_reward == 1.0  # exact match in {0, 1}
  assert _paper("sokoban").env.search_depth == 30
  assert _paper("webshop").objectives.norm_mode == "mean_norm"


@pytest.mark.parametrize("env", sorted(TABLE))
def test_paper_configs_validate(env, tmp_path):
  c = _paper(env)
  c.model.path = str(tmp_path)  # :paper leaves it to the user
  validate(c)


@pytest.mark.parametrize("env", ["sokoban", "ezpoints"])
def test_paper_vl_values(env, tmp_path):
  """`:paper,vl`: the paper's visual settings (Qwen2.5-VL-3B-Instruct from RGB frames) on top of `:paper`."""
  c = importlib.import_module(f"configs.{env}").get_config("paper,vl")
  assert (c.env.observation, c.env.render_image) == ("image", True)
  assert c.model.path == ""  # required: the Qwen2.5-VL-3B-Instruct folder
  assert (c.model.max_prompt_tokens, c.analyzer.max_new_tokens, c.sft.lr) == (1024, 2048, 2e-6)
  got = (c.rollout.tasks_per_update, c.rollout.group_size, c.env.max_steps, c.env.history_length,
         c.learner.minibatch_size, c.model.max_prompt_tokens, c.train.num_updates)
  assert got == TABLE[env]
  assert (c.learner.lr, c.learner.teacher, c.objectives.opd_coef, c.objectives.kl_coef) == (1e-6, "old", 0.01, 0.01)
  c.model.path = str(tmp_path)
  validate(c)


# env -> Stage-1 SFT record length, collection temperature, annotation context (text; then ",vl")
STAGE1 = {"alfworld": (8192, 0.4, 7168), "webshop": (12288, 0.4, 7168), "search": (12288, 0.4, 7168),
          "sokoban,vl": (4096, 1.0, 24576), "ezpoints,vl": (4096, 1.0, 7168)}
# env -> the reference's rendering and reading: action list, EZPoints' answer form, Sokoban's player walk
FORMS = {"alfworld": ("quoted_lines", None, None), "webshop": ("quoted_commas", None, None),
         "ezpoints": ("", "json", None), "sokoban": ("", None, 3), "search": ("", None, None)}


@pytest.mark.parametrize("spec", sorted(STAGE1))
def test_paper_stage1_values(spec):
  env, _, vl = spec.partition(",")
  c = importlib.import_module(f"configs.{env}").get_config("sft,paper" + ("," + vl if vl else ""))
  assert (c.sft.max_len, c.collect.temperature, c.annotate.max_prompt_tokens) == STAGE1[spec]
  assert tuple(c.model.frame_pixels) == ((256 * 256, 2048 * 2048) if vl else (0, 0))


@pytest.mark.parametrize("env", sorted(FORMS))
def test_paper_renders_and_reads_as_the_reference(env):
  c = _paper(env)
  assert (c.templates.action_list, c.env.get("answer_format"), c.env.get("player_walk")) == FORMS[env]
  assert _paper(env).analyzer.max_skill_chars == 0
