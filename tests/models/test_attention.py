"""Blockwise causal attention (models/attention.py) and the Pallas splash kernel (in Pallas' interpreter) against
the materialized softmax: outputs and gradients with left padding, packed segments, grouped-query heads, a
length that is not a multiple of the tile, bf16, a mesh; the transformer's forward and a training gradient with
attention="xla_blockwise" / "splash" equal the "blocked" path; and the blockwise gradient's compiled memory grows
linearly with the length where the materialized path's grows quadratically."""
import collections
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.models import attention
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec


def _reference(q, k, v, seg):
  """Materialized masked softmax attention in fp32; padding rows 0 (as the blockwise path returns them)."""
  T, h = q.shape[1], q.shape[-1]
  t = jnp.arange(T)
  mask = (t[:, None] >= t[None, :])[None] & (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
  s = jnp.einsum("btkgh,bskh->bkgts", q * h ** -0.5, k)
  p = jax.nn.softmax(jnp.where(mask[:, None, None], s, -1e30), axis=-1)
  return jnp.where((seg > 0)[:, :, None, None, None], jnp.einsum("bkgts,bskh->btkgh", p, v), 0.0)


def _grads(fn, w, q, k, v):
  """d/d(q, k, v) of sum(fn(q, k, v) * w), one jitted program (eagerly, every op of the tile loop would be its
  own)."""
  return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w), (0, 1, 2)))(q, k, v)


def _inputs(T=45, B=2, K=2, G=3, h=8, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((B, T, K, G, h), (B, T, K, h), (B, T, K, h)))
  seg = np.ones((B, T), np.int32)
  seg[0, :7] = 0  # left padding
  seg[1, 20:], seg[1, 33:], seg[1, 40:] = 2, 3, 0  # three packed segments and a padded tail
  w = jnp.asarray(rng.normal(size=(B, T, K, G, h)), jnp.float32) * (seg > 0)[:, :, None, None, None]
  return q, k, v, jnp.asarray(seg), w


@pytest.mark.parametrize("block", [pytest.param(8, marks=pytest.mark.slow), 16, 64])  # 8: the most tiles
def test_values_and_gradients_equal_the_materialized_softmax(block):
  q, k, v, seg, w = _inputs()
  fn = lambda q, k, v: attention.blockwise_causal_attention(q, k, v, seg, block=block)
  np.testing.assert_allclose(jax.jit(fn)(q, k, v), _reference(q, k, v, seg), atol=2e-6)
  got = _grads(fn, w, q, k, v)
  want = _grads(lambda q, k, v: _reference(q, k, v, seg), w, q, k, v)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=5e-6)


@pytest.mark.slow
def test_packed_rows_skip_the_tiles_of_other_segments():
  """One packed row per batch: key blocks before a query block's earliest segment and query blocks after a key
  block's last segment are never visited, and the result is unchanged, also when a segment id recurs later in
  its row (it may then attend across the gap, as the materialized mask lets it)."""
  seg = np.zeros((1, 48), np.int32)
  seg[0, :20], seg[0, 20:33], seg[0, 33:40] = 1, 2, 3  # padded tail 40..47
  lo, hi = attention.block_ranges(jnp.asarray(seg), 8)
  assert lo.tolist() == [0, 0, 0, 2, 2, 6] and hi.tolist() == [2, 2, 4, 4, 4, -1]
  recurring = np.array([[1] * 10 + [2] * 14 + [1] * 8 + [3] * 16], np.int32)
  for s in (seg, recurring):
    q, k, v, _, w = (x[:1] for x in _inputs(T=48))
    s = jnp.asarray(s)
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32) * (s > 0)[:, :, None, None, None]
    fn = lambda q, k, v: attention.blockwise_causal_attention(q, k, v, s, block=8)
    np.testing.assert_allclose(jax.jit(fn)(q, k, v), _reference(q, k, v, s), atol=2e-6)
    got = _grads(fn, w, q, k, v)
    want = _grads(lambda q, k, v: _reference(q, k, v, s), w, q, k, v)
    for g, r in zip(got, want):
      np.testing.assert_allclose(g, r, atol=5e-6)


def _tree_rows():
  """Two rows of prefix trees as packing.fill_rows lays them out (block 8: several tiles per branch): row 0 a
  head of 19 with three branches (one shares 5 more tokens with the first) then a lone sequence; row 1 one
  head with two branches and padding."""
  from seed_jax import packing
  rng = np.random.default_rng(3)
  tok = lambda n: list(rng.integers(1, 50, n))
  head, more, head_b = tok(19), tok(5), tok(21)
  rows = [[head + more + tok(9), head + more + tok(11), head + tok(10), [60] + tok(5)],
          [head_b + tok(7), head_b + tok(9)]]
  members, shared, seqs = [], {}, []
  for row in rows:  # each row's sequences in token order, as packing.plan_layout places a run of neighbours
    order = packing.prefix_order(row)
    members.append(tuple(len(seqs) + i for i in order.order))
    shared.update({len(seqs) + i: sh for i, sh in zip(order.order, order.shared)})
    seqs += row
  lay = packing.Layout(64, (tuple(members),), 2, len(seqs), tuple(shared[n] for n in range(len(seqs))))
  packed, *_ = packing.fill_rows(lay, seqs, [[1]] * len(seqs), 1)
  return jnp.asarray(packed.segment_WL), jnp.asarray(packed.segment_end_WL)


def _reference_tree(q, k, v, seg, end):
  t = jnp.arange(q.shape[1])
  mask = (t[:, None] >= t[None, :])[None] & attention.visible(seg[:, :, None], seg[:, None, :], end[:, None, :])
  s = jnp.einsum("btkgh,bskh->bkgts", q * q.shape[-1] ** -0.5, k)
  p = jax.nn.softmax(jnp.where(mask[:, None, None], s, -1e30), axis=-1)
  return jnp.where((seg > 0)[:, :, None, None, None], jnp.einsum("bkgts,bskh->btkgh", p, v), 0.0)


@pytest.mark.parametrize("rows_per_step", [0, 1])
def test_prefix_tree_rows_equal_the_materialized_tree_mask(rows_per_step):
  """Packed prefix trees ((ids, ends) segments): the blockwise path's values and gradients equal the
  materialized softmax under `visible` (each query sees its own sequence's path), rows at once or one by one;
  a branch's query tiles skip its sibling's tiles (tiles_meet) and the cuDNN call's mask agrees."""
  seg, end = _tree_rows()
  q, k, v, _, _ = _inputs(T=64, seed=7)
  w = jnp.asarray(np.random.default_rng(8).normal(size=q.shape), jnp.float32) * (seg > 0)[:, :, None, None, None]
  fn = lambda q, k, v: attention.blockwise_causal_attention(q, k, v, (seg, end), block=8,
                                                            rows_per_step=rows_per_step)
  ref = lambda q, k, v: _reference_tree(q, k, v, seg, end)
  np.testing.assert_allclose(jax.jit(fn)(q, k, v), ref(q, k, v), atol=2e-6)
  for g, r in zip(_grads(fn, w, q, k, v), _grads(ref, w, q, k, v)):
    np.testing.assert_allclose(g, r, atol=5e-6)
  meet = np.asarray(attention.tiles_meet(seg, end, 8))
  assert meet.sum() < np.tril(np.ones_like(meet)).sum()  # some tiles below the diagonal are skipped
  fused = lambda q, k, v: attention.fused_causal_attention(q, k, v, (seg, end), implementation="xla")
  np.testing.assert_allclose(jax.jit(fused)(q, k, v), ref(q, k, v), atol=2e-6)


@pytest.mark.parametrize("rows_per_step", [1, 2, 3])
def test_rows_in_steps_equal_all_rows_at_once(rows_per_step):
  """Rows attended a few at a time (each step its own tile ranges) give the all-rows-at-once values and
  gradients to 1e-6 and the materialized softmax's; 3 does not divide 4 rows, so all go at once."""
  q, k, v, seg, w = _inputs(B=4, seed=5)
  seg = seg.at[2, 30:].set(2).at[3, :12].set(0)  # four different segment layouts
  w = w * (seg > 0)[:, :, None, None, None]
  fn = lambda r: (lambda q, k, v: attention.blockwise_causal_attention(q, k, v, seg, block=8, rows_per_step=r))
  stepped = jax.jit(fn(rows_per_step))(q, k, v)
  np.testing.assert_allclose(stepped, _reference(q, k, v, seg), atol=2e-6)
  np.testing.assert_allclose(stepped, jax.jit(fn(0))(q, k, v), atol=1e-6)
  got = _grads(fn(rows_per_step), w, q, k, v)
  for g, r in zip(got, _grads(fn(0), w, q, k, v)):
    np.testing.assert_allclose(g, r, atol=1e-6)


def test_row_steps_under_a_mesh_stay_inside_each_shard():
  """8 rows over 4 batch shards (data x fsdp), one row per shard per step: equal to one device, and the
  compiled program moves no activations between devices: its only collectives are on the int32 tile ranges
  (block_ranges' min / max over the step's rows), none on q, k, v or the output."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  from seed_jax.infra.mesh import make_mesh
  q, k, v, seg, w = _inputs(T=64, B=8, seed=7)
  single = attention.blockwise_causal_attention(q, k, v, seg, block=16)
  mesh = make_mesh((2, 2, 2))
  rows = lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"))))
  fn = jax.jit(lambda *a: attention.blockwise_causal_attention(*a, block=16, rows_per_step=1))
  with jax.set_mesh(mesh):
    args = tuple(map(rows, (q, k, v, seg)))
    hlo = fn.lower(*args).compile().as_text()
    sharded = fn(*args)
  np.testing.assert_allclose(sharded, single, atol=1e-6)
  collectives = [line for line in hlo.splitlines()
                 if re.search(r"= \S+ (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)\(", line)]
  assert collectives and all(re.search(r"= (s32|\(s32)", line) for line in collectives), collectives


def _remat_case(capsys):
  """A 2-layer blockwise model on a 2 x 40 batch: its params, its loss by remat setting, what its layer scan keeps
  for the backward by remat setting (shapes, counted), and a check that a setting's gradient is the one without
  remat."""
  spec = dataclasses.replace(SPEC, attention="xla_blockwise", attention_block=16)
  params = tf.init_params(spec, 0)
  B, T = 2, 40
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 96, (B, T)), jnp.int32)
  pos, seg = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)), jnp.ones((B, T), jnp.int32)
  loss = lambda remat: (lambda p: jnp.sum(tf.forward(p, spec, tokens, pos, seg, remat=remat)[0] ** 2))

  def saved(remat):
    jax.ad_checkpoint.print_saved_residuals(loss(remat), params)
    return collections.Counter(line.split(" ")[0] for line in capsys.readouterr().out.splitlines()
                               if "(_scan_layers)" in line)

  def gradient_as_without_remat(remat):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 jax.jit(jax.grad(loss(remat)))(params), jax.jit(jax.grad(loss(False)))(params))

  return saved, gradient_as_without_remat


@pytest.mark.slow
def test_remat_keeps_the_attention_output_instead_of_rewalking_the_tiles(capsys, monkeypatch):
  """A rematerialized layer saves the blockwise attention's output and log-sum-exp (SAVED_UNDER_REMAT; per
  layer, in head-major tiles [L, n, B, K, G, block, (h)]), so the backward does not repeat the forward's tile
  walk, and nothing of the kind without the names; the gradient equals the un-rematerialized one."""
  saved, gradient_as_without_remat = _remat_case(capsys)
  # 2 layers, 3 tiles of 16, 2 rows, 2 x 3 heads, h 16
  tiles = collections.Counter(["f32[2,3,2,2,3,16,16]", "f32[2,3,2,2,3,16]"])
  assert saved(True) & tiles == tiles
  monkeypatch.setattr(attention, "SAVED_UNDER_REMAT", ())
  assert not saved(True) & tiles
  monkeypatch.undo()
  gradient_as_without_remat(True)


@pytest.mark.slow
def test_remat_saving_projections_keeps_every_weight_product_and_the_gradient(capsys):
  """learner.remat_saves="projections": a rematerialized layer also keeps the weight products' outputs that its
  backward reads (q, k, v, gate, up, one of dim width), so it recomputes no matmul; the gradient equals the
  un-rematerialized one."""
  saved, gradient_as_without_remat = _remat_case(capsys)
  # 2 layers x 2 rows x 40 tokens: q (6 heads of 16), k and v (2 kv heads), gate and up (96), one of dim 64
  extra = ["f32[2,2,40,6,16]"] + ["f32[2,2,40,2,16]"] * 2 + ["f32[2,2,40,96]"] * 2 + ["f32[2,2,40,64]"]
  assert saved("projections") - saved("attention") == collections.Counter(extra)
  assert saved("attention") == saved(True)
  gradient_as_without_remat("projections")


def test_fused_attention_call_equals_the_materialized_softmax():
  """The cuDNN path's call (jax.nn.dot_product_attention with our mask and head layout), run by its XLA
  implementation on this CPU: left padding, packed segments, grouped-query heads; values and gradients."""
  q, k, v, seg, w = _inputs()
  fused = lambda q, k, v: attention.fused_causal_attention(q, k, v, seg, implementation="xla")
  np.testing.assert_allclose(jax.jit(fused)(q, k, v), _reference(q, k, v, seg), atol=2e-6)
  got = _grads(fused, w, q, k, v)
  want = _grads(lambda q, k, v: _reference(q, k, v, seg), w, q, k, v)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=5e-6)


def test_bf16_stays_close_to_fp32():
  q, k, v, seg, _ = _inputs(T=64)
  out = attention.blockwise_causal_attention(q, k, v, seg, block=16, dtype=jnp.bfloat16)
  assert float(jnp.abs(out - _reference(q, k, v, seg)).max()) < 0.05


SPEC = ModelSpec("Qwen3ForCausalLM", vocab_size=96, dim=64, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=16,
                 ffn_dim=96)


@pytest.mark.slow
def test_transformer_forward_and_gradient_match_the_blocked_path():
  params = tf.init_params(SPEC, 3)
  params["embed"] = params["embed"] * 30
  rng = np.random.default_rng(1)
  B, T = 2, 70
  tokens = jnp.asarray(rng.integers(1, 96, (B, T)), jnp.int32)
  seg = np.ones((B, T), np.int32)
  seg[0, :9] = 0
  seg[1, 31:] = 2
  pos = np.where(seg > 0, np.arange(T)[None] - np.where(np.arange(T)[None] >= 31, 31, 0) * (np.arange(B)[:, None] == 1), 0)
  pos[0] = np.maximum(np.arange(T) - 9, 0)
  args = (tokens, jnp.asarray(pos, jnp.int32), jnp.asarray(seg))
  specs = {a: dataclasses.replace(SPEC, attention=a, attention_block=16 if a != "splash" else 128)
           for a in ("blocked", "xla_blockwise", "splash")}  # splash tiles are multiples of 128 (70 -> 128)
  valid = jnp.asarray(seg > 0)[:, :, None]
  hidden = {a: jax.jit(lambda p, s=s: tf.forward(p, s, *args)[0])(params) for a, s in specs.items()}
  loss = lambda s: (lambda p: jnp.sum(jnp.where(valid, tf.forward(p, s, *args, remat=True)[0], 0) ** 2))
  grads = {a: jax.jit(jax.grad(loss(s)))(params) for a, s in specs.items()}
  for tiled in ("xla_blockwise", "splash"):
    np.testing.assert_allclose(jnp.where(valid, hidden[tiled], 0), jnp.where(valid, hidden["blocked"], 0), atol=2e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-4, rtol=2e-4), grads[tiled], grads["blocked"])


def _temp_bytes(attention_impl, T):
  # One layer and tiles of 64 keep the four compiles short; the growth is per layer and per tile count.
  spec = dataclasses.replace(SPEC, attention=attention_impl, attention_block=64, n_layers=1)
  params = tf.init_params(spec, 0)
  tokens = jnp.ones((1, T), jnp.int32)
  pos, seg = jnp.arange(T, dtype=jnp.int32)[None], jnp.ones((1, T), jnp.int32)
  fn = jax.jit(jax.grad(lambda p: jnp.sum(tf.forward(p, spec, tokens, pos, seg, remat=True)[0])))
  return fn.lower(params).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_training_memory_grows_linearly():
  """Doubling the length from 512 to 1024 (16 tiles) about doubles the blockwise gradient's scratch memory
  (measured 2.0x); the blocked path's, which keeps every tile's probabilities, grows faster (3.5x) and is the
  larger at 1024 (7.8 MB against 61 MB)."""
  blockwise = [_temp_bytes("xla_blockwise", T) for T in (512, 1024)]
  blocked = [_temp_bytes("blocked", T) for T in (512, 1024)]
  assert blockwise[1] / blockwise[0] < 2.6, blockwise
  assert blocked[1] / blocked[0] > 3.0, blocked
  assert blockwise[1] < blocked[1] / 2, (blockwise, blocked)


@pytest.mark.slow
def test_splash_kernel_in_interpret_mode_equals_the_materialized_softmax():
  """JAX's Pallas splash kernel behind the same contract (run by Pallas' interpreter on CPU): packed segments,
  left padding and a padded tail, grouped-query heads; values and gradients."""
  q, k, v, seg, w = _inputs(T=200, h=16)
  fn = lambda q, k, v: attention.splash_causal_attention(q, k, v, seg, block=128)
  np.testing.assert_allclose(jax.jit(fn)(q, k, v), _reference(q, k, v, seg), atol=5e-6)
  got = _grads(fn, w, q, k, v)
  want = _grads(lambda q, k, v: _reference(q, k, v, seg), w, q, k, v)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=2e-4, rtol=1e-4)


def test_splash_under_a_mesh_equals_one_device():
  from seed_jax.infra.mesh import make_mesh
  q, k, v, seg, _ = _inputs(T=128, B=8, h=16, seed=3)
  single = attention.splash_causal_attention(q, k, v, seg, block=128)
  mesh = make_mesh((2, 2, 2))  # rows over data x fsdp, the 2 kv heads over tensor
  with jax.set_mesh(mesh):
    sharded = jax.jit(lambda *a: attention.splash_causal_attention(*a, block=128))(q, k, v, seg)
  np.testing.assert_allclose(sharded, single, atol=1e-6)
