"""The transformer family against Hugging Face `transformers` (PyTorch CPU), weights I/O and its errors
(the GGUF tokenizer: test_tokenizer.py)."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import hf_logits, hf_tiny_model, jitted_full_logits, left_padded
from seed_jax.infra.mesh import make_mesh
from seed_jax.models import load
from seed_jax.models import transformer as tf
from seed_jax.models import weights
from seed_jax.models.spec import ModelSpec

pytestmark = pytest.mark.slow  # PyTorch references and the embedded SmolLM2

CASES = {
    "llama": dict(arch="llama"),
    "llama_tied_llama3_rope": dict(arch="llama", tie=True, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64)),
    "llama_linear_rope": dict(arch="llama", rope_scaling=dict(rope_type="linear", factor=2.0)),
    "qwen2": dict(arch="qwen2"),
    "qwen3": dict(arch="qwen3", tie=True),
}


@pytest.fixture(scope="module", params=list(CASES))
def hf_case(request, tmp_path_factory):
  model = hf_tiny_model(**CASES[request.param])
  path = str(tmp_path_factory.mktemp(request.param))
  model.save_pretrained(path, safe_serialization=True)
  return request.param, model, path


def _ours(params, spec, tokens, valid):
  return np.asarray(jitted_full_logits()(params, spec, jnp.asarray(tokens), jnp.asarray(valid)))


def test_logits_match_transformers_with_left_padding(hf_case):
  name, model, path = hf_case
  spec, params = weights.load_hf(path)
  assert spec.family == CASES[name]["arch"]
  rng = np.random.default_rng(0)
  tokens, valid = left_padded(rng, [24, 17, 1, 24], spec.vocab_size, 24)
  ref = hf_logits(model, tokens, valid)
  ours = _ours(params, spec, tokens, valid)
  m = valid.astype(bool)
  assert np.abs(ours[m] - ref[m]).max() <= 1e-4


def test_export_round_trip_loads_in_transformers(hf_case, tmp_path):
  import transformers
  name, model, path = hf_case
  spec, params = weights.load_hf(path)
  weights.export_hf(params, spec, str(tmp_path))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
  tokens, valid = left_padded(np.random.default_rng(1), [10, 16], spec.vocab_size, 16)
  m = valid.astype(bool)
  assert np.abs(hf_logits(reloaded, tokens, valid)[m] - hf_logits(model, tokens, valid)[m]).max() <= 1e-5
  spec2, params2 = weights.load_hf(str(tmp_path))
  assert spec2 == spec
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_sharded_forward_equals_single_device():
  spec = ModelSpec("Qwen3ForCausalLM", vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                   ffn_dim=128)
  params = tf.init_params(spec, 3)
  tokens, valid = left_padded(np.random.default_rng(2), [16, 9, 3, 16, 12, 16, 5, 16], 256, 16)
  single = _ours(params, spec, tokens, valid)
  mesh = make_mesh((2, 4, 1))
  for mesh in (make_mesh((2, 4, 1)), make_mesh((2, 1, 4))):
    from seed_jax.infra.mesh import sharding_tree
    shardings = sharding_tree(tf.param_axes(spec), params, mesh)
    sharded = jax.device_put(params, shardings)
    assert any(len(s.spec) and any(a is not None for a in s.spec) for s in jax.tree.leaves(shardings))
    with jax.set_mesh(mesh):
      out = _ours(sharded, spec, tokens, valid)
    np.testing.assert_allclose(out, single, atol=2e-5)


def test_embedded_smollm2_answers_paris(smollm2):
  spec, params, tok = smollm2
  ids = tok.encode_chat("What is the capital of France?")
  step = jax.jit(lambda p, t: tf.full_logits(p, spec, t, jnp.ones_like(t))[:, -1])
  out = list(ids)
  for _ in range(10):
    out.append(int(jnp.argmax(step(params, jnp.asarray([out]))[0])))
  assert "Paris" in tok.decode(out[len(ids):])


def _tiny_folder(tmp_path, **override):
  model = hf_tiny_model("llama")
  model.save_pretrained(str(tmp_path), safe_serialization=True)
  if override:
    cfg = json.load(open(tmp_path / "config.json"))
    cfg.update(override)
    json.dump(cfg, open(tmp_path / "config.json", "w"))
  return str(tmp_path)


def test_weight_errors_are_clear(tmp_path):
  with pytest.raises(FileNotFoundError, match="model folder not found"):
    weights.load_hf(str(tmp_path / "nope"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="no config.json"):
    weights.load_hf(str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError, match="GGUF file not found"):
    load.load_model(str(tmp_path / "x.gguf"))
  with pytest.raises(ValueError, match=r"unsupported architecture 'GPT2LMHeadModel'.*LlamaForCausalLM"):
    weights.load_hf(_tiny_folder(tmp_path / "gpt2", architectures=["GPT2LMHeadModel"]))
  with pytest.raises(ValueError, match=r"shape mismatch for model.layers.0.mlp.gate_proj.weight.*\(96, 64\).*\(64, 80\)"):
    weights.load_hf(_tiny_folder(tmp_path / "shape", intermediate_size=80))
  with pytest.raises(KeyError, match="tensor 'model.layers.2.input_layernorm.weight' missing"):
    weights.load_hf(_tiny_folder(tmp_path / "layers", num_hidden_layers=3))
  nofile = tmp_path / "nosafetensors"
  shutil.copytree(_tiny_folder(tmp_path / "ok"), nofile)
  os.remove(nofile / "model.safetensors")
  with pytest.raises(FileNotFoundError, match="no model.safetensors"):
    weights.load_hf(str(nofile))
  with pytest.raises(ValueError, match="mesh.shape .* does not divide the 8 devices"):
    make_mesh((3, -1, 1))
  with pytest.raises(ValueError, match="holds 4 devices but 8 are present"):
    make_mesh((2, 2, 1))
