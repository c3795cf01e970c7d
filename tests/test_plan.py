"""The memory planner: published model sizes, exact weight/optimizer bytes per device against the real sharded
arrays, update-step activations against XLA's buffer assignment, and the command line from a bare config.json."""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import pytest

from scale_helpers import numpy_params, random_minibatch
from configs import base
from seed_jax import config as config_lib
from seed_jax import plan, update
from seed_jax.losses import SeedLossConfig
from seed_jax.infra import distributed
from seed_jax.infra.mesh import make_mesh, sharding_tree
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = ModelSpec("Qwen2ForCausalLM", vocab_size=512, dim=64, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=16,
                 ffn_dim=128)
# Allowed planned/measured ratio of the update step's temporaries (gradients, AdamW's update, activations).
# The planner errs high with remat (it counts a recomputed block and its cotangents at full size).
ACTIVATION_TOLERANCE = (0.8, 1.5)


def test_known_models_have_their_published_sizes():
  one = {"data": 1, "fsdp": 1, "tensor": 1}
  counts = {n: plan.param_bytes(plan.load_spec(n), one) // 4 for n in plan.KNOWN_MODELS}
  assert counts == {"Qwen2.5-3B-Instruct": 3_085_938_688, "Qwen2.5-7B-Instruct": 7_615_616_512,
                    "SmolLM2-135M-Instruct": 134_515_008}
  assert plan.load_spec("Qwen/Qwen2.5-7B-Instruct") == plan.load_spec("qwen2.5-7b-instruct")
  gguf = plan.load_spec("embedded")  # metadata of the shipped GGUF file agrees with the published config
  known = plan.load_spec("SmolLM2-135M-Instruct")
  for field in ("architecture", "vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                "tie_embeddings", "rope_theta"):
    assert getattr(gguf, field) == getattr(known, field), field
  with pytest.raises(FileNotFoundError, match="no such config.json, .gguf file or known model"):
    plan.load_spec("Qwen9-1B")


@pytest.mark.parametrize("shape", [(1, 8, 1), (1, 2, 4)])
def test_planned_weight_and_optimizer_bytes_equal_the_real_shards(shape):
  mesh = make_mesh(shape)
  params = numpy_params(SPEC)
  params = jax.device_put(params, sharding_tree(tf.param_axes(SPEC), params, mesh))
  state = update.init_state(params, update.make_optimizer(base.get_base().learner))
  planned = plan.plan(SPEC, dict(mesh.shape), _workload(remat=True))["items"]
  for d in range(8):  # every device holds the same amount
    on_device = lambda tree: sum(x.addressable_shards[d].data.nbytes for x in jax.tree.leaves(tree))
    assert on_device(state.params) == planned["params"]
    assert on_device(state.opt_state) == planned["optimizer"] + 4  # + AdamW's int32 step count
  assert planned["params"] * 8 > plan.param_bytes(SPEC, {"data": 1, "fsdp": 1, "tensor": 1}) * 0.9  # sharded


def _workload(remat: bool | str, micro=16, Pn=128, R=64) -> plan.Workload:
  """`remat`: False, True or a learner.remat_saves value."""
  return plan.Workload(sample_rows=8, sample_prompt=Pn, sample_new=R, analysis_rows=0, analysis_prompt=0,
                       analysis_new=0, sample_itemsize=4, rescore_rows=8, prompt=Pn, response=R, micro_rows=micro,
                       vocab_chunk=16, remat=bool(remat), remat_saves=remat if isinstance(remat, str) else "attention",
                       reference_on_device=False)


@pytest.mark.slow
@pytest.mark.parametrize("remat,attention", [(True, "blocked"), (False, "blocked"), (True, "xla_blockwise"),
                                             (False, "xla_blockwise"), ("projections", "blocked"),
                                             ("projections", "xla_blockwise")])
def test_planned_update_temporaries_match_xla(remat, attention):
  spec = dataclasses.replace(SPEC, attention=attention, attention_block=64)
  mesh = make_mesh((1, 8, 1))
  params = numpy_params(spec)
  params = jax.device_put(params, sharding_tree(tf.param_axes(spec), params, mesh))
  opt = update.make_optimizer(base.get_base().learner)
  w = _workload(remat)
  fn = update.make_update_fn(spec, SeedLossConfig.from_config(base.get_base().objectives), opt, micro_batch_size=w.micro_rows,
                             chunk=w.vocab_chunk, remat=remat, state_shardings=update.state_shardings(params, opt))
  batch = distributed.global_batch(random_minibatch(2 * w.micro_rows, w.prompt, w.response, spec.vocab_size), mesh)
  with jax.set_mesh(mesh):
    measured = fn.lower(update.init_state(params, opt), batch, jnp.float32(1.0)).compile().memory_analysis()
  out = plan.plan(spec, dict(mesh.shape), w)
  # The update phase minus what is resident (weights, moments) is what XLA allocates as temporaries.
  planned = out["phases"]["update"] - out["items"]["params"] - out["items"]["optimizer"]
  ratio = planned / measured.temp_size_in_bytes
  print(f"remat={remat} {attention}: planned {planned} B, XLA temp {measured.temp_size_in_bytes} B, ratio {ratio:.2f}")
  assert ACTIVATION_TOLERANCE[0] <= ratio <= ACTIVATION_TOLERANCE[1]


@pytest.mark.parametrize("attention,chunk", [("blocked", 0), ("xla_blockwise", 0), ("blocked", 256),
                                             ("xla_blockwise", 256)])
@pytest.mark.parametrize("rows,prompt", [(8, 512), (4, 1024)])
def test_planned_prefill_activations_match_xla(rows, prompt, attention, chunk):
  # Generation's prefill is a cache-less forward over the prompt only (no [queries, prompt + new] scores), or
  # chunks against the cache.
  spec = dataclasses.replace(SPEC, attention=attention, attention_block=128)
  params = jax.tree.map(jnp.asarray, numpy_params(spec))
  tokens = jnp.zeros((rows, prompt), jnp.int32)
  fn = jax.jit(lambda p, t, pos, seg: tf.prefill(p, spec, t, pos, seg, prompt + 128, chunk=chunk))
  measured = fn.lower(params, tokens, jnp.broadcast_to(jnp.arange(prompt), tokens.shape), tokens + 1).compile()
  w = dataclasses.replace(_workload(remat=False), sample_rows=rows, sample_prompt=prompt, sample_new=128,
                          prefill_chunk=chunk)
  planned = plan.plan(spec, {"data": 1, "fsdp": 1, "tensor": 1}, w)["items"]["prefill_activations_rollout"]
  ratio = planned / measured.memory_analysis().temp_size_in_bytes
  print(f"prefill {rows}x{prompt} {attention} chunk {chunk}: planned {planned} B, ratio {ratio:.2f}")
  assert ACTIVATION_TOLERANCE[0] <= ratio <= ACTIVATION_TOLERANCE[1]


def test_notes_flag_rows_that_do_not_divide_the_mesh():
  mesh = {"data": 1, "fsdp": 16, "tensor": 1}
  w = _workload(remat=True, micro=8)
  out = plan.plan(SPEC, mesh, w)
  assert "update micro-batch of 8 rows does not divide over data x fsdp = 16 devices" in out["notes"][0]
  sharded = plan.plan(SPEC, mesh, _workload(remat=True, micro=16))["items"]["update_activations_remat"]
  assert out["items"]["update_activations_remat"] == 8 * sharded  # 8 rows on every device instead of 1


def test_auto_rows_are_the_largest_power_of_two_that_fits():
  """sampler.max_batch / rescore.max_rows = 0 ("auto") on the paper's 3B setting and v5p-8 (4 chips): the
  chosen row count fits and twice it does not; more memory never chooses fewer rows; nothing fits: the data size."""
  from configs import sciworld
  cfg = sciworld.get_config("paper")
  cfg.model.path = "Qwen2.5-3B-Instruct"
  cfg.rescore.pack_length = cfg.learner.pack_length = 0
  spec, mesh, gib = plan.load_spec(cfg.model.path), {"data": 1, "fsdp": 4, "tensor": 1}, 1 << 30
  cfg.rollout.tasks_per_update, cfg.rollout.group_size = 64, 8  # 512 episodes: the sampler's cap binds
  peak = lambda c: plan.plan(spec, mesh, plan.Workload.from_config(c, 4))["peak"]
  for field in ("sampler.max_batch", "rescore.max_rows"):
    a, b = field.split(".")
    rows = plan.fitting_rows(cfg, spec, mesh, 95 * gib, field)
    assert 4 < rows < plan.AUTO_MAX_ROWS and rows & (rows - 1) == 0, (field, rows)
    trial = ml_collections.ConfigDict(cfg.to_dict())
    trial[a][b] = rows
    assert peak(trial) <= 95 * gib
    trial[a][b] = 2 * rows
    assert peak(trial) > 95 * gib
    assert plan.fitting_rows(cfg, spec, mesh, 400 * gib, field) >= rows
    assert plan.fitting_rows(cfg, spec, mesh, gib, field) == 4
  # At run time (runtime.build) "auto" is sized for this machine's device memory; set values stay.
  from seed_jax import runtime
  cfg.sampler.max_batch, cfg.rescore.max_rows = 0, 32
  assert plan.device_memory_bytes() > 0
  got = [runtime.auto_rows(cfg, SPEC, make_mesh((2, 4, 1)), f) for f in ("sampler.max_batch", "rescore.max_rows")]
  assert got[1] == 32 and got[0] >= 8 and got[0] & (got[0] - 1) == 0


@pytest.mark.slow
def test_command_line_from_a_bare_config_json(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(SPEC.to_hf_config()))  # no weights in the folder
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = lambda *args: subprocess.run([sys.executable, "-m", "seed_jax.plan", "--config=configs/sciworld.py:paper",
                                      *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  res = run(f"--config.model.path={tmp_path}", "--devices=8", "--config.learner.micro_batch_size=8")
  assert res.returncode == 0, res.stderr
  line = json.loads(res.stdout.strip().splitlines()[-1])
  assert "peak by phase" in res.stdout and line["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
  assert line["items"]["params"] == plan.param_bytes(SPEC, line["mesh"])
  assert line["workload"]["prompt"] == 4096 and line["workload"]["response"] == 512  # the paper's shapes
  res = run("--config.model.path=Qwen2.5-7B-Instruct", "--preset=v5p_16")
  line = json.loads(res.stdout.strip().splitlines()[-1])
  assert line["devices"] == 8 and line["device_memory"] == config_lib.load_mesh_preset("v5p_16").device_memory_bytes
  # 7.6e9 fp32 weights split 8 ways over "embed", except the q/k/v biases (no embed axis): replicated.
  biases = 28 * (28 + 4 + 4) * 128
  assert line["items"]["params"] == ((7_615_616_512 - biases) // 8 + biases) * 4
