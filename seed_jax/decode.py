"""The decode loop's device side: per-row state (`Rows`) that advances row by row, so that a finished row can
take a new prompt while the others go on (rows that refill, seed_jax/slots.py), and the token pick.

`decode` runs the rows until all are done, or until one ends when the host wants to refill it; `insert_rows`
puts freshly prefilled prompts into given rows; `grow_rows` makes room for a longer prompt bucket. sample.py's
static call (every row to its end) is start_rows + decode.
"""
from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp

from seed_jax.infra.mesh import constrain
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec

STOP_EOS, STOP_SEQUENCE, STOP_LENGTH, STOP_PADDING = 0, 1, 2, 3
STOP_NAMES = ("eos", "stop_sequence", "max_new_tokens", "padding")


def _pick(logits_BV, keys_B, temperature, top_p, greedy: bool, top_k: int, use_top_p: bool, banned_BV=None):
  """Next token and its log-prob, each row drawn with its own key. Filters (and banned_BV) restrict what can be
  drawn; the returned log-prob is under the full temperature-scaled distribution, which is what re-scoring
  computes (greedy: temperature 1)."""
  ban = (lambda x: x) if banned_BV is None else (lambda x: jnp.where(banned_BV, -jnp.inf, x))
  if greedy:
    tok_B = jnp.argmax(ban(logits_BV), axis=-1)
    logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled_BV = logits_BV / temperature
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    masked_BV = ban(scaled_BV)
    if top_k:
      kth_B1 = jax.lax.top_k(scaled_BV, top_k)[0][:, -1:]
      masked_BV = jnp.where(scaled_BV < kth_B1, -jnp.inf, masked_BV)
    if use_top_p:
      sorted_BV = -jnp.sort(-masked_BV, axis=-1)
      probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
      keep_BV = (jnp.cumsum(probs_BV, axis=-1) - probs_BV) < top_p  # mass before this token < p
      n_keep_B1 = jnp.sum(keep_BV, axis=-1, keepdims=True)
      thresh_B1 = jnp.take_along_axis(sorted_BV, n_keep_B1 - 1, axis=-1)
      masked_BV = jnp.where(masked_BV < thresh_B1, -jnp.inf, masked_BV)
    tok_B = jax.vmap(jax.random.categorical)(keys_B, masked_BV)
  return tok_B.astype(jnp.int32), jnp.take_along_axis(logp_BV, tok_B[:, None], axis=-1)[:, 0]


def repeat_bans(tokens_BN, n_B, ngram: int, vocab: int):
  """[B, V] True where a token would complete an `ngram`-gram the row has already written (HF's
  no_repeat_ngram_size, over the reply's own tokens only: a reply may quote its prompt). Row b has written
  tokens_BN[b, :n_B[b]]; window i (tokens i .. i+ngram-1) bans its last token when its first ngram-1 equal the
  row's last ngram-1 and it lies wholly in what was written."""
  B, N = tokens_BN.shape
  W = N - ngram + 1  # windows that fit the reply buffer
  if W < 1:
    return jnp.zeros((B, vocab), bool)
  hit_BW = jnp.arange(W)[None] <= n_B[:, None] - ngram
  for j in range(ngram - 1):  # window i's j-th token against the row's (ngram-1-j)-th last (ngram 1: every token)
    last_B1 = jnp.take_along_axis(tokens_BN, jnp.clip(n_B - ngram + 1 + j, 0, N - 1)[:, None], axis=1)
    hit_BW = hit_BW & (tokens_BN[:, j:j + W] == last_B1)
  banned_BW = jnp.where(hit_BW, tokens_BN[:, ngram - 1:], vocab)  # vocab: out of range, dropped
  return jnp.zeros((B, vocab), bool).at[jnp.arange(B)[:, None], banned_BW].set(True, mode="drop")


@flax.struct.dataclass
class Rows:
  """The decode state of B rows (slots). Each row advances on its own: its cache end (cache.end [B]; one scalar
  end for rows that started together and never refill), RoPE position and step count are its own, so a finished row can take a new prompt (insert_rows) while the others
  go on. tokens_BN / logps_BN hold the row's sampled ids and log-probs (0 after it ends), lengths_B the tokens
  sampled (also the step its key folds in), reason_B its STOP_* code; `steps` counts the loop's iterations
  (every row computes each one: B x steps slot-steps)."""
  cache: tf.KVCache
  logits_BV: jax.Array
  pos_B: jax.Array
  keys_B: jax.Array
  done_B: jax.Array
  recent_BL: jax.Array
  tokens_BN: jax.Array
  logps_BN: jax.Array
  lengths_B: jax.Array
  reason_B: jax.Array
  steps: jax.Array


def start_rows(cache, logits_UV, pos_U, src_B, is_pad_B, keys_B, stop_len: int, max_new: int) -> Rows:
  """Rows B continuing prefilled rows U: row b takes prefilled row src_B[b] (identical prompts are prefilled
  once; src_B None: row b is row b). is_pad_B marks rows that hold no prompt (done from the start). The cache's
  end stays as given: one for all rows (they advance together) or one per row (rows that refill)."""
  if src_B is not None:
    take = lambda x: jnp.take(x, src_B, axis=0)
    cache = cache.replace(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)), segment_BS=take(cache.segment_BS))
    logits_UV, pos_U = take(logits_UV), take(pos_U)
  B = is_pad_B.shape[0]
  return Rows(cache=cache, logits_BV=logits_UV, pos_B=pos_U, keys_B=keys_B, done_B=is_pad_B,
              recent_BL=jnp.full((B, stop_len), -2, jnp.int32), tokens_BN=jnp.zeros((B, max_new), jnp.int32),
              logps_BN=jnp.zeros((B, max_new), jnp.float32), lengths_B=jnp.zeros((B,), jnp.int32),
              reason_B=jnp.where(is_pad_B, STOP_PADDING, STOP_LENGTH).astype(jnp.int32), steps=jnp.int32(0))


def decode(params, rows: Rows, temperature, top_p, eos_E, stop_NL, stop_on_finish, *, spec: ModelSpec, dtype,
           max_new: int, greedy: bool, top_k: int, use_top_p: bool, no_repeat_ngram: int = 0) -> Rows:
  """Samples on every live row until all are done or, with stop_on_finish, until a row that was live on entry
  ends (the host then reads it and may refill it). Row b draws step n with fold_in(keys_B[b], n). `params`:
  the model's, or prepare_params' for this dtype. no_repeat_ngram > 0: no row writes an n-gram of that length
  twice (repeat_bans).
  eos_E: int32 ids that end a row. stop_NL: int32 stop sequences, right-aligned, padded on the left with -1."""
  cache = rows.cache
  cache = cache.replace(k=tuple(constrain(k, ("batch", "kv_heads", "head_dim", "cache_length")) for k in cache.k),
                        v=tuple(constrain(v, ("batch", "kv_heads", "cache_length", "head_dim")) for v in cache.v))
  B = rows.done_B.shape[0]
  if isinstance(params["layers"], dict):  # stacked: split per layer once, outside the loop (see prepare_params)
    params = tf.decode_params(params, dtype)
  stop_len_N = jnp.sum(stop_NL >= 0, axis=1)
  done_on_entry_B = rows.done_B
  slot_N = jnp.arange(max_new)

  def cond(r: Rows):
    return jnp.any(~r.done_B) & ~(stop_on_finish & jnp.any(r.done_B & ~done_on_entry_B))

  def body(r: Rows):
    n_B = r.lengths_B
    step_keys_B = jax.vmap(jax.random.fold_in)(r.keys_B, n_B)
    banned_BV = (repeat_bans(r.tokens_BN, n_B, no_repeat_ngram, r.logits_BV.shape[-1]) if no_repeat_ngram
                 else None)
    tok_B, logp_B = _pick(r.logits_BV, step_keys_B, temperature, top_p, greedy, top_k, use_top_p, banned_BV)
    live_B = ~r.done_B
    recent_BL = jnp.concatenate([r.recent_BL[:, 1:], tok_B[:, None]], axis=1)
    stop_hit_B = jnp.any(jnp.all((recent_BL[:, None, :] == stop_NL[None]) | (stop_NL[None] < 0), axis=-1)
                         & (stop_len_N > 0)[None], axis=1)
    eos_hit_B = jnp.any(tok_B[:, None] == eos_E[None], axis=1)
    reason_B = jnp.where(eos_hit_B, STOP_EOS, jnp.where(stop_hit_B, STOP_SEQUENCE, STOP_LENGTH))
    ends_B = live_B & (eos_hit_B | stop_hit_B | (n_B + 1 == max_new))
    hidden_B1D, cache = tf.forward(params, spec, tok_B[:, None], r.pos_B[:, None], jnp.ones((B, 1), jnp.int32),
                                   r.cache, dtype)
    at_BN = live_B[:, None] & (slot_N[None] == n_B[:, None])
    return r.replace(
        # With an end per row a finished row's end stays put (its slot waits for a refill); rows that started
        # together share one end (a finished row writes on past its reply, which nothing reads).
        cache=cache if jnp.ndim(cache.end) == 0 else cache.replace(end=jnp.where(live_B, cache.end, r.cache.end)),
        logits_BV=tf.logits_from_hidden(params, spec, hidden_B1D, dtype)[:, 0], pos_B=r.pos_B + 1,
        recent_BL=recent_BL, done_B=r.done_B | ends_B,
        tokens_BN=jnp.where(at_BN, tok_B[:, None], r.tokens_BN), logps_BN=jnp.where(at_BN, logp_B[:, None], r.logps_BN),
        lengths_B=n_B + live_B.astype(jnp.int32), reason_B=jnp.where(ends_B, reason_B, r.reason_B), steps=r.steps + 1)

  return jax.lax.while_loop(cond, body, rows.replace(cache=cache))


# Decode-ready weights (transformer.decode_params) made once for many decode_rows calls, e.g. a refilling
# rollout's, instead of once inside each call: a copy of the weights, held while those calls run.
prepare_params = jax.jit(tf.decode_params, static_argnames=("dtype",))
DECODE_STATIC = ("spec", "dtype", "max_new", "greedy", "top_k", "use_top_p", "no_repeat_ngram")
decode_rows = jax.jit(decode, static_argnames=DECODE_STATIC, donate_argnums=(1,))


@functools.partial(jax.jit, donate_argnums=(0,))
def insert_rows(rows: Rows, cache, logits_UV, pos_U, src_M, slot_M, keys_M) -> Rows:
  """Rows refilled: slot_M[m] takes prefilled row src_M[m] (cache, logits, next position) and key keys_M[m],
  its outputs cleared. A slot_M entry >= B (padding) changes nothing. A prefilled cache of a shorter prompt
  bucket than the rows' moves right to their slot count (its prompt ends where theirs do; the slots in front
  are padding), so a short prompt is prefilled at its own bucket, not at the longest one met so far."""
  cache = front_pad(cache, rows.cache.segment_BS.shape[1] - cache.segment_BS.shape[1])
  put = lambda a, x: a.at[slot_M].set(jnp.take(x, src_M, axis=0).astype(a.dtype), mode="drop")
  clear = lambda a, value: a.at[slot_M].set(value, mode="drop")
  M = slot_M.shape[0]
  c = rows.cache
  cache = c.replace(k=tuple(map(put, c.k, cache.k)), v=tuple(map(put, c.v, cache.v)),
                    segment_BS=put(c.segment_BS, cache.segment_BS),
                    end=clear(c.end, jnp.broadcast_to(cache.end, (M,))))
  return rows.replace(cache=cache, logits_BV=put(rows.logits_BV, logits_UV), pos_B=put(rows.pos_B, pos_U),
                      keys_B=rows.keys_B.at[slot_M].set(keys_M, mode="drop"), done_B=clear(rows.done_B, False),
                      recent_BL=clear(rows.recent_BL, -2), tokens_BN=clear(rows.tokens_BN, 0),
                      logps_BN=clear(rows.logps_BN, 0.0), lengths_B=clear(rows.lengths_B, 0),
                      reason_B=clear(rows.reason_B, STOP_LENGTH))


def front_pad(c: tf.KVCache, pad: int) -> tf.KVCache:
  """`pad` more cache slots in front of every row: keys, values and segments move right by `pad`, the ends
  with them; the empty slots in front are padding (segment 0). RoPE positions are the tokens', not the
  slots', so the rows compute the same numbers."""
  if pad == 0:
    return c
  front = lambda a, axis: jnp.pad(a, [(pad, 0) if i == axis else (0, 0) for i in range(a.ndim)])
  return c.replace(k=tuple(front(k, 3) for k in c.k), v=tuple(front(v, 2) for v in c.v),
                   segment_BS=front(c.segment_BS, 1), end=c.end + pad)


@functools.partial(jax.jit, static_argnames=("pad",))
def grow_rows(rows: Rows, pad: int) -> Rows:
  """`pad` more cache slots in front of every row (a longer prompt bucket), as front_pad."""
  return rows.replace(cache=front_pad(rows.cache, pad))


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "length", "stop_len", "max_new"))
def empty_rows(keys_B, *, spec: ModelSpec, dtype, length: int, stop_len: int, max_new: int) -> Rows:
  """B free rows (done, nothing in their caches) of `length` cache slots, to be filled by insert_rows; keys_B
  only sets the key type."""
  B = keys_B.shape[0]
  cache = tf.KVCache.create(spec, B, length, dtype)
  cache = cache.replace(end=jnp.zeros((B,), jnp.int32))
  return start_rows(cache, jnp.zeros((B, spec.vocab_size), jnp.float32), jnp.zeros((B,), jnp.int32), None,
                    jnp.ones((B,), bool), keys_B, stop_len, max_new)
