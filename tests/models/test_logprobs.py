"""The shared log-prob core: entropies by hand, and response/token log-probs against a plain full forward."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import jitted_full_logits, sequence_logits

from seed_jax.models import logprobs as lp
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec

SPEC = ModelSpec("Qwen3ForCausalLM", vocab_size=80, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                 ffn_dim=48)
PARAMS = tf.init_params(SPEC, 3)
PARAMS["embed"] = PARAMS["embed"] * 30  # peaked distributions, so wrong positions give clearly wrong numbers


def close(a, b, tol=1e-6):
  np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


def test_entropy():
  logits = jnp.array([[[0., 0., 0., 0.], [0., math.log(3.), -jnp.inf, -jnp.inf],
                       [0., 0., -jnp.inf, -jnp.inf], [1000., 1000., -1000., -1000.]]])
  # ln 4; −(¼ ln ¼ + ¾ ln ¾); ln 2; ln 2.
  close(lp.entropy_from_logits_BT(logits), [[1.3862944, 0.5623351, 0.6931472, 0.6931472]])
  close(lp.entropy_BT(logits * 2.0, temperature=2.0), [[1.3862944, 0.5623351, 0.6931472, 0.6931472]])
  grad = jax.grad(lambda x: lp.entropy_from_logits_BT(x).sum())(logits)
  assert np.isfinite(np.asarray(grad)).all()
  close(grad[0, 2], [0., 0., 0., 0.])  # uniform over two tokens: a maximum


def _ragged(seed=0, prompt_lens=(6, 2, 4), resp_lens=(5, 1, 3), P=6, R=5):
  rng = np.random.default_rng(seed)
  B = len(prompt_lens)
  prompt, pvalid = np.zeros((B, P), np.int32), np.zeros((B, P), bool)
  resp, rmask = np.zeros((B, R), np.int32), np.zeros((B, R), bool)
  for b, (n, r) in enumerate(zip(prompt_lens, resp_lens)):
    prompt[b, P - n:], pvalid[b, P - n:] = rng.integers(1, 80, n), True
    resp[b, :r], rmask[b, :r] = rng.integers(1, 80, r), True
  return prompt, pvalid, resp, rmask


def _reference(prompt, pvalid, resp, rmask, temperature):
  """Each row alone, unpadded: log_softmax of its full-forward logits gathered at the response tokens."""
  logp, ent = np.zeros(resp.shape), np.zeros(resp.shape)
  for b in range(resp.shape[0]):
    p, r = prompt[b][pvalid[b]].tolist(), resp[b][rmask[b]].tolist()
    logits_TV = sequence_logits(PARAMS, SPEC, p + r) / temperature
    logits_RV = logits_TV[len(p) - 1:len(p) - 1 + len(r)]
    all_RV = np.asarray(jax.nn.log_softmax(jnp.asarray(logits_RV), axis=-1))
    logp[b, :len(r)] = all_RV[np.arange(len(r)), r]
    ent[b, :len(r)] = -(np.exp(all_RV) * all_RV).sum(-1)
  return logp, ent


@pytest.mark.slow
def test_response_logprobs_equal_each_row_alone():
  batch = _ragged()
  want_logp, want_ent = _reference(*batch, 1.3)
  for chunk in (2, 5):  # 2 does not divide R=5: the last chunk is padded
    logp, ent = lp.response_logprobs(PARAMS, SPEC, *map(jnp.asarray, batch), 1.3, dtype=jnp.float32, chunk=chunk)
    close(logp, want_logp, 1e-5)
    close(ent, want_ent, 1e-5)
  assert float(np.abs(want_logp).min(where=batch[3], initial=np.inf)) > 1e-3  # real, non-trivial values
  _, no_ent = lp.response_logprobs(PARAMS, SPEC, *map(jnp.asarray, batch), 1.3, dtype=jnp.float32, chunk=2,
                                   with_entropy=False)
  assert np.all(np.asarray(no_ent) == 0.)


@pytest.mark.slow
def test_token_logprobs_remat_gives_the_same_values_and_gradients():
  prompt, pvalid, resp, rmask = map(jnp.asarray, _ragged(seed=1))

  def total(p, remat):
    logp, ent = lp.response_logprobs(p, SPEC, prompt, pvalid, resp, rmask, 0.8, dtype=jnp.float32, chunk=2,
                                     remat=remat)
    return jnp.sum(logp) + 0.1 * jnp.sum(ent)

  v0, g0 = jax.value_and_grad(total)(PARAMS, False)
  v1, g1 = jax.value_and_grad(total)(PARAMS, True)
  close(v1, v0, 1e-6)
  jax.tree.map(lambda a, b: close(a, b, 1e-5), g1, g0)
  assert float(jnp.abs(g0["embed"]).max()) > 0.


def test_sequence_logits_equal_the_unpadded_forward():
  """The tests' reference helper: a sequence left-padded to one length gives its unpadded full-forward logits."""
  full_logits = jitted_full_logits()
  for n in (1, 20):
    seq = np.random.default_rng(n).integers(1, 80, n).tolist()
    t = jnp.asarray([seq])
    close(sequence_logits(PARAMS, SPEC, seq, length=32), full_logits(PARAMS, SPEC, t, jnp.ones_like(t, bool))[0],
          tol=1e-5)
