"""Rows that refill (seed_jax/slots.py) sample what the static sampler samples for the same keys, on fewer
slot-steps; a multi-turn rollout on them plays the same trajectories as turn by turn."""
import jax
import numpy as np
import pytest

from configs import sokoban as sokoban_config
from seed_jax import slots
from seed_jax.envs import get_family, sokoban
from seed_jax.envs.pool import EnvPool
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec
from seed_jax.rollout import run_episodes
from seed_jax.sample import Sampler, SamplerConfig, SamplingParams

SPEC = ModelSpec("LlamaForCausalLM", vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn_dim=96)
PARAMS = tf.init_params(SPEC, 7)
PARAMS["embed"] = PARAMS["embed"] * 40  # diverse samples, not uniform noise
RNG = np.random.default_rng(1)
# Mixed lengths over two prompt buckets (16 and 32), repeats included (prefilled once).
PROMPTS = [RNG.integers(3, 96, n).tolist() for n in (5, 12, 1, 9, 20, 3, 30, 7, 14)]
PROMPTS += [PROMPTS[1], PROMPTS[4]]
EOS = [5, 17, 33, 60, 71]  # ~5 % of a row's draws end it: rows end early, late and at max_new
MAX_NEW = 12


def _sampler(max_batch: int, eos=EOS, refill: bool = False) -> Sampler:
  return Sampler(SPEC, eos, SamplerConfig(max_prompt_len=32, min_prompt_bucket=16, max_batch=max_batch,
                                          dtype="float32", refill=refill))


def _same(a, b, atol: float = 1e-6):
  """The same tokens and stop reasons, log-probs within atol."""
  assert [g.tokens for g in a] == [g.tokens for g in b]
  assert [g.stop_reason for g in a] == [g.stop_reason for g in b]
  for x, y in zip(a, b):
    np.testing.assert_allclose(x.logps, y.logps, atol=atol)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_refilling_rows_sample_what_the_static_sampler_samples(temperature):
  """11 prompts on 4 slots (and on 16): each row's tokens, stop reason and log-probs (within 1e-6: other row
  counts and paddings in the matmuls) equal the static sampler's for the same key and row id; the slots grow
  from the 16- to the 32-token prompt bucket on the way, and a short prompt after that is prefilled at its own
  bucket and moved right into the longer slots."""
  sp = SamplingParams(temperature=temperature, max_new_tokens=MAX_NEW)
  ids = [40 + 3 * n for n in range(len(PROMPTS))]
  static = _sampler(16).generate(PARAMS, PROMPTS, jax.random.key(3), sp, stop_sequences=[[8, 9]], row_ids=ids)
  lens = sorted(len(g.tokens) for g in static)
  reasons = {g.stop_reason for g in static}
  if temperature:  # the case is what it claims: EOS early and late, rows at max_new
    assert lens[0] <= 3 and lens[-1] == MAX_NEW and {"eos", "max_new_tokens"} <= reasons
  for slots_n in (4, 16):
    s = _sampler(slots_n)
    _same(slots.generate(s, PARAMS, PROMPTS, jax.random.key(3), sp, [[8, 9]], row_ids=ids), static)
    prefills = {k[1:3] for k in s.compiles.keys if k[0] == "prefill"}  # (rows, prompt bucket)
    if slots_n == 4 and temperature:  # after the 20-token prompt grew the slots to 32, a lone 7-token prompt
      assert (1, 16) in prefills and (1, 32) in prefills, prefills  # fills at 16 (before: at the slots' 32)


def test_refilling_rows_compute_fewer_slot_steps_and_count_them():
  """The static sampler runs each batch of 4 to its longest row; 4 refilling slots run until the last row ends,
  a freed slot taking the next prompt: the same real tokens on fewer slot-steps."""
  sp = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
  static_s, slot_s = _sampler(4), _sampler(4)
  static = static_s.generate(PARAMS, PROMPTS, jax.random.key(3), sp)
  _same(slots.generate(slot_s, PARAMS, PROMPTS, jax.random.key(3), sp), static)
  a, b = static_s.tokens, slot_s.tokens
  assert a.response_real == b.response_real == sum(len(g.tokens) for g in static)
  lens = [len(g.tokens) for g in static]
  assert a.response_forwarded == sum(4 * max(lens[i:i + 4]) for i in range(0, len(lens), 4))
  assert b.response_real <= b.response_forwarded < a.response_forwarded
  assert b.response_forwarded == 4 * b.decode_steps and b.rows_real == len(PROMPTS)
  assert a.decode_steps == sum(max(lens[i:i + 4]) for i in range(0, len(lens), 4)) > b.decode_steps
  assert slot_s.times["decode_s"] > 0 and slot_s.times["prefill_s"] > 0


def test_follow_up_requests_enter_freed_slots_as_the_turn_by_turn_calls_sample_them():
  """A three-turn exchange per row: each reply, appended to its prompt, is that row's next request as soon as it
  ends (on_done); turn t draws with fold_in(fold_in(key, t), row). The same as one generate call per turn."""
  sp = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
  starts = [p[:6] for p in PROMPTS[:6]]
  key = jax.random.key(9)
  static, turn_prompts = [], list(starts)
  for t in range(3):
    gens = _sampler(8).generate(PARAMS, turn_prompts, jax.random.fold_in(key, t), sp, row_ids=range(len(starts)))
    static.append(gens)
    turn_prompts = [p + g.tokens for p, g in zip(turn_prompts, gens)]
  got = [[None] * len(starts) for _ in range(3)]
  turns = [0] * len(starts)

  def request(row, ids):
    return slots.Request(ids, jax.random.fold_in(jax.random.fold_in(key, turns[row]), row), tag=(row, ids))

  def on_done(finished):
    follow = []
    for r, g in finished:
      row, ids = r.tag
      got[turns[row]][row] = g
      turns[row] += 1
      if turns[row] < 3:
        follow.append(request(row, ids + g.tokens))
    return follow

  s = _sampler(4)  # fewer slots than rows: first turns wait for free slots too
  slots.serve(s, PARAMS, [request(r, p) for r, p in enumerate(starts)], sp, on_done)
  for t in range(3):
    _same(got[t], static[t])


@pytest.mark.slow  # the real env pool
def test_refilling_rollout_plays_the_turn_by_turn_trajectories(embedded_tokenizer):
  """Sokoban through the real pool and rollout loop with a tiny random model whose replies end at random
  (every 13th id is an end token): on rows that refill (3 slots for 4 episodes) the episodes' prompts, replies,
  log-probs, actions and rewards equal the turn-by-turn loop's, on fewer slot-steps."""
  tok = embedded_tokenizer
  spec = ModelSpec("LlamaForCausalLM", vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, ffn_dim=64)
  params = tf.init_params(spec, 0)
  cfg = sokoban_config.env_config()
  cfg.max_steps, cfg.render_image = 3, False
  family = get_family("sokoban")
  tasks = [t for t in sokoban.FAMILY.tasks(cfg, "test")[:2] for _ in range(2)]
  sp = SamplingParams(temperature=1.0, max_new_tokens=24)
  stops = [tok.encode("</action>")]

  def play(refill: bool):
    sampler = Sampler(spec, list(range(0, tok.vocab_size, 13)),
                      SamplerConfig(max_prompt_len=1024, max_batch=4 if not refill else 3, dtype="float32",
                                    refill=refill))
    with EnvPool(family, cfg, len(tasks)) as pool:
      trajs = run_episodes(pool, family, cfg, tasks, [0, 0, 1, 1], [0, 1, 0, 1],
                           sampler.rollout_fn(params, sp, stops), tok, jax.random.key(0), max_prompt_tokens=1024,
                           serve=slots.server(sampler, params, sp, stops), episode_ids=[5, 6, 7, 8])
    return trajs, sampler.tokens

  (turned, t_tokens), (refilled, r_tokens) = play(False), play(True)
  lens = [len(s.response_tokens) for t in turned for s in t.steps]
  assert max(lens) - min(lens) >= 10  # replies of mixed lengths
  for a, b in zip(turned, refilled):
    assert (a.termination, a.episode_return, a.length) == (b.termination, b.episode_return, b.length)
    for x, y in zip(a.steps, b.steps):
      assert (x.prompt_text, x.response_tokens, x.action, x.reward, x.done) == (
          y.prompt_text, y.response_tokens, y.action, y.reward, y.done)
      np.testing.assert_allclose(x.logps, y.logps, atol=1e-6)
  assert r_tokens.response_real == t_tokens.response_real
  assert r_tokens.response_forwarded < t_tokens.response_forwarded


@pytest.mark.parametrize("prompt,message", [([], "prompt 1 is empty"),
                                            (list(range(3, 36)), "prompt 1 has 33 tokens, more than sampler "
                                                                 "max_prompt_len=32")])
def test_a_prompt_the_slots_cannot_hold_is_the_static_sampler_error(prompt, message):
  sp = SamplingParams(temperature=0.0, max_new_tokens=2)
  for generate in (_sampler(4).generate, lambda *a: slots.generate(_sampler(4), *a)):
    with pytest.raises(ValueError, match=message):
      generate(PARAMS, [PROMPTS[0], prompt], jax.random.key(0), sp)
