"""Shared-prefix prefill (seed_jax/prefix.py): a prompt that reuses an earlier prompt's head gets the numbers
of its own whole prefill, and the sampler samples what it samples without reuse, on fewer prompt positions."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax import prefix, slots
from seed_jax.sample import SamplerConfig, Sampler, SamplingParams, prefill_prompts
import test_slots as slots_test
from test_slots import EOS, PARAMS, SPEC

RNG = np.random.default_rng(4)
HEAD = RNG.integers(3, 96, 40).tolist()
# Four prompts sharing a 40-token head (one also a longer one's head), one sharing 20, one sharing nothing.
PROMPTS = [HEAD + RNG.integers(3, 96, n).tolist() for n in (5, 12, 20)]
PROMPTS += [PROMPTS[1] + [4, 4, 4], HEAD[:20] + [7, 8], RNG.integers(3, 96, 30).tolist()]


def _prefill(params, spec, p, Pn, dtype=jnp.float32, max_new=4):
  tokens, valid = np.zeros((1, Pn), np.int32), np.zeros((1, Pn), bool)
  tokens[0, Pn - len(p):], valid[0, Pn - len(p):] = p, True
  return prefill_prompts(params, tokens, valid, spec=spec, dtype=dtype, max_new=max_new)


def _reused(params, spec, src, p, s, Pn, Tn, dtype=jnp.float32, max_new=4):
  """p's prefill after its first s tokens' keys and values, taken from src's whole prefill at bucket Pn and
  left-padded into the Pn - Tn slots before p's tail bucket Tn (the sampler's layout), written into row 1 of a
  two-row call's outputs: that row's cache, logits and next position."""
  cache, _, _ = _prefill(params, spec, src, Pn, dtype, max_new)
  H = Pn - Tn
  slot_H = np.zeros((H,), np.int32)
  slot_H[H - s:] = Pn - len(src) + np.arange(s)
  tokens, valid = np.zeros((1, Tn), np.int32), np.zeros((1, Tn), bool)
  tokens[0, Tn - (len(p) - s):], valid[0, Tn - (len(p) - s):] = p[s:], True
  src_row = prefix.row(cache, 0, Pn)
  out = prefix.empty(spec=spec, rows=2, prompt=Pn, max_new=max_new, dtype=dtype)  # written into its row 1
  cache, logits, pos, kept = prefix.prefill_row(params, src_row, slot_H, (np.arange(H) >= H - s)[None], tokens,
                                                valid, *out, 1, spec=spec, dtype=dtype, max_new=max_new)
  assert kept.segment_BS.shape == (1, Pn) and np.array_equal(kept.segment_BS, cache.segment_BS[1:, :Pn])
  return prefix.row(cache, 1, Pn + max_new), logits[1:], pos[1:]


def _kv_of_tokens(cache, slots_N):
  return (np.stack([np.asarray(k[0][..., slots_N], np.float32) for k in cache.k]),
          np.stack([np.asarray(v[0][:, slots_N], np.float32) for v in cache.v]))


def test_a_tail_after_a_reused_head_has_its_whole_prefills_logits_and_keys():
  """Prompt 3 (55 tokens) after all 52 tokens of prompt 1, left-padded in 56 slots before an 8-slot tail:
  next-token logits, next position and every token's keys and values equal its own whole prefill's within
  1e-5."""
  p, s, Tn = PROMPTS[3], len(PROMPTS[1]), 8
  assert prefix.common_prefix(np.asarray(p), np.asarray(PROMPTS[1])) == s == 52
  whole_cache, whole_logits, whole_pos = _prefill(PARAMS, SPEC, p, 64)
  cache, logits, pos = _reused(PARAMS, SPEC, PROMPTS[1], p, s, 64, Tn)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(whole_logits), atol=1e-5)
  assert int(pos[0]) == int(whole_pos[0]) == len(p)
  t = len(p) - s
  slots_N = np.concatenate([64 - Tn - s + np.arange(s), 64 - t + np.arange(t)])
  for got, want in zip(_kv_of_tokens(cache, slots_N), _kv_of_tokens(whole_cache, 64 - len(p) + np.arange(len(p)))):
    np.testing.assert_allclose(got, want, atol=1e-5)
  assert int(cache.end) == 64 and np.asarray(cache.segment_BS)[0, :64].sum() == len(p)


@pytest.mark.slow
def test_smollm2_step_prompt_after_a_reused_chat_and_task_head(smollm2):
  """SmolLM2-135M on two chat-templated step prompts of one task: the second prompt's logits after the head it
  shares with the first (chat header, instructions, task) equal its whole prefill's: fp32 within 1e-4 of logits up to
  ~31 (measured 2.9e-5). In bf16 the two differ by rounding (bf16 products over other shapes, in another order,
  and on CPUs with native bf16 their own rounding; 0.27 apart on a Zen 4): the reused prefill must be as close to
  the fp32 logits as the whole bf16 prefill is, within 2x (on the Zen 4 0.18 against 0.23), and pick the same
  top token (the fp32 top two are 1.0 apart)."""
  spec, params, tok = smollm2
  task = ("You are an agent in ScienceWorld. Your task: boil water. For compounds without a boiling point, "
          "combusting the substance is also acceptable. First, focus on the substance. Then, take actions that "
          "will cause it to change its state of matter. ")
  a = tok.encode_chat(task + "Step 1 observation: You are in the kitchen. In it, you see a counter, a sink, a stove.")
  b = tok.encode_chat(task + "Your last step: Step 1 action: look around. Step 2 observation: a fridge, a pot, a jar.")
  shared = prefix.common_prefix(np.asarray(a), np.asarray(b))
  assert 64 <= shared <= 128 and len(b) - shared <= 128 and len(b) <= 192
  got, want = ({dtype: np.asarray(f(dtype)) for dtype in (jnp.float32, jnp.bfloat16)} for f in (
      lambda dtype: _reused(params, spec, a, b, shared, 256, 128, dtype)[1],
      lambda dtype: _prefill(params, spec, b, 256, dtype)[1]))
  np.testing.assert_allclose(got[jnp.float32], want[jnp.float32], atol=1e-4)
  err = lambda x: float(np.abs(x - want[jnp.float32]).max())
  assert err(got[jnp.bfloat16]) <= 2 * err(want[jnp.bfloat16])
  assert np.argmax(got[jnp.bfloat16]) == np.argmax(want[jnp.float32])


def _sampler(mb: int, max_batch: int = 8) -> Sampler:
  return Sampler(SPEC, EOS, SamplerConfig(max_prompt_len=96, min_prompt_bucket=16, max_batch=max_batch,
                                          dtype="float32", prefix_reuse_mb=mb))


_same = functools.partial(slots_test._same, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_sampler_with_shared_heads_samples_what_it_samples_without(temperature):
  """One generate call (static rows) and rows that refill, with heads reused within the call and across fills:
  the same tokens, stop reasons and log-probs (1e-5) as with every prompt prefilled whole, on fewer prompt
  positions: the reused ones are counted apart."""
  sp = SamplingParams(temperature=temperature, max_new_tokens=10)
  ids = [7 * n for n in range(len(PROMPTS))]
  plain = _sampler(0).generate(PARAMS, PROMPTS, jax.random.key(2), sp, row_ids=ids)
  for run in (lambda s: s.generate(PARAMS, PROMPTS, jax.random.key(2), sp, row_ids=ids),
              lambda s: slots.generate(s, PARAMS, PROMPTS, jax.random.key(2), sp, row_ids=ids)):
    whole, reuse = _sampler(0, 4), _sampler(64, 4)
    _same(run(whole), plain)
    _same(run(reuse), plain)
    a, b = whole.tokens, reuse.tokens
    # Prompts 1-3 reuse 40, 32 and 48 tokens, 4 reuses 16: each its shared head, up to the slots before its tail.
    assert a.prompt_reused == 0 and b.prompt_reused == 40 + 32 + 48 + 16
    assert b.prompt_real == a.prompt_real == sum(map(len, PROMPTS))
    assert b.prompt_forwarded < a.prompt_forwarded
    assert reuse.heads is None  # the scope closed with the call


def test_follow_up_turns_reuse_their_episode_head_within_a_budget(monkeypatch):
  """Three turns per row on rows that refill, each turn's prompt the last one + reply + a new observation (a
  rollout's shape): the same as without reuse; with a budget that keeps one prompt's cache at a time, still the
  same, on fewer reused positions."""
  sp = SamplingParams(temperature=1.0, max_new_tokens=6)
  firsts = [HEAD + [10 + n] for n in range(4)]

  def play(s: Sampler):
    out: dict[tuple[int, int], list[int]] = {}

    def on_done(finished):
      nxt = []
      for r, g in finished:
        row, turn = r.tag
        out[(row, turn)] = g.tokens + [round(x, 5) for x in g.logps]
        if turn < 2:
          ids = list(r.ids) + g.tokens + [20 + turn]
          nxt.append(slots.Request(ids, jax.random.fold_in(jax.random.key(5), 10 * row + turn + 1), None, (row, turn + 1)))
      return nxt

    slots.serve(s, PARAMS, [slots.Request(p, jax.random.fold_in(jax.random.key(5), 10 * n), None, (n, 0))
                            for n, p in enumerate(firsts)], sp, on_done)
    return out

  plain, big, small = _sampler(0, 2), _sampler(64, 2), _sampler(64, 2)
  want, got_big = play(plain), play(big)
  made = []
  heads = prefix.Heads
  one = 64 * prefix.slot_bytes(SPEC, jnp.float32)  # a prompt's cache at the 64-token bucket all turns fill
  monkeypatch.setattr(prefix, "Heads", lambda sizes, budget: made.append(heads(sizes, one * 3 // 2)) or made[-1])
  got_small = play(small)
  assert len(made) == 1 and len(made[0].entries) == 1  # the scope kept one prompt's cache at a time
  for got in (got_big, got_small):
    assert got.keys() == want.keys()
    for k in want:
      assert got[k][:len(got[k]) // 2] == want[k][:len(want[k]) // 2]
      np.testing.assert_allclose(got[k], want[k], atol=1e-4)
  assert big.tokens.prompt_reused >= small.tokens.prompt_reused > 0


def test_heads_match_the_longest_shared_head_and_keep_within_the_budget():
  heads = prefix.Heads(min_shared=16, budget_bytes=100)
  assert heads.match(np.arange(50), lambda s: True) is None  # nothing prefilled yet
  a = prefix.Entry(np.arange(60), 60)
  assert heads.keep(a, [])
  assert heads.match(np.arange(50), lambda s: True) == (a, 49)  # one token left to prefill
  assert heads.match(np.arange(50), lambda s: s <= 16) is None  # the tail must fit the call's row
  assert heads.match(np.r_[np.arange(10), 99], lambda s: True) is None  # 10 shared: under min_shared
  b = prefix.Entry(np.r_[np.arange(40), 7, 7], 40)
  assert heads.keep(b, [a]) and heads.entries == [a, b]  # 100 bytes: both fit
  assert heads.match(np.r_[np.arange(40), 7, 7, 7], lambda s: True) == (b, 42)
  assert heads.match(np.r_[np.arange(45), 7], lambda s: True) == (a, 45)  # the longer of the shared heads
  c = prefix.Entry(np.arange(8), 30)
  assert not heads.keep(c, [a, b])  # over the budget, and both are this call's heads
  assert heads.keep(c, [b]) and heads.entries == [b, c]  # the oldest one not in use goes
  assert not heads.keep(prefix.Entry(np.arange(8), 101), [])  # larger than the whole budget
