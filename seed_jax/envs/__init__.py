"""Environments: `get_family(name)` returns the EnvFamily object of one environment file."""
from __future__ import annotations

import importlib

from seed_jax.envs.base import EnvFamily

# name -> module defining FAMILY; imported on demand so that importing seed_jax.envs starts no simulator code.
_MODULES = {
    "alfworld": "seed_jax.envs.alfworld",
    "ezpoints": "seed_jax.envs.ezpoints",
    "sciworld": "seed_jax.envs.sciworld",
    "search": "seed_jax.envs.search",
    "sokoban": "seed_jax.envs.sokoban",
    "textworld_express": "seed_jax.envs.textworld_express",
    "webshop": "seed_jax.envs.webshop",
}


def get_family(name: str) -> EnvFamily:
  if name not in _MODULES:
    raise ValueError(f"unknown environment {name!r}; known: {sorted(_MODULES)}")
  return importlib.import_module(_MODULES[name]).FAMILY
