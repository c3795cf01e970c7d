"""A bad value ends `python -m seed_jax.main` with one `config error:` line and exit status 1, whether validation
catches it (a loss range, a mesh shape, an unknown variant, a config file that does not exist) or the build does
(a mesh that asks for more devices than are present)."""
import os
import subprocess
import sys

import pytest

from helpers import REPO

CASES = {
    "clip_c": (["--config=configs/textworld_express.py", "--config.objectives.clip_c=0.5"],
               "config error: config.objectives.clip_c=0.5 must be > 1"),
    "variant": (["--config=configs/textworld_express.py:nope"],
                "config error: unknown variant 'nope' of configs/textworld_express.py; known: ''"),
    "file": (["--config=configs/nope.py", "--config.seed=1"], "config error: no config file 'configs/nope.py'"),
    "mesh": (["--config=configs/textworld_express.py", "--config.mesh.shape=(1,-1,-1)"],
             "config error: config.mesh.shape may contain at most one -1"),
    "build": (["--config=configs/textworld_express.py", "--config.mesh.shape=(3,1,1)",
               "--config.warmstart.before_rl=False"], "config error: mesh.shape [3, 1, 1] holds 3 devices but"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_build_time_value_is_one_config_error_line(case, tmp_path):
  args, start = CASES[case]
  args = [*args, f"--workdir={tmp_path / 'run'}"]
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  res = subprocess.run([sys.executable, "-m", "seed_jax.main", *args], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
  lines = [line for line in res.stderr.splitlines() if line.strip()]
  assert res.returncode == 1, res.stderr
  assert "Traceback" not in res.stderr and len([l for l in lines if l.startswith("config error:")]) == 1, res.stderr
  assert lines[-1].startswith(start), res.stderr
