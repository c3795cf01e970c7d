"""Test-wide setup: the shared helpers importable from every test folder, and 8 fake CPU devices so sharding
is exercised without accelerators."""
import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)  # helpers.py, envs_helpers.py, ... for tests/ and tests/<package folder>/

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def smollm2():
  """The embedded SmolLM2-135M-Instruct (GGUF): spec, params and tokenizer, loaded once per session."""
  from seed_jax.models import tokenizer, weights
  spec, params = weights.load_model("embedded")
  return spec, params, tokenizer.load_tokenizer("embedded")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
  """A tiny random Llama with the embedded tokenizer's 49152-token vocabulary, as an HF checkpoint folder
  (weights + tokenizer files): fast enough for end-to-end pipeline tests."""
  from seed_jax.models import tokenizer, transformer, weights
  from seed_jax.models.spec import ModelSpec
  tok = tokenizer.load_tokenizer("embedded")
  spec = ModelSpec("LlamaForCausalLM", vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, ffn_dim=64, tie_embeddings=True, bos_token_id=1, eos_token_id=2)
  path = str(tmp_path_factory.mktemp("tiny_model"))
  weights.export_hf(transformer.init_params(spec, 0), spec, path)
  tok.hf.save_pretrained(path)
  return path
