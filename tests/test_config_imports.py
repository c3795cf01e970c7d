"""Configs are plain data: loading any config file (every variant) imports no seed_jax module, mesh presets are
read by path, a bad choice fails validation with one line naming the field, and a run works from any cwd."""
import importlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from configs import base, sciworld
from seed_jax import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG_MODULES = sorted(
    "configs." + ".".join(p.relative_to(ROOT / "configs").with_suffix("").parts)
    for p in (ROOT / "configs").rglob("*.py") if p.stem != "__init__")
CANDIDATE_VARIANTS = ("", "paper", "collect", "annotate", "sft", "warmstart", "experiment", "collect,paper", "annotate,paper",
                      "sft,paper", "warmstart,paper")


def _accepted_variants(module) -> list[str]:
  """The variants a config's get_config takes (the others raise ValueError naming the variant)."""
  if not hasattr(module, "get_config"):
    return []
  out = []
  for v in CANDIDATE_VARIANTS:
    try:
      module.get_config(v)
    except ValueError as e:
      assert "variant" in str(e), (module.__name__, v, e)
      continue
    out.append(v)
  return out


def _fresh_python(code: str, cwd) -> str:
  """stdout of `code` in a new interpreter started in `cwd`, with only the repo on the path."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
  assert res.returncode == 0, res.stderr
  return res.stdout.strip().splitlines()[-1]


def test_every_config_module_is_found():
  assert {"configs.base", "configs.stage1", "configs.generate", "configs.sciworld", "configs.mesh.v5p_64"} <= \
      set(CONFIG_MODULES)


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIG_MODULES)
def test_loading_a_config_imports_no_seed_jax_module(name, tmp_path):
  variants = _accepted_variants(importlib.import_module(name))
  if name.startswith("configs.") and name.count(".") == 1 and name not in ("configs.base", "configs.stage1", "configs.variants",
                                                                                  "configs.vl"):
    assert "" in variants, name  # every run config has a default variant
  code = f"""
      import importlib, json, sys
      m = importlib.import_module({name!r})
      for v in {variants!r}:
        m.get_config(v)
      if hasattr(m, "get_base"):
        m.get_base()
      if hasattr(m, "get_mesh"):
        m.get_mesh()
      print(json.dumps([n for n in sys.modules if n.startswith("seed_jax")]))
  """
  assert json.loads(_fresh_python(code, tmp_path)) == []


@pytest.mark.slow
def test_mesh_presets_are_read_by_path_without_importing_configs(tmp_path):
  code = """
      import json, sys
      import ml_collections
      from seed_jax.infra import mesh
      mc = lambda preset: ml_collections.ConfigDict(dict(preset=preset, shape=(1, -1, 1), dcn_shape=(1, 1, 1),
                                                         ref_params_memory="device"))
      r = mesh.resolve(mc("v5p_256"))
      try:
        mesh.resolve(mc("v5p_65"))
      except ValueError as e:
        err = str(e)
      print(json.dumps([list(r.shape), err, [n for n in sys.modules if n.split(".")[0] == "configs"]]))
  """
  shape, err, configs_modules = json.loads(_fresh_python(code, tmp_path))
  assert shape == [1, 32, 4] and configs_modules == []
  assert err == f"unknown mesh preset 'v5p_65'; known: {', '.join(config_lib.mesh_presets())}"


def _set(cfg, path: str, value) -> None:
  *parents, leaf = path.split(".")
  node = cfg
  for p in parents:
    node = node[p]
  node[leaf] = value


@pytest.mark.parametrize("path", sorted(config_lib.CHOICES))
def test_validate_rejects_a_bad_choice_with_one_line_naming_the_field(path):
  cfg = sciworld.get_config()
  config_lib.validate(cfg)
  bad = 7 if isinstance(config_lib.get(cfg, path), int) else "bogus"  # a value of the field's own type
  _set(cfg, path, bad)
  with pytest.raises(ValueError) as e:
    config_lib.validate(cfg)
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"config.{path}={bad!r} is not allowed; choose one of ")
  assert repr(config_lib.CHOICES[path]) in msg


def test_choices_name_real_fields_and_hold_their_defaults():
  cfg = base.get_base()
  for path, allowed in config_lib.CHOICES.items():
    assert config_lib.get(cfg, path) in allowed, path


@pytest.mark.slow
def test_main_runs_from_any_directory(tiny_model_dir, tmp_path):
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  res = subprocess.run([sys.executable, "-m", "seed_jax.main", f"--config={ROOT / 'configs' / 'generate.py'}",
                        "--config.generate.max_new_tokens=2", f"--config.model.path={tiny_model_dir}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr
  assert res.stdout  # the decoded text (random weights: any tokens) and its newline


def test_an_unknown_variant_is_named_with_the_known_ones():
  from configs import generate, sokoban
  with pytest.raises(ValueError) as e:
    sokoban.get_config("paper,nope")
  assert str(e.value) == ("unknown variant 'nope' of configs/sokoban.py; known: '', 'annotate', 'collect', 'paper', "
                          "'sft', 'vl', 'warmstart'")
  with pytest.raises(ValueError, match="unknown variant 'paper' of configs/generate.py; known: ''$"):
    generate.get_config("paper")


def test_variants_apply_left_to_right_after_the_sizing():
  """"paper" sizes the config wherever it is named; the other overlays follow in the order given."""
  from configs import textworld_express as twx, variants
  assert twx.get_config("sft,paper").to_dict() == twx.get_config("paper,sft").to_dict()
  assert twx.get_config("sft,paper").sft.dtype == "bfloat16"
  order = []
  table = {"a": lambda c, paper: order.append(("a", paper)), "b": lambda c, paper: order.append(("b", paper)),
           "paper": lambda c, paper: order.append(("paper", paper))}
  variants.build("b,paper,a", "x", base.get_base(), lambda c: order.append("cpu"), table)
  assert order == [("paper", True), ("b", True), ("a", True)]
  order.clear()
  variants.build("a,b", "x", base.get_base(), lambda c: order.append("cpu"), table)
  assert order == ["cpu", ("a", False), ("b", False)]
