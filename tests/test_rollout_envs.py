"""Short rollouts of ALFWorld, WebShop, Search, Sokoban and EZPoints through the real env pool, the real rollout
loop and the real sampler, with a tiny random model over the embedded tokenizer's vocabulary.

A random model writes no answer tags, so every step is invalid ("no_action_tags"), the env gets the response's
last 30 characters, nothing is solved and every episode runs to max_steps: ended by the env itself (Sokoban,
EZPoints and Search truncate, done=True) or by the rollout loop (ALFWorld, WebShop, done=False).
"""
import math
import pathlib

import jax
import pytest

from alfworld_data import build_data
from configs import alfworld as alfworld_config, ezpoints as ezpoints_config, search as search_config
from configs import sokoban as sokoban_config, webshop as webshop_config
from seed_jax.envs import alfworld, ezpoints, get_family, retriever, search, sokoban, sokoban_levels, webshop
from seed_jax.envs.base import TASK_LINE_PREFIX, TURN_LINE_PREFIX
from seed_jax.envs.pool import EnvPool
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec
from seed_jax.rollout import run_episodes
from seed_jax.sample import Sampler, SamplerConfig, SamplingParams

pytestmark = pytest.mark.slow  # five environments through the pool, sampler and rollout loop

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
G = 2  # envs per task; two tasks per rollout -> 4 envs
MAX_PROMPT = 1024
MAX_NEW = 16
MAX_STEPS = 3


@pytest.fixture(scope="module")
def tok(embedded_tokenizer):
  return embedded_tokenizer


@pytest.fixture(scope="module")
def policy(tok):
  """Sampler and params of a random 1-layer, width-32 model. One batch and one prompt bucket: every call of
  the module runs the same compiled program (one more for Search's stop strings)."""
  assert tok.vocab_size == 49152
  spec = ModelSpec("LlamaForCausalLM", vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, ffn_dim=64)
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(max_prompt_len=MAX_PROMPT, min_prompt_bucket=MAX_PROMPT,
                                                     min_batch=2 * G, max_batch=2 * G, dtype="float32"))
  return sampler, tf.init_params(spec, 0)


def _rollout(name, cfg, tasks, tok, policy, stop_strings=("</action>",)):
  sampler, params = policy
  family = get_family(name)
  sp = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
  stops = [tok.encode(s) for s in stop_strings]
  episodes = [t for t in tasks for _ in range(G)]
  with EnvPool(family, cfg, len(episodes)) as pool:
    trajs = run_episodes(pool, family, cfg, episodes, [7 + b for b in range(len(tasks)) for _ in range(G)],
                         [g for _ in tasks for g in range(G)],
                         lambda prompts, key, frames, ids: sampler.generate(params, prompts, key, sp, stops, frames, ids), tok,
                         jax.random.key(0), max_prompt_tokens=MAX_PROMPT)
  assert [(t.task, t.group_id, t.traj_id) for t in trajs] == [
      (tasks[0], 7, 0), (tasks[0], 7, 1), (tasks[1], 8, 0), (tasks[1], 8, 1)]
  return trajs


def _check(trajs, tok, cfg, env_truncates: bool, task_line=lambda desc: f"{TASK_LINE_PREFIX} {desc}"):
  """The invariants of a random-policy rollout; returns the trajectories for env-specific checks."""
  for traj in trajs:
    assert traj.termination == "max_steps" and traj.length == MAX_STEPS and not traj.success
    assert traj.invalid_actions == MAX_STEPS and traj.truncated_prompts == 0
    assert [s.done for s in traj.steps] == [False] * (MAX_STEPS - 1) + [env_truncates]
    for k, step in enumerate(traj.steps):
      assert step.prompt_tokens == tok.encode_chat(step.prompt_text) and len(step.prompt_tokens) <= MAX_PROMPT
      assert 1 <= len(step.response_tokens) <= MAX_NEW and len(step.logps) == len(step.response_tokens)
      assert all(-math.inf < lp <= 0.0 for lp in step.logps)
      assert step.response_text == tok.decode(step.response_tokens)
      assert (step.action_valid, step.info["invalid_reason"]) == (False, "no_action_tags")
      assert step.action == step.response_text.lower()[-30:]
      lines = step.prompt_text.split("\n")
      task_lines = [line for line in lines if line.startswith(TASK_LINE_PREFIX)]
      assert task_lines == [task_line(traj.task_description)]
      assert lines[-1].startswith(TURN_LINE_PREFIX)
      # The renderer sees the whole episode: the last history_length steps keep their absolute numbers.
      window = min(k, cfg.history_length)
      assert f"Step {k + 1} observation (now):" in step.prompt_text
      for i, past in enumerate(traj.steps[k - window:k], start=k - window + 1):
        assert f"Step {i} action: {past.action}\n" in step.prompt_text
      assert f"Step {k - window} action: " not in step.prompt_text and f"Step {k + 1} action: " not in step.prompt_text
  # The G envs of one task reset to the same state, so their first prompts are identical.
  for a, b in zip(trajs[::G], trajs[1::G]):
    assert a.steps[0].prompt_text == b.steps[0].prompt_text
  assert len({t.steps[0].response_text for t in trajs}) == len(trajs)  # but sampled differently
  return trajs


def test_alfworld_rollout(tok, policy, tmp_path_factory):
  cfg = alfworld_config.env_config()
  cfg.data_dir = build_data(tmp_path_factory.mktemp("alfworld_data"), "valid_seen")
  cfg.max_steps = MAX_STEPS
  tasks = alfworld.FAMILY.tasks(cfg, "valid_seen")[:2]
  trajs = _check(_rollout("alfworld", cfg, tasks, tok, policy), tok, cfg, env_truncates=False)
  assert [t.task_description for t in trajs] == ["clean some mug and put it in coffeemachine."] * 2 + [
      "heat some apple and put it in diningtable."] * 2
  assert all(s.reward == 0.0 for t in trajs for s in t.steps)
  # An unparsable command changes nothing in the engine.
  assert all(t.steps[1].observation == "Nothing happens." for t in trajs)


def test_webshop_rollout(tok, policy):
  cfg = webshop_config.env_config()
  cfg.data_dir, cfg.num_test_goals, cfg.max_steps = str(FIXTURES / "webshop"), 2, MAX_STEPS
  tasks = webshop.FAMILY.tasks(cfg, "test")
  trajs = _check(_rollout("webshop", cfg, tasks, tok, policy), tok, cfg, env_truncates=False)
  # Without a search[...] or click[...] the agent stays on the search page.
  for t in trajs:
    assert all(s.observation == "'Search'" and s.reward == 0.0 for s in t.steps)
    assert "Your admissible actions, one per line:\nsearch[<your query>]\nclick[search]\n" in t.steps[0].prompt_text


def test_search_rollout(tok, policy):
  with retriever.start_server(retriever.BM25Index.from_jsonl(str(FIXTURES / "search" / "corpus.jsonl"))) as server:
    cfg = search_config.env_config()
    cfg.retriever_url, cfg.test_files = server.url, str(FIXTURES / "search" / "questions.jsonl")
    cfg.max_steps, cfg.history_length = MAX_STEPS, 2
    tasks = search.FAMILY.tasks(cfg, "test")[:2]
    trajs = _rollout("search", cfg, tasks, tok, policy, stop_strings=("</search>", "</answer>"))
  _check(trajs, tok, cfg, env_truncates=True, task_line=lambda q: f"{TASK_LINE_PREFIX} answer the question: {q}")
  for t in trajs:
    assert [s.observation for s in t.steps] == [t.task_description] + [search.INVALID_TEXT] * (MAX_STEPS - 1)
    assert t.steps[-1].info["truncated"] and t.episode_return == 0.0
    assert "inside <search></search> or <answer></answer>" in t.steps[0].prompt_text


def test_sokoban_rollout(tok, policy):
  cfg = sokoban_config.env_config()
  cfg.max_steps, cfg.render_image = MAX_STEPS, False
  tasks = sokoban.FAMILY.tasks(cfg, "test")[:2]
  trajs = _check(_rollout("sokoban", cfg, tasks, tok, policy), tok, cfg, env_truncates=True)
  for t in trajs:
    level = "\n".join(sokoban.render_rows(*sokoban_levels.generate_level(t.task.spec["seed"])))
    assert [s.observation for s in t.steps] == [level] * MAX_STEPS  # no move was made
    assert [s.reward for s in t.steps] == pytest.approx([-0.1] * MAX_STEPS)  # gym-sokoban's step penalty
    assert t.episode_return == pytest.approx(-0.3) and t.score == 0.0


def test_ezpoints_rollout(tok, policy):
  cfg = ezpoints_config.env_config()
  cfg.max_steps, cfg.render_image = MAX_STEPS, False
  tasks = ezpoints.FAMILY.tasks(cfg, "test")[:2]
  trajs = _check(_rollout("ezpoints", cfg, tasks, tok, policy), tok, cfg, env_truncates=True)
  for t in trajs:
    assert all(s.observation.endswith("Formula: (empty)") and s.reward == 0.0 for s in t.steps)
    assert t.steps[-1].info["truncated"]
