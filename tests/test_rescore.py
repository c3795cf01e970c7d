"""The dual-context re-scorer: stacked contexts, row batching, and log-probs against a plain full forward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import sequence_logits

from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec
from seed_jax.rescore import Rescorer, RescorerConfig

SPEC = ModelSpec("LlamaForCausalLM", vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 ffn_dim=96)
PARAMS = tf.init_params(SPEC, 7)
PARAMS["embed"] = PARAMS["embed"] * 40
RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(3, 96, n).tolist() for n in (5, 12, 1, 9)]
RESPONSES = [RNG.integers(3, 96, n).tolist() for n in (4, 9, 1, 16)]


def _rescorer(max_rows=16, vocab_chunk=8):
  return Rescorer(SPEC, 0, RescorerConfig(max_rows=max_rows, min_len_bucket=16, max_prompt_len=32,
                                          max_response_len=16, vocab_chunk=vocab_chunk, dtype="float32"))


def _full_forward_logprobs(prompt, resp, temperature):
  """log_softmax of the unpadded row's full-forward logits, gathered at the response tokens."""
  logits_TV = sequence_logits(PARAMS, SPEC, prompt + resp) / temperature
  logp_TV = np.asarray(jax.nn.log_softmax(jnp.asarray(logits_TV), axis=-1))
  rows = np.arange(len(prompt) - 1, len(prompt) - 1 + len(resp))
  return logp_TV[rows, resp]


def test_two_contexts_in_one_pass_equal_separate_passes():
  rescorer = _rescorer()
  ctx_b = [p + [7, 8, 9] for p in PROMPTS]
  both, ents = rescorer.score(PARAMS, [PROMPTS, ctx_b], RESPONSES, 1.3, with_entropy=True)
  a, ea = rescorer.score(PARAMS, [PROMPTS], RESPONSES, 1.3, with_entropy=True)
  b, _ = rescorer.score(PARAMS, [ctx_b], RESPONSES, 1.3)
  for i in range(4):
    np.testing.assert_allclose(both[0][i], a[0][i], atol=1e-5)
    np.testing.assert_allclose(both[1][i], b[0][i], atol=1e-5)
    np.testing.assert_allclose(ents[0][i], ea[0][i], atol=1e-5)
    assert not np.allclose(both[0][i], both[1][i])
  # Hand check of one token: log-softmax of temperature-scaled full logits.
  logits = sequence_logits(PARAMS, SPEC, PROMPTS[1] + RESPONSES[1]) / 1.3
  r0 = len(PROMPTS[1]) - 1
  expect = logits[r0, RESPONSES[1][0]] - np.log(np.exp(logits[r0] - logits[r0].max()).sum()) - logits[r0].max()
  assert np.isclose(both[0][1][0], expect, atol=1e-5)


@pytest.mark.slow
def test_logprobs_equal_full_forward_log_softmax_at_the_response_tokens():
  ctx_b = [[11] + p for p in PROMPTS]
  # 2 contexts x 4 samples on a re-scorer of 4 rows: several passes; chunk 3 does not divide the response bucket.
  logps, _ = _rescorer(max_rows=4, vocab_chunk=3).score(PARAMS, [PROMPTS, ctx_b], RESPONSES, 0.7)
  for c, ctx in enumerate((PROMPTS, ctx_b)):
    for i, (p, r) in enumerate(zip(ctx, RESPONSES)):
      assert logps[c][i].shape == (len(r),)
      np.testing.assert_allclose(logps[c][i], _full_forward_logprobs(p, r, 0.7), atol=1e-5)
  assert np.mean([np.abs(logps[0][i] - logps[1][i]).max() for i in range(4)]) > 1e-3  # contexts matter


def test_bad_input():
  rescorer = _rescorer()
  with pytest.raises(ValueError, match="one prompt per response"):
    rescorer.score(PARAMS, [PROMPTS[:3]], RESPONSES, 1.0)
  with pytest.raises(ValueError, match="prompt 1 of context 0 is empty"):
    rescorer.score(PARAMS, [[[5], []]], [[1], [2]], 1.0)


def test_token_counts_are_contexts_x_bucketed_rows_and_the_real_lengths():
  ctx_b = [p + [7, 8, 9] for p in PROMPTS[:3]]  # prompts 5, 12, 1 | 8, 15, 4; responses 4, 9, 1
  one_pass = _rescorer()
  one_pass.score(PARAMS, [PROMPTS[:3], ctx_b], RESPONSES[:3], 1.0)
  t = one_pass.tokens  # 2 contexts x 4-row bucket x (16 + 16)
  assert (t.rows_forwarded, t.rows_real) == (8, 6)
  assert (t.prompt_forwarded, t.prompt_real) == (2 * 4 * 16, 18 + 27)
  assert (t.response_forwarded, t.response_real) == (2 * 4 * 16, 2 * 14)
  two_passes = _rescorer(max_rows=4)  # 2 rows per pass of both contexts: buckets of 2 and 1 rows
  two_passes.score(PARAMS, [PROMPTS[:3], ctx_b], RESPONSES[:3], 1.0)
  t = two_passes.tokens
  assert (t.rows_forwarded, t.rows_real, t.forwarded, t.real) == (2 * 3, 6, 2 * 3 * 32, 45 + 28)
