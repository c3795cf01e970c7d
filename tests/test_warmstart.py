"""Policy warm start on TextWorldExpress: analyzer records are honest by default (the oracle on request), demo
prompts equal the rollout's, a tiny policy overfits the demos (greedy replies reproduce the gold actions), the
cache is reused, self-play adds the policy's own failures, and an RL run from the warm policy has a learning
signal in every update."""
import dataclasses
import json
import os
import types

import jax
import ml_collections
import numpy as np
import pytest
from helpers import save_tiny_llama

from configs import textworld_express as twx_config
from seed_jax import hindsight, loop, skills, stage1, warmstart
from seed_jax.config import validate
from seed_jax.envs import get_family
from seed_jax.envs.base import Task
from seed_jax.envs.pool import EnvPool
from seed_jax.infra.mesh import make_mesh
from seed_jax.models import load
from seed_jax.rollout import run_episodes
from seed_jax.sample import Generation, Sampler, SamplerConfig, SamplingParams
from stage1_helpers import step, trajectory

TASK = Task("twx/coin/train/1", "train", "textworld_express", {})
KITCHEN = "You are in the kitchen. You see a stove. \nTo the North you see the pantry. "
PANTRY = "You are in the pantry. You also see a coin. \nTo the South you see the kitchen. "
GOLD = ["look around", "move north", "take coin"]
WORDS = types.SimpleNamespace(encode_chat=lambda s: s.split())  # a tokenizer for prompt fitting: one token a word


def _cfg(model_path, tmp):
  c = twx_config.get_config("")
  c.model.path = model_path
  c.model.max_prompt_tokens = 512
  c.env.max_steps = 3
  c.warmstart.num_tasks, c.warmstart.envs, c.warmstart.cache_dir = 4, 2, os.path.join(tmp, "cache")
  # Demos show the first 2 of the 3 gold steps: the warm policy has not seen the last one, so RL has room.
  c.warmstart.max_steps = 2
  c.sft.epochs, c.sft.batch_size, c.sft.lr, c.sft.max_len, c.sft.schedule = 50, 4, 3e-3, 1024, "constant"
  c.sft.warmup_frac, c.sft.val_frac, c.sft.remat = 0.05, 0.0, False
  c.sft.checkpoint.save_interval_steps = 1000
  c.analyzer.max_prompt_tokens = 1024
  return c


@pytest.fixture(scope="module")
def able_model_dir(tmp_path_factory, embedded_tokenizer):
  """A small random Llama (2 layers, width 64) with the embedded tokenizer: big enough to memorize a
  handful of demos in a few dozen steps."""
  return save_tiny_llama(str(tmp_path_factory.mktemp("able_model")), embedded_tokenizer, dim=64, n_layers=2,
                         n_heads=4, n_kv_heads=2, ffn_dim=128)


@pytest.fixture(scope="module")
def warm(able_model_dir, tmp_path_factory):
  """The warm start of the tiny model, trained once on a one-device mesh (8 fake devices only cost time at
  this size): (config, export folder)."""
  c = _cfg(able_model_dir, str(tmp_path_factory.mktemp("warm")))
  validate(c)
  return c, warmstart.ensure_warm_policy(c, make_mesh((1, 1, 1), jax.devices()[:1]))


@pytest.mark.slow
def test_demo_prompts_are_the_rollout_prompts(embedded_tokenizer):
  """Each demo step's prompt (text and ids) equals what the rollout renders when it plays the same gold
  actions, and the demo reaches the same outcome."""
  c = twx_config.get_config("")
  c.env.max_steps = 6
  family = get_family(c.env.name)
  tok = embedded_tokenizer
  tasks = family.tasks(c.env, "train")[:3]
  with EnvPool(family, c.env, 2) as pool:
    demos, golds = warmstart.play_demos(pool, family, c.env, tok, tasks, max_prompt_tokens=1024, max_steps=6)
    assert [d.task.task_id for d in demos] == [t.task_id for t in tasks]
    for demo, gold in zip(demos, golds):
      script = iter(gold)

      def generate(prompts, key, frames, row_ids):
        assert len(prompts) == 1 and row_ids == [0]
        ids = tok.encode(warmstart.demo_response(next(script)))
        return [Generation(ids, [0.0] * len(ids), "stop")]

      traj = run_episodes(pool, family, c.env, [demo.task], [0], [0], generate, tok, jax.random.key(0),
                          max_prompt_tokens=1024, max_steps=6)[0]
      assert len(traj.steps) == len(demo.steps) > 0
      assert [s.prompt_text for s in traj.steps] == [s.prompt_text for s in demo.steps]
      assert [s.prompt_tokens for s in traj.steps] == [s.prompt_tokens for s in demo.steps]
      assert [s.action for s in traj.steps] == [s.action for s in demo.steps]
      assert all(s.action_valid for s in traj.steps)
      assert (traj.success, traj.episode_return) == (demo.success, demo.episode_return)
  assert any(d.success for d in demos)  # 2-room coin games are solved within 6 gold steps


@pytest.mark.slow
def test_warm_start_overfits_demos_and_is_cached(warm, able_model_dir, tmp_path):
  c, export = warm
  folder = os.path.dirname(export)
  records = [json.loads(line) for line in open(os.path.join(folder, warmstart.RECORDS_FILE))]
  policy = [r for r in records if r["kind"] == "policy"]
  assert policy and any(r["kind"] == "analyzer" for r in records)
  # Greedy replies on the demo states reproduce the gold replies' actions.
  spec, params = load.load_model(export)
  tok = load.load_tokenizer(export)
  family = get_family(c.env.name)
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(max_prompt_len=512, max_batch=16, dtype="float32"))
  gens = sampler.generate(params, [tok.encode_chat(r["prompt"]) for r in policy], jax.random.key(0),
                          SamplingParams(temperature=0.0, max_new_tokens=32), [tok.encode("</action>")])
  got = [family.parse_action(tok.decode(g.tokens), c.env) for g in gens]
  want = [family.parse_action(r["response"], c.env).action for r in policy]
  hits = np.mean([p.valid and p.action == w for p, w in zip(got, want)])
  assert hits >= 0.9, (hits, [tok.decode(g.tokens) for g in gens][:4])
  assert not os.path.exists(os.path.join(folder, "sft_checkpoints"))  # the cache keeps the export only
  # A second call reuses the finished export: nothing is retrained.
  stamp = os.path.getmtime(os.path.join(export, "model.safetensors"))
  assert warmstart.ensure_warm_policy(c) == export
  assert os.path.getmtime(os.path.join(export, "model.safetensors")) == stamp
  # Another setting that shapes the weights is another cache entry.
  c2 = _cfg(able_model_dir, c.warmstart.cache_dir)
  c2.warmstart.cache_dir = c.warmstart.cache_dir
  assert warmstart.cache_dir(c2) == warmstart.cache_dir(c)
  c2.warmstart.num_tasks = 3
  assert warmstart.cache_dir(c2) != warmstart.cache_dir(c)


@pytest.mark.slow
def test_rl_from_warm_policy_has_a_signal_every_update(warm, tmp_path):
  """The RL stage warm-starts first (here: from the cache), then every update has non-zero advantages and OPD
  tokens, and π_old's log-probs are the sampler's (fp32)."""
  c = ml_collections.ConfigDict(warm[0].to_dict())
  c.warmstart.before_rl = True
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 4, 4, 24
  c.analyzer.max_new_tokens = 96
  c.learner.minibatch_size, c.learner.micro_batch_size = 64, 8
  c.train.num_updates = 2
  c.eval.at_end, c.eval.every = False, 0
  validate(c)
  out = loop.train(c, str(tmp_path / "run"))
  lines = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  updates = [r for r in lines if "rollout/return" in r]
  assert len(updates) == 2
  for r in updates:
    assert r["rollout/invalid_action_rate"] < 0.5, r
    assert r["advantages/abs_mean"] > 0, r
    assert r["update/opd_tokens"] > 0, r
    assert r["rescore/old_logps_from_sampler"] == 1.0
  assert out["metrics"]["analysis/parse_rate"] > 0


def test_family_without_gold_paths_is_one_clear_error(tmp_path):
  from configs import webshop as webshop_config
  c = webshop_config.get_config("")
  c.warmstart.cache_dir = str(tmp_path)
  with pytest.raises(ValueError, match="webshop.*gold path"):
    warmstart.check_gold_paths(c)


def _demos():
  """A solved demo and one longer than RL's episode (env.max_steps = 2 below): its view is a max_steps cut."""
  solved = trajectory(TASK, [step(KITCHEN, "look around"), step(KITCHEN, "move north"), step(PANTRY, "take coin")],
                      10.0, "done")
  return [solved, solved], [GOLD, GOLD]


def _analyzer_records(source: str) -> tuple[list[dict], list]:
  c = twx_config.get_config("")
  c.warmstart.analyzer_source = source
  trajs, golds = _demos()
  c.env.max_steps = 3
  full = warmstart.build_records(trajs[:1], golds[:1], c, WORDS)
  c.env.max_steps = 2
  cut = warmstart.build_records(trajs[1:], golds[1:], c, WORDS)
  views = [trajs[0], warmstart.rl_view(trajs[1], 2)]
  return [r for r in full + cut if r["kind"] == "analyzer"], views


def test_analyzer_records_are_honest_by_default():
  assert twx_config.get_config("").warmstart.analyzer_source == "hindsight"
  records, views = _analyzer_records("hindsight")
  assert [r["success"] for r in records] == [True, False]
  for r, view in zip(records, views):
    parsed = skills.parse_skill(r["response"])
    assert parsed.ok and hindsight.unseen_mentions(view, parsed.skill) == []
    assert r["prompt"] == skills.analysis_prompt(view)
  assert skills.parse_skill(records[1]["response"]).skill.startswith(
      "These actions did not finish the task in 2 steps: 1. look around; 2. move north.")
  assert warmstart._stats(records) == {"warmstart/policy_records": 0.0, "warmstart/analyzer_records": 2.0,
                                       "warmstart/analyzer_success_records": 1.0,
                                       "warmstart/analyzer_failure_records": 1.0}


def test_oracle_records_are_the_privileged_choice():
  records, views = _analyzer_records("oracle")
  skill = skills.parse_skill(records[1]["response"]).skill
  assert skill == 'Do not stop or stall after "move north": continue with "take coin".'
  assert hindsight.unseen_mentions(views[1], skill) == ["take coin"]  # the gold action the cut view never shows


def test_a_hindsight_target_quoting_unseen_text_is_an_error(monkeypatch):
  monkeypatch.setattr(hindsight, "hindsight_analysis", lambda traj, thr: ("s", 'Do "move east".'))
  trajs, golds = _demos()
  with pytest.raises(ValueError, match=r"twx/coin/train/1 quotes \['move east'\]"):
    warmstart.build_records(trajs, golds, twx_config.get_config(""), WORDS)


def test_skill_prompt_records_carry_the_demo_own_honest_skill():
  c = twx_config.get_config("")
  c.env.max_steps, c.model.max_prompt_tokens = 3, 60
  solved, _ = _demos()
  prompts = [f"Your task: find the coin\nYou see: {o}\nYour turn." for o in (KITCHEN, KITCHEN, PANTRY)]
  demo = dataclasses.replace(solved[0], steps=[dataclasses.replace(s, prompt_text=p)
                                               for s, p in zip(solved[0].steps, prompts)])
  assert not [r for r in warmstart.build_records([demo], [GOLD], c, WORDS) if r.get("skill")]  # off by default
  c.warmstart.skill_prompt_weight, c.warmstart.analyzer_weight = 2, 0
  records = warmstart.build_records([demo], [GOLD], c, WORDS)
  plain, with_skill = records[:3], records[3:]
  skill = hindsight.hindsight_analysis(demo)[1]
  assert hindsight.unseen_mentions(demo, skill) == [] and "3. take coin" in skill
  assert [r["prompt"] for r in plain] == prompts
  assert [r["prompt"] for r in with_skill] == [skills.augment_prompt(p, skill) for p in prompts] * 2
  assert all(skill in r["prompt"] and r["prompt"].startswith("Your task: find the coin\n") for r in with_skill)
  assert [r["response"] for r in with_skill] == [s.response_text for s in demo.steps] * 2
  c.model.max_prompt_tokens = len(with_skill[0]["prompt"].split()) - 1  # H(h, s) too long: left out, as in RL
  assert len(warmstart.build_records([demo], [GOLD], c, WORDS)) == 3


def test_self_play_config_and_cache_key(tmp_path):
  c = twx_config.get_config("")
  c.rollout.temperature, c.rollout.max_new_tokens = 0.7, 24
  c.warmstart.self_play_rollouts, c.warmstart.envs = 5, 2
  sp = warmstart.self_play_config(c, str(tmp_path), "/policy")
  assert (sp.model.path, sp.collect.num_tasks, sp.collect.rollouts, sp.collect.tasks_per_batch) == ("/policy", 5, 1, 2)
  assert (sp.collect.temperature, sp.collect.max_new_tokens) == (0.7, 24)
  assert sp.collect.output == str(tmp_path / warmstart.SELF_PLAY_TRAJECTORIES)
  assert stage1.collection_tasks(sp)[0].split == "train"
  # The rollout's sampling shapes the warm policy only through self-play.
  key = warmstart.cache_key(c)
  c.rollout.temperature = 1.0
  assert warmstart.cache_key(c) != key
  c.warmstart.self_play_rollouts = 0
  key = warmstart.cache_key(c)
  c.rollout.temperature = 0.5
  assert warmstart.cache_key(c) == key
  c.warmstart.analyzer_source = "oracle"
  assert warmstart.cache_key(c) != key
  key = warmstart.cache_key(c)  # how the simulators run is not what they play
  c.env.step_timeout_s, c.env.start_timeout_s = 7.0, 9.0
  assert warmstart.cache_key(c) == key
  c.env.max_steps += 1
  assert warmstart.cache_key(c) != key


@pytest.mark.slow
def test_self_play_adds_the_policy_own_episodes(tiny_model_dir, tmp_path):
  """The demo-SFT policy plays 2 train tasks; the second pass trains on the demo policy records and the honest
  analyses of those episodes (a random tiny policy fails them), and the cache keeps only the final export."""
  c = _cfg(tiny_model_dir, str(tmp_path))
  c.warmstart.self_play_rollouts, c.sft.epochs = 2, 1
  c.rollout.max_new_tokens = 16
  validate(c)
  export = warmstart.ensure_warm_policy(c, make_mesh((1, 1, 1), jax.devices()[:1]))
  folder = os.path.dirname(export)
  assert sorted(os.listdir(folder)) == sorted([warmstart.RECORDS_FILE, warmstart.SELF_PLAY_TRAJECTORIES,
                                               warmstart.SELF_PLAY_RECORDS, warmstart.EXPORT_DIR, warmstart.DONE_FILE,
                                               "sft", "sft_stats.json"])
  episodes = [t for _, t in stage1.load_trajectories(os.path.join(folder, warmstart.SELF_PLAY_TRAJECTORIES))]
  assert len(episodes) == 2
  read = lambda name: [json.loads(line) for line in open(os.path.join(folder, name))]
  demo_policy = [r for r in read(warmstart.RECORDS_FILE) if r["kind"] == "policy"]
  second = read(warmstart.SELF_PLAY_RECORDS)
  assert [r for r in second if r["kind"] == "policy"] == demo_policy
  analyses = [r for r in second if r["kind"] == "analyzer"]
  assert analyses and len(analyses) <= len(episodes)
  by_task = {t.task.task_id: t for t in episodes}
  for r in analyses:
    assert hindsight.unseen_mentions(by_task[r["task_id"]], skills.parse_skill(r["response"]).skill) == []
  stats = json.load(open(os.path.join(folder, warmstart.DONE_FILE)))
  assert stats["warmstart/self_play/episodes"] == 2 and 0 <= stats["warmstart/self_play/invalid_action_rate"] <= 1
  assert stats["warmstart/analyzer_failure_records"] == sum(not r["success"] for r in analyses)
  assert stats["warmstart/analyzer_success_records"] == sum(r["success"] for r in analyses)
  assert stats["warmstart/demo_analyzer_records"] > 0 and "warmstart/self_play/success" in stats
  assert warmstart.ensure_warm_policy(c) == export
