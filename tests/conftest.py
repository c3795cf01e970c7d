"""Test-wide setup: the shared helpers importable from every test folder, 8 fake CPU devices so sharding is
exercised without accelerators, and JAX's persistent compilation cache for the session and its subprocesses."""
import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)  # helpers.py, envs_helpers.py, ... for tests/ and tests/<package folder>/

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Environment variables, not jax.config, so that subprocesses (seed_jax.main, multihost workers) share it.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(TESTS), ".pytest_cache", "jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import pytest


@pytest.fixture(scope="session")
def embedded_tokenizer():
  """The embedded SmolLM2 tokenizer (rebuilt from GGUF metadata: seconds), loaded once per session."""
  from seed_jax.models import load
  return load.load_tokenizer("embedded")


@pytest.fixture(scope="session")
def smollm2(embedded_tokenizer):
  """The embedded SmolLM2-135M-Instruct (GGUF): spec, params and tokenizer, loaded once per session."""
  from seed_jax.models import load
  spec, params = load.load_model("embedded")
  return spec, params, embedded_tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, embedded_tokenizer):
  """A tiny random Llama with the embedded tokenizer's 49152-token vocabulary, as an HF checkpoint folder
  (weights + tokenizer files): fast enough for end-to-end pipeline tests."""
  from helpers import save_tiny_llama
  return save_tiny_llama(str(tmp_path_factory.mktemp("tiny_model")), embedded_tokenizer)
