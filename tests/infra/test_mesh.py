"""Sharded training on 8 fake CPU devices: the rules table, optimizer-state shardings, sharded updates equal to
the one-device update, mesh presets and multi-slice shapes, and reference weights kept in host memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scale_helpers import numpy_params, random_minibatch
from configs import base
from seed_jax import config as config_lib
from seed_jax import batch, update
from seed_jax.infra import distributed
from seed_jax.infra import mesh as mesh_lib
from seed_jax.infra.mesh import RULES, logical_to_spec, make_mesh, mesh_from_config, sharding_tree
from seed_jax.losses import SeedLossConfig
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec

# 8 heads and 4 KV heads divide a tensor axis of 4; dim 64 and vocab 256 divide an fsdp axis of 8.
SPEC = ModelSpec("Qwen3ForCausalLM", vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                 ffn_dim=128)
MESHES = [(2, 4, 1), (1, 8, 1), (8, 1, 1), (1, 2, 4)]


def _optimizer():
  cfg = base.get_base().learner
  # lr large enough that one step moves weights by ~1e-3..1e-2; eps large enough that AdamW's first step is
  # not sign(g) (which would turn rounding-level gradient differences into lr-sized weight differences).
  cfg.lr, cfg.eps = 1e-2, 1e-3
  return update.make_optimizer(cfg)


def _minibatch() -> batch.MiniBatch:
  return random_minibatch(16, 16, 8, SPEC.vocab_size)


def _update_fn(shardings=None):
  return update.make_update_fn(SPEC, SeedLossConfig.from_config(base.get_base().objectives), _optimizer(), micro_batch_size=8, chunk=8,
                               remat=False, state_shardings=shardings)


@pytest.fixture(scope="module")
def single_device_step():
  params = numpy_params(SPEC)
  state = update.init_state(jax.device_put(params, jax.devices()[0]), _optimizer())
  new, metrics = _update_fn()(state, jax.tree.map(jnp.asarray, _minibatch()), jnp.float32(1.0))
  return params, jax.device_get(new.params), jax.device_get(metrics)


@pytest.mark.slow
@pytest.mark.parametrize("shape", MESHES)
def test_sharded_update_equals_single_device(shape, single_device_step):
  params0, want_params, want = single_device_step
  mesh = make_mesh(shape)
  shardings = sharding_tree(tf.param_axes(SPEC), params0, mesh)
  params = jax.device_put(params0, shardings)
  state = update.init_state(params, _optimizer())
  state_shardings = update.state_shardings(params, _optimizer())
  with jax.set_mesh(mesh):
    new, metrics = _update_fn(state_shardings)(state, distributed.global_batch(_minibatch(), mesh), jnp.float32(1.0))
  assert abs(float(metrics["loss"]) - float(want["loss"])) <= 1e-5
  assert abs(float(metrics["grad_norm"]) - float(want["grad_norm"])) <= 1e-5
  assert float(want["grad_norm"]) > 0.1 and float(metrics["update_skipped"]) == 0.0
  moved = max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(want_params), jax.tree.leaves(params0)))
  assert moved > 1e-3  # the step really changed the weights, so the comparison below can fail
  for got, exp in zip(jax.tree.leaves(new.params), jax.tree.leaves(want_params)):
    np.testing.assert_allclose(np.asarray(got), exp, atol=1e-5, rtol=0)
  # The new state keeps the exact layout it came in with (donated buffers reused, no recompile next call).
  assert jax.tree.leaves(jax.tree.map(lambda x: x.sharding, new)) == jax.tree.leaves(state_shardings)
  assert any(s.spec != jax.sharding.PartitionSpec() for s in jax.tree.leaves(shardings))


def test_optimizer_state_mirrors_param_shardings():
  mesh = make_mesh((1, 2, 4))
  params = numpy_params(SPEC)
  params = jax.device_put(params, sharding_tree(tf.param_axes(SPEC), params, mesh))
  state = update.init_state(params, _optimizer())
  by_path = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(params)}
  mirrored = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state):
    key = jax.tree_util.keystr(path)
    match = [p for p in by_path if key.endswith(p)]
    if match:
      assert leaf.sharding == by_path[match[0]].sharding, key
      mirrored += 1
    else:  # counters: replicated on the same mesh
      assert leaf.sharding.mesh == mesh and leaf.sharding.spec == jax.sharding.PartitionSpec(), key
  assert mirrored == 2 * len(by_path)  # AdamW's mu and nu
  # The policy the pipeline trains is a copy of the loaded weights: the frozen reference keeps their layout.
  policy = update.init_state(jax.tree.map(jnp.copy, params), _optimizer()).params
  assert jax.tree.leaves(jax.tree.map(lambda x: x.sharding, policy)) == \
      jax.tree.leaves(jax.tree.map(lambda x: x.sharding, params))
  # Fully sharded: each device holds 1/8 of wq (fsdp 2 x tensor 4), for the weights and both moments.
  wq = params["layers"]["wq"]
  assert wq.addressable_shards[0].data.size * 8 == wq.size
  per_device = lambda tree: sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))
  assert per_device(state.opt_state) == 2 * per_device(params) + 4  # + the int32 step count


def _llama_like(arch: str, tie: bool) -> ModelSpec:
  return ModelSpec(arch, vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48,
                   tie_embeddings=tie)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
@pytest.mark.parametrize("tie", [True, False])
def test_every_weight_axis_has_a_rule(arch, tie):
  spec = _llama_like(arch, tie)
  axes = tf.param_axes(spec)
  names = {a for ax in jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)) for a in ax}
  assert names <= set(RULES), names - set(RULES)
  expect = {"LlamaForCausalLM": set(), "Qwen2ForCausalLM": {"bq", "bk", "bv"},
            "Qwen3ForCausalLM": {"q_norm", "k_norm"}}[arch]
  assert expect <= set(axes["layers"]) and ("lm_head" in axes) != tie
  # Activation and KV-cache names used by the model and the sampler.
  assert {"batch", "length", "cache_length", "embed", "heads", "mlp"} <= set(RULES)
  shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), tf.param_shapes(spec),
                        is_leaf=lambda x: isinstance(x, tuple))
  shardings = sharding_tree(axes, shapes, make_mesh((1, 2, 4)))
  assert shardings["embed"].spec == jax.sharding.PartitionSpec("tensor", "fsdp")


def test_unknown_logical_axis_is_an_error():
  with pytest.raises(ValueError, match="logical axis 'experts' has no entry in mesh.RULES"):
    logical_to_spec(("experts", "embed"), (4, 64), {"data": 1, "fsdp": 8, "tensor": 1})
  # Known axes: sharded where the size divides, replicated where it does not (3 KV heads on tensor=4).
  assert logical_to_spec(("embed", "kv_heads"), (64, 3), {"data": 1, "fsdp": 2, "tensor": 4}) == \
      jax.sharding.PartitionSpec("fsdp", None)
  assert logical_to_spec(("batch", "length"), (16, 5), {"data": 2, "fsdp": 4, "tensor": 1}) == \
      jax.sharding.PartitionSpec(("data", "fsdp"), None)


def test_mesh_presets_and_config():
  assert {"single_host_8", "v5e_16", "v5p_64", "v5p_256"} <= set(config_lib.mesh_presets())
  for name in config_lib.mesh_presets():
    p = config_lib.load_mesh_preset(name)
    ici = mesh_lib.resolve_shape(p.shape, p.num_devices, p.dcn_shape)
    assert np.prod(ici) * np.prod(p.dcn_shape) == p.num_devices, name
  cfg = base.get_base()
  assert mesh_from_config(cfg.mesh).shape == {"data": 1, "fsdp": 8, "tensor": 1}
  cfg.mesh.preset = "single_host_8"
  cfg.mesh.shape = (8, 1, 1)  # the preset wins
  assert mesh_from_config(cfg.mesh).shape == {"data": 1, "fsdp": 8, "tensor": 1}
  cfg.mesh.preset = "v5p_64"
  with pytest.raises(ValueError, match=r"mesh.shape \[1, 32, 1\] holds 32 devices but 8 are present"):
    mesh_from_config(cfg.mesh)
  cfg.mesh.preset = "v5p_65"
  with pytest.raises(ValueError, match="unknown mesh preset 'v5p_65'; known: .*v5p_64"):
    mesh_from_config(cfg.mesh)


def test_multi_slice_shapes():
  # Slices along data: each slice holds a (1, 2, 2) block, and the two slices differ only in "data".
  assert mesh_lib.resolve_shape((1, -1, 2), 8, (2, 1, 1)) == (1, 2, 2)
  with pytest.raises(ValueError, match=r"mesh.dcn_shape \[3, 1, 1\] asks for 3 slices, which does not divide "
                                       r"the 8 devices"):
    mesh_lib.resolve_shape((1, -1, 1), 8, (3, 1, 1))
  with pytest.raises(ValueError, match=r"holds 16 devices but 8 are present"):
    mesh_lib.resolve_shape((1, 4, 2), 8, (2, 1, 1))
  # One process has no second slice to put on the DCN axis (see test_distributed for two processes).
  with pytest.raises(ValueError, match=r"asks for 2 slices but the devices form 1 \(processes\)"):
    make_mesh((1, -1, 1), dcn_shape=(2, 1, 1))


def test_reference_params_in_host_memory_give_identical_logits():
  mesh = make_mesh((2, 4, 1))
  params = numpy_params(SPEC, 3)
  params = jax.device_put(params, sharding_tree(tf.param_axes(SPEC), params, mesh))
  on_host = mesh_lib.with_memory_kind(params, "pinned_host")
  assert {x.sharding.memory_kind for x in jax.tree.leaves(on_host)} == {"pinned_host"}
  assert [x.sharding.spec for x in jax.tree.leaves(on_host)] == [x.sharding.spec for x in jax.tree.leaves(params)]
  back = mesh_lib.with_memory_kind(on_host, "device")
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 256, (8, 12)), jnp.int32)
  logits = jax.jit(lambda p: tf.full_logits(p, SPEC, tokens, jnp.ones_like(tokens)))
  with jax.set_mesh(mesh):
    np.testing.assert_array_equal(np.asarray(logits(back)), np.asarray(logits(params)))
  with pytest.raises(ValueError, match="memory kind must be one of"):
    mesh_lib.with_memory_kind(params, "hbm")
