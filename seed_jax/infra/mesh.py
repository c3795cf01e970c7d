"""Device mesh and the one rules table that maps logical axis names onto mesh axes.

Every weight and key activation names its axes logically ("embed", "heads", ...); `RULES` says which
mesh axes each logical axis is split over. A logical axis whose size the mesh axes do not divide stays
replicated (e.g. 3 KV heads on a tensor axis of 4), so any model runs on any mesh.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes it is sharded over (in order). Absent or None: replicated.
RULES: dict[str, tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "length": None,
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": None,
    "mlp": ("tensor",),
    "layers": None,
    "cache_length": None,
}


def make_mesh(shape: Sequence[int], devices: Sequence[Any] | None = None) -> Mesh:
  """Mesh over ("data", "fsdp", "tensor"); one entry may be -1 (= the remaining devices)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = list(shape)
  if len(shape) != len(MESH_AXES):
    raise ValueError(f"mesh.shape must have {len(MESH_AXES)} entries for axes {MESH_AXES}, got {shape}")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh.shape may contain at most one -1, got {shape}")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if len(devices) % known:
      raise ValueError(f"mesh.shape {shape} does not divide the {len(devices)} devices")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"mesh.shape {shape} holds {math.prod(shape)} devices but {len(devices)} are present")
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None, mesh_shape: dict[str, int]) -> P:
  """PartitionSpec for one array; mesh axes that do not divide the dimension (or are size 1) are dropped."""
  used: set[str] = set()
  out = []
  for i, name in enumerate(axes):
    mesh_axes = [a for a in (RULES.get(name) or ()) if a in mesh_shape and a not in used and mesh_shape[a] > 1]
    if shape is not None:
      kept = []
      for a in mesh_axes:
        if shape[i] % (math.prod(mesh_shape[b] for b in kept) * mesh_shape[a]) == 0:
          kept.append(a)
      mesh_axes = kept
    used.update(mesh_axes)
    out.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes))
  return P(*out)


def sharding_tree(axes_tree: Any, shapes_tree: Any, mesh: Mesh) -> Any:
  """NamedShardings for a pytree, given matching pytrees of logical axes and of arrays/ShapeDtypeStructs."""
  is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
  mesh_shape = dict(mesh.shape)
  return jax.tree.map(lambda ax, x: NamedSharding(mesh, logical_to_spec(ax, x.shape, mesh_shape)),
                      axes_tree, shapes_tree, is_leaf=is_axes)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Sharding constraint for an activation inside jit; a no-op unless a mesh is set (`jax.set_mesh`)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or mesh.size == 1:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, dict(mesh.shape)))
