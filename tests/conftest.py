"""Test-wide setup: 8 fake CPU devices so sharding is exercised without accelerators."""
import os

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
