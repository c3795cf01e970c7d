"""The jitted sampler on a tiny random model (and, sharded, the re-scorer next to it)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import jitted_full_logits, sequence_logits

from seed_jax.infra.mesh import make_mesh, sharding_tree
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec
from seed_jax.rescore import Rescorer, RescorerConfig
from seed_jax import slots
from seed_jax.decode import _pick, repeat_bans
from seed_jax.sample import Sampler, SamplerConfig, SamplingParams, generate_tokens

SPEC = ModelSpec("LlamaForCausalLM", vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn_dim=96)
PARAMS = tf.init_params(SPEC, 7)
# Larger logits than the 0.02-init gives, so sampled sequences are diverse but not uniform noise.
PARAMS["embed"] = PARAMS["embed"] * 40
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(3, 96, n).tolist() for n in (5, 12, 1, 9)]


def _sampler(**kw):
  return Sampler(SPEC, [], SamplerConfig(max_prompt_len=32, min_prompt_bucket=16, max_batch=kw.pop("max_batch", 8),
                                         dtype=kw.pop("dtype", "float32"), **kw), kw.pop("mesh", None))


@pytest.mark.slow
def test_kv_cache_decode_matches_full_forward_with_ragged_padding():
  tokens = np.zeros((3, 12), np.int32)
  valid = np.zeros((3, 12), bool)
  for b, n in enumerate((12, 7, 3)):
    tokens[b, 12 - n:] = RNG.integers(3, 96, n)
    valid[b, 12 - n:] = True
  full = np.asarray(jitted_full_logits()(PARAMS, SPEC, jnp.asarray(tokens), jnp.asarray(valid)))
  # Prefill the first 8 columns, then decode the last 4 one at a time through the cache (one jitted program per
  # width: eagerly, every op would be its own).
  step = jax.jit(lambda p, *a: (lambda h, c: (tf.logits_from_hidden(p, SPEC, h), c))(*tf.forward(p, SPEC, *a)))
  cache = tf.KVCache.create(SPEC, 3, 16)
  pos = np.asarray(tf.left_pad_positions(jnp.asarray(valid)))
  logits, cache = step(PARAMS, tokens[:, :8], pos[:, :8], valid[:, :8].astype(np.int32), cache)
  outs = [logits]
  for t in range(8, 12):
    logits, cache = step(PARAMS, tokens[:, t:t + 1], pos[:, t:t + 1], valid[:, t:t + 1].astype(np.int32), cache)
    outs.append(logits)
  cached = np.concatenate([np.asarray(o) for o in outs], axis=1)
  assert np.abs(cached[valid] - full[valid]).max() <= 1e-4


def _greedy_reference(prompt, n):
  out = list(prompt)
  for _ in range(n):
    out.append(int(np.argmax(sequence_logits(PARAMS, SPEC, out)[-1])))
  return out[len(prompt):]


@pytest.mark.slow
def test_greedy_equals_stepwise_argmax_and_logps_equal_rescore():
  gens = _sampler().generate(PARAMS, PROMPTS, jax.random.key(0), SamplingParams(temperature=0, max_new_tokens=6))
  for p, g in zip(PROMPTS, gens):
    assert g.tokens == _greedy_reference(p, 6) and g.stop_reason == "max_new_tokens"
  # Sampled log-probs at a temperature equal the re-scorer's for the same tokens.
  sp = SamplingParams(temperature=0.7, max_new_tokens=10)
  gens = _sampler().generate(PARAMS, PROMPTS, jax.random.key(1), sp)
  rescorer = Rescorer(SPEC, 0, RescorerConfig(max_rows=8, min_len_bucket=16, max_prompt_len=32, max_response_len=16,
                                              vocab_chunk=4, dtype="float32"))
  logps, _ = rescorer.score(PARAMS, [PROMPTS], [g.tokens for g in gens], 0.7)
  for g, lp in zip(gens, logps[0]):
    np.testing.assert_allclose(lp, g.logps, atol=1e-4)


def test_repeat_bans_ban_the_token_that_would_repeat_a_written_ngram():
  toks_BN = jnp.asarray([[1, 2, 3, 1, 2, 0, 0, 0],   # last two (1, 2) began "1 2 3": 3 is banned
                         [1, 2, 3, 1, 0, 0, 0, 0],   # last two (3, 1) never began a written 3-gram
                         [4, 4, 4, 0, 0, 0, 0, 0],   # overlapping: (4, 4) began "4 4 4"
                         [1, 2, 0, 0, 0, 0, 0, 0]])  # "2 0" is padding, not a written 3-gram
  bans = np.asarray(repeat_bans(toks_BN, jnp.asarray([5, 4, 3, 2]), 3, 6))
  assert [np.flatnonzero(b).tolist() for b in bans] == [[3], [], [4], []]
  assert not np.asarray(repeat_bans(toks_BN, jnp.asarray([5, 4, 3, 2]), 9, 6)).any()  # longer than the buffer
  ones = np.asarray(repeat_bans(toks_BN, jnp.asarray([5, 4, 3, 2]), 1, 6))  # 1-grams: every token written
  assert [np.flatnonzero(b).tolist() for b in ones] == [[1, 2, 3], [1, 2, 3], [4], [1, 2]]


def _greedy_no_repeat_reference(prompt, n, ngram):
  """Greedy decoding by full forwards, each step's argmax over the tokens that write no n-gram twice in the reply;
  also the full-distribution log-prob of each pick and whether any step's free argmax was banned."""
  out, logps, fired = [], [], False
  for _ in range(n):
    logits = sequence_logits(PARAMS, SPEC, list(prompt) + out)[-1].astype(np.float64)
    seen = {tuple(out[i:i + ngram]) for i in range(len(out) - ngram + 1)}
    allowed = [t for t in range(len(logits)) if tuple(out[len(out) - ngram + 1:] + [t]) not in seen]
    tok = max(allowed, key=lambda t: logits[t])
    fired |= tok != int(np.argmax(logits))
    logps.append(logits[tok] - np.log(np.exp(logits - logits.max()).sum()) - logits.max())
    out.append(tok)
  return out, logps, fired


@pytest.mark.slow
def test_no_repeat_ngram_samples_what_a_stepwise_greedy_reference_picks():
  """The tiny model's greedy replies loop; with no_repeat_ngram=3 the static sampler and rows that refill write
  the reference's tokens (no 3-gram twice), each log-prob under the unfiltered distribution."""
  sp = SamplingParams(temperature=0, max_new_tokens=24, no_repeat_ngram=3)
  prompts = PROMPTS[:3]
  static = _sampler().generate(PARAMS, prompts, jax.random.key(0), sp)
  refilled = slots.generate(_sampler(max_batch=2), PARAMS, prompts, jax.random.key(0), sp)
  fired = False
  for p, g, r in zip(prompts, static, refilled):
    want, want_logps, f = _greedy_no_repeat_reference(p, 24, 3)
    fired |= f
    assert g.tokens == want and r.tokens == want
    np.testing.assert_allclose(g.logps, want_logps, atol=1e-4)
    np.testing.assert_allclose(r.logps, g.logps, atol=1e-6)
    grams = [tuple(want[i:i + 3]) for i in range(len(want) - 2)]
    assert len(grams) == len(set(grams))
  assert fired  # the ban changed some pick: without it the replies repeat


def test_fixed_key_reproduces_and_keys_differ():
  s, sp = _sampler(), SamplingParams(temperature=1.0, max_new_tokens=12)
  a = s.generate(PARAMS, PROMPTS, jax.random.key(3), sp)
  b = s.generate(PARAMS, PROMPTS, jax.random.key(3), sp)
  c = s.generate(PARAMS, PROMPTS, jax.random.key(4), sp)
  assert [g.tokens for g in a] == [g.tokens for g in b]
  assert [g.tokens for g in a] != [g.tokens for g in c]


def test_top_k_and_top_p_never_leave_the_allowed_set():
  # probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (and ~0 for the rest)
  probs = np.array([0.4, 0.3, 0.15, 0.1, 0.05] + [1e-9] * 11)
  logits = jnp.asarray(np.log(probs)[None].repeat(256, 0), jnp.float32)
  draw = lambda **kw: np.asarray(jax.vmap(lambda k: _pick(logits[:1], k[None], jnp.float32(1.0), kw.get("p", 1.0), False,
                                                          kw.get("k", 0), kw.get("p", 1.0) < 1)[0][0])(
      jax.random.split(jax.random.key(0), 4000)))
  assert set(draw(k=2).tolist()) == {0, 1}
  assert set(draw(p=0.7).tolist()) == {0, 1}  # 0.4 + 0.3 reaches 0.7: nothing after
  assert set(draw(p=0.71).tolist()) == {0, 1, 2}
  assert set(draw(k=3, p=0.5).tolist()) == {0, 1}
  tok, logp = _pick(logits[:1], jax.random.key(0)[None], jnp.float32(1.0), 0.5, False, 3, True)
  assert np.isclose(float(logp[0]), np.log(probs[int(tok[0])] / probs.sum()), atol=1e-5)  # full-distribution logp


def test_eos_and_stop_sequences_end_rows_independently():
  sp = SamplingParams(temperature=0, max_new_tokens=10)
  free = _sampler().generate(PARAMS, PROMPTS[:2], jax.random.key(0), sp)
  eos = free[0].tokens[3]
  stop = free[1].tokens[4:6]
  eos_end = free[0].tokens.index(eos) + 1
  s = Sampler(SPEC, [eos], SamplerConfig(max_prompt_len=32, min_prompt_bucket=16, max_batch=8, dtype="float32"))
  out = s.generate(PARAMS, PROMPTS[:2], jax.random.key(0), sp, stop_sequences=[stop])
  assert out[0].tokens == free[0].tokens[:eos_end] and out[0].stop_reason == "eos"
  seq = free[1].tokens
  stop_end = next(i + 2 for i in range(len(seq) - 1) if seq[i:i + 2] == stop)
  if eos in seq[:stop_end]:
    pytest.skip("constructed eos also occurs in row 1")
  assert out[1].tokens == seq[:stop_end] and out[1].stop_reason == "stop_sequence"
  assert len(out[1].logps) == len(out[1].tokens)


def test_bad_input_and_oversized_batches():
  s = _sampler(max_batch=2)
  sp = SamplingParams(temperature=0, max_new_tokens=3)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    s.generate(PARAMS, [[5], []], jax.random.key(0), sp)
  with pytest.raises(ValueError, match="no_repeat_ngram >= 0"):
    SamplingParams(no_repeat_ngram=-1)
  with pytest.raises(ValueError, match="prompt 0 has 40 tokens, more than sampler max_prompt_len=32"):
    s.generate(PARAMS, [[5] * 40], jax.random.key(0), sp)
  with pytest.raises(ValueError, match="top_p"):
    SamplingParams(top_p=0.0)
  # 4 prompts on a sampler whose largest batch is 2: two calls, same results as one by one.
  many = s.generate(PARAMS, PROMPTS, jax.random.key(0), sp)
  assert [g.tokens for g in many] == [s.generate(PARAMS, [p], jax.random.key(0), sp)[0].tokens for p in PROMPTS]
  assert s.compiles.count == 4  # batch buckets 2 and 1, one prompt bucket: a prefill and a decode program each


def test_samples_do_not_depend_on_how_a_request_is_split_into_calls():
  """Row r draws with fold_in(key, r) whatever call it lands in: max_batch 2 (three calls) and 8 (one call)
  sample the same tokens (log-probs within 1e-6: the prefill runs over other row counts), so max_batch is a
  memory setting only."""
  sp = SamplingParams(temperature=1.0, max_new_tokens=6)
  prompts = PROMPTS + PROMPTS[:2]
  small = _sampler(max_batch=2).generate(PARAMS, prompts, jax.random.key(5), sp)
  big = _sampler(max_batch=8).generate(PARAMS, prompts, jax.random.key(5), sp)
  assert [g.tokens for g in small] == [g.tokens for g in big]
  for a, b in zip(small, big):
    np.testing.assert_allclose(a.logps, b.logps, atol=1e-6)
  assert len({tuple(g.tokens) for g in big}) == len(prompts)


def test_token_counts_are_the_bucketed_slots_and_the_real_lengths():
  sp = SamplingParams(temperature=0, max_new_tokens=6)
  free = _sampler().generate(PARAMS, PROMPTS[:3], jax.random.key(0), sp)
  # Each row's third token ends it (or an earlier one that is another row's third), so the loop stops early.
  s = Sampler(SPEC, [g.tokens[2] for g in free], SamplerConfig(max_prompt_len=32, min_prompt_bucket=16,
                                                               max_batch=2, dtype="float32"))
  out = s.generate(PARAMS, PROMPTS[:3], jax.random.key(0), sp)
  lens = [len(g.tokens) for g in out]
  assert max(lens) <= 3 < sp.max_new_tokens
  # Batches of 2 and 1 rows (prompts 5, 12 | 1), each in the 16-token prompt bucket.
  t = s.tokens
  assert (t.rows_forwarded, t.rows_real) == (3, 3)
  assert (t.prompt_forwarded, t.prompt_real) == (2 * 16 + 1 * 16, 5 + 12 + 1)
  assert t.response_forwarded == 2 * max(lens[:2]) + 1 * lens[2] and t.response_real == sum(lens)
  assert t.decode_steps == max(lens[:2]) + lens[2]  # one loop per batch, to its longest row
  assert t.forwarded == t.prompt_forwarded + t.response_forwarded and t.real == 18 + sum(lens)
  before = t.copy()
  s.generate(PARAMS, PROMPTS[3:], jax.random.key(0), sp)  # one 9-token prompt: 1 row x 16
  d = s.tokens - before
  assert (d.rows_forwarded, d.prompt_forwarded, d.prompt_real) == (1, 16, 9) and before.rows_real == 3


def test_identical_prompts_are_prefilled_once_and_sample_as_if_each_had_its_own():
  """A group's G rollouts start from one prompt: it is prefilled once and its cache copied to its rows. Every
  row's tokens equal the undeduplicated generate_tokens' on the same padded batch and key (same logits per row,
  same draws), log-probs within 1e-6 (prefill over fewer rows), and the prefill counts the distinct rows only."""
  prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[0], PROMPTS[1]]
  sp = SamplingParams(temperature=1.0, max_new_tokens=6)
  s = _sampler()
  out = s.generate(PARAMS, prompts, jax.random.key(4), sp)
  tokens_BP, valid_BP = np.zeros((8, 16), np.int32), np.zeros((8, 16), bool)
  for b, p in enumerate(prompts):
    tokens_BP[b, 16 - len(p):], valid_BP[b, 16 - len(p):] = p, True
  toks, logps, lens, _ = generate_tokens(
      PARAMS, tokens_BP, valid_BP, jax.random.key(4), jnp.float32(1.0), jnp.float32(1.0), jnp.asarray([-1], jnp.int32),
      jnp.full((1, 1), -1, jnp.int32), spec=SPEC, dtype=jnp.float32, max_new=6, greedy=False, top_k=0,
      use_top_p=False)
  for b, g in enumerate(out):
    assert g.tokens == toks[b, :lens[b]].tolist()
    np.testing.assert_allclose(g.logps, logps[b, :lens[b]], atol=1e-6)
  assert len({tuple(g.tokens) for g in out[::2]}) > 1  # rows of one prompt still draw their own tokens
  assert (s.tokens.prompt_forwarded, s.tokens.prompt_real, s.tokens.rows_forwarded) == (2 * 16, 5 + 12, 8)
  assert s.times["prefill_s"] > 0 and s.times["decode_s"] > 0


class _CharTokenizer:
  """One id per character; the chat template wraps the message in two marker ids."""

  def encode_chat(self, text):
    return [1] + [3 + ord(c) % 90 for c in text] + [2]

  def decode(self, ids):
    return "-".join(map(str, ids))


def test_generate_text_and_rollout_fn_are_generate_with_their_arguments_bound():
  s, tok = _sampler(), _CharTokenizer()
  sp = SamplingParams(temperature=0.9, max_new_tokens=7)
  texts = ["boil water", "go", "open the door"]
  direct = s.generate(PARAMS, [tok.encode_chat(t) for t in texts], jax.random.key(2), sp, [[50, 51]])
  replies = s.generate_text(PARAMS, texts, jax.random.key(2), sp, tok, stop_sequences=[[50, 51]])
  assert replies == [tok.decode(g.tokens) for g in direct] and len(set(replies)) == 3
  bound = s.rollout_fn(PARAMS, sp, [[50, 51]])([tok.encode_chat(t) for t in texts], jax.random.key(2))
  assert [(g.tokens, g.logps, g.stop_reason) for g in bound] == [(g.tokens, g.logps, g.stop_reason) for g in direct]
  assert s.generate_text(PARAMS, texts, jax.random.key(3), sp, tok, [[50, 51]]) != replies  # the key is used


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 4, 1), (1, 2, 4)])
def test_sharded_sampling_and_rescoring_equal_single_device(shape):
  spec = ModelSpec("Qwen2ForCausalLM", vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16,
                   ffn_dim=128)
  params = tf.init_params(spec, 1)
  params["embed"] = params["embed"] * 40
  prompts = PROMPTS + [p[::-1] for p in PROMPTS]
  sp = SamplingParams(temperature=1.0, max_new_tokens=8)
  cfg = SamplerConfig(max_prompt_len=32, min_prompt_bucket=16, max_batch=8, dtype="float32")
  single = Sampler(spec, [], cfg).generate(params, prompts, jax.random.key(5), sp)
  mesh = make_mesh(shape)
  sharded_params = jax.device_put(params, sharding_tree(tf.param_axes(spec), params, mesh))
  sharded = Sampler(spec, [], cfg, mesh).generate(sharded_params, prompts, jax.random.key(5), sp)
  assert [g.tokens for g in sharded] == [g.tokens for g in single]
  for g1, g2 in zip(single, sharded):
    np.testing.assert_allclose(g1.logps, g2.logps, atol=1e-5)
  rcfg = RescorerConfig(max_rows=16, min_len_bucket=16, max_prompt_len=32, max_response_len=16, vocab_chunk=128,
                        dtype="float32")
  resp = [g.tokens for g in single]
  lp1, _ = Rescorer(spec, 0, rcfg).score(params, [prompts, prompts[::-1]], resp, 1.0)
  lp2, _ = Rescorer(spec, 0, rcfg, mesh).score(sharded_params, [prompts, prompts[::-1]], resp, 1.0)
  for c in range(2):
    for i in range(len(resp)):
      np.testing.assert_allclose(lp1[c][i], lp2[c][i], atol=1e-5)


@pytest.mark.parametrize("attention", ["blocked", "xla_blockwise"])
def test_chunked_prefill_samples_what_the_whole_prompt_prefill_samples(attention):
  """Prompts of up to 29 tokens (bucket 32) prefilled in chunks of 8 or 12 (a shorter first chunk), over the
  cache tiled by 8 slots or materialized: the same sampled tokens and log-probs as one pass over the prompt."""
  spec = dataclasses.replace(SPEC, attention=attention, attention_block=8)
  prompts = [RNG.integers(3, 96, n).tolist() for n in (29, 17, 3)]
  sp = SamplingParams(temperature=0.8, max_new_tokens=7)
  make = lambda chunk: Sampler(spec, [], SamplerConfig(max_prompt_len=32, min_prompt_bucket=16, max_batch=4,
                                                       dtype="float32", prefill_chunk=chunk))
  whole = make(0).generate(PARAMS, prompts, jax.random.key(3), sp)
  for chunk in (8, 12):
    chunked = make(chunk).generate(PARAMS, prompts, jax.random.key(3), sp)
    for a, b in zip(whole, chunked):
      assert a.tokens == b.tokens
      np.testing.assert_allclose(a.logps, b.logps, atol=1e-5)
