"""Test-wide setup: the shared helpers importable from every test folder, 8 fake CPU devices so sharding is
exercised without accelerators, and JAX's persistent compilation cache for the session and its subprocesses."""
import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)  # helpers.py, envs_helpers.py, ... for tests/ and tests/<package folder>/

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Environment variables, not jax.config, so that subprocesses (seed_jax.main, multihost workers) share it. Every
# program is kept: the suite's subprocesses compile the same small programs again and again (a tiny-model run of
# seed_jax.main compiles ~190, most under 1 s), and a cache read costs milliseconds.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(TESTS), ".pytest_cache", "jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest

# Files that take minutes (seconds of one full run, Intel Xeon family 6 model 207, 2026-12-05), handed to the
# xdist workers first (the Makefile's --no-loadscope-reorder keeps this order): the workers then end together,
# instead of one of them running a long file alone at the end. Other files follow in their usual order.
LONG_FILES = {
  "test_pods.py": 998,
  "test_warmstart.py": 279,
  "test_pipeline.py": 267,
  "test_update.py": 224,
  "test_sample.py": 194,
  "models/test_attention.py": 184,
  "test_storm.py": 163,
  "test_vl_policy.py": 120,
  "test_experiment.py": 98,
  "test_plan.py": 92,
  "infra/test_distributed.py": 86,
  "test_evaluate.py": 72,
  "test_slots.py": 68,
  "models/test_transformer_weights.py": 64,
  "infra/test_mesh.py": 58,
  "test_stage1.py": 55,
  "test_main_errors.py": 49,
  "test_paired.py": 41,
  "test_packing.py": 41,
}


def pytest_collection_modifyitems(config, items):
  seconds = lambda item: LONG_FILES.get(os.path.relpath(str(item.path), TESTS), 0)
  items.sort(key=lambda item: -seconds(item))  # stable: each file's tests keep their order


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
