"""The decode-specific code paths of the transformer: the prefill that builds the cache, per-layer weights, and
the one-query attention, each against the plain cache-less forward or a numpy reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.models import attention
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec

SPEC = ModelSpec("Qwen2ForCausalLM", vocab_size=96, dim=64, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=16,
                 ffn_dim=96)
PARAMS = tf.init_params(SPEC, 11)
PARAMS["embed"] = PARAMS["embed"] * 40


def _ragged(rng, lengths, T):
  tokens = np.zeros((len(lengths), T), np.int32)
  valid = np.zeros((len(lengths), T), bool)
  for b, n in enumerate(lengths):
    tokens[b, T - n:] = rng.integers(3, 96, n)
    valid[b, T - n:] = True
  return tokens, valid


@pytest.mark.slow
def test_prefill_then_decode_with_split_weights_equals_full_forward():
  tokens, valid = _ragged(np.random.default_rng(0), [10, 6, 1], 10)
  full = np.asarray(tf.full_logits(PARAMS, SPEC, jnp.asarray(tokens), jnp.asarray(valid)))
  pos = np.asarray(tf.left_pad_positions(jnp.asarray(valid)))
  seg = valid.astype(np.int32)
  h, cache = tf.prefill(PARAMS, SPEC, tokens[:, :7], pos[:, :7], seg[:, :7], length=12)
  assert int(cache.end) == 7 and len(cache.k) == 3 and cache.k[0].shape == (3, 2, 16, 12)
  assert cache.v[0].shape == (3, 2, 12, 16) and not np.asarray(cache.k[1])[..., 7:].any()
  outs = [tf.logits_from_hidden(PARAMS, SPEC, h)]
  split = tf.decode_params(PARAMS, jnp.float32)
  assert isinstance(split["layers"], tuple) and split["layers"][2]["wqkv"].shape == (64, (6 + 2 + 2) * 16)
  assert split["layers"][0]["w_gate_up"].shape == (64, 2 * 96) and split["layers"][0]["bqkv"].shape == (160,)
  for t in range(7, 10):
    h, cache = tf.forward(split, SPEC, tokens[:, t:t + 1], pos[:, t:t + 1], seg[:, t:t + 1], cache)
    outs.append(tf.logits_from_hidden(PARAMS, SPEC, h))
  cached = np.concatenate([np.asarray(o) for o in outs], axis=1)
  assert int(cache.end) == 10
  assert np.abs(cached[valid] - full[valid]).max() <= 1e-4
  with pytest.raises(ValueError, match="cache length 5 is shorter than the prompt \\(7 tokens\\)"):
    tf.prefill(PARAMS, SPEC, tokens[:, :7], pos[:, :7], seg[:, :7], length=5)


def _reference_attention(q_BKGh, k_BKhS, v_BKSh, mask_BS):
  s = np.einsum("bkgh,bkhs->bkgs", q_BKGh, k_BKhS) / np.sqrt(q_BKGh.shape[-1])
  s = np.where(mask_BS[:, None, None], s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bkgs,bksh->bkgh", p, v_BKSh)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_one_query_attention_equals_reference(dtype, tol):
  rng = np.random.default_rng(1)
  B, K, G, h, S = 2, 2, 3, 16, 9
  q = rng.normal(size=(B, 1, K, G, h)).astype(np.float32)
  k = rng.normal(size=(B, K, h, S)).astype(np.float32)
  v = rng.normal(size=(B, K, S, h)).astype(np.float32)
  mask = np.ones((B, 1, S), bool)
  mask[0, 0, :4] = False  # row 0: left padding
  mask[1, 0, 7:] = False  # row 1: empty slots after the current one
  cast = lambda x: jnp.asarray(x).astype(dtype)
  out = np.asarray(attention.cache_attention(cast(q), cast(k), cast(v), jnp.asarray(mask), dtype), np.float32)
  ref = _reference_attention(q[:, 0], k, v, mask[:, 0])
  assert out.shape == (B, 1, K, G, h)
  assert np.abs(out[:, 0] - ref).max() <= tol
  # The one-query path agrees with the general (batched-dot) path on the same inputs.
  two = np.asarray(attention.cache_attention(cast(np.repeat(q, 2, 1)), cast(k), cast(v),
                                            jnp.asarray(np.repeat(mask, 2, 1)), dtype), np.float32)
  assert np.abs(two[:, 0] - out[:, 0]).max() <= tol


def test_blocked_causal_attention_equals_reference_across_blocks():
  # 300 tokens: three query blocks of 128/128/44; row 0 is left-padded, row 1 packs two segments.
  rng = np.random.default_rng(2)
  B, T, K, G, h = 2, 300, 1, 2, 8
  assert T > 2 * attention.QUERY_BLOCK
  q = rng.normal(size=(B, T, K, G, h)).astype(np.float32)
  k = rng.normal(size=(B, T, K, h)).astype(np.float32)
  v = rng.normal(size=(B, T, K, h)).astype(np.float32)
  seg = np.ones((B, T), np.int32)
  seg[0, :50] = 0
  seg[1, 150:] = 2
  t = np.arange(T)
  mask = (t[None, :, None] >= t[None, None, :]) & (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
  out = np.asarray(attention.dense_causal_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask),
                                                    jnp.float32))
  for b in range(B):
    for r in (0, 127, 128, 151, 299):  # block edges and the first tokens of a segment
      if seg[b, r] == 0:
        continue
      ref = _reference_attention(q[b:b + 1, r, :, :, :], k[b:b + 1].transpose(0, 2, 3, 1), v[b:b + 1].transpose(0, 2, 1, 3),
                                 mask[b:b + 1, r])
      assert np.abs(out[b, r] - ref[0]).max() <= 1e-5, (b, r)
  # Token 150 of row 1 starts segment 2: it sees only itself, so its output is its own value.
  np.testing.assert_allclose(out[1, 150, 0], np.repeat(v[1, 150, 0][None], G, 0), atol=1e-6)
