"""Device mesh and the one rules table that maps logical axis names onto mesh axes.

Every weight, activation and KV-cache array names its axes logically ("embed", "heads", ...); `RULES` says
which mesh axes each logical axis is split over. Optimizer moments mirror the weights and take the weights'
shardings (update.init_state). A logical axis whose size the mesh axes do not divide stays replicated (e.g.
3 KV heads on a tensor axis of 4), so any model runs on any mesh.

A mesh is described by `mesh.shape` (the axes inside one slice, over the fast inter-chip interconnect) and
`mesh.dcn_shape` (how many slices along each axis, over the slower data-center network); their product per
axis is the mesh. Named presets live in configs/mesh/<name>.py and are chosen with `mesh.preset`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from seed_jax.config import CHOICES, MESH_AXES, load_mesh_preset  # presets: configs/mesh/<name>.py, by path

# logical axis -> mesh axes it is sharded over (in order); None: replicated. Every logical name used anywhere
# must have an entry (logical_to_spec rejects unknown names), so a new weight cannot silently replicate.
RULES: dict[str, tuple[str, ...] | None] = {
    # activations and KV cache: rows are split over every data-parallel axis
    "batch": ("data", "fsdp"),
    "length": None,
    "cache_length": None,
    # weights (and, through update.init_state, their optimizer moments): FSDP over "embed", tensor
    # parallelism over heads, KV heads, MLP features and the vocabulary
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": None,
    "mlp": ("tensor",),
    "layers": None,
}


def resolve(mc: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The mesh config with its preset (if any) applied: the preset's fields replace the given ones."""
  mc = ml_collections.ConfigDict(mc.to_dict())
  if mc.get("preset"):
    preset = load_mesh_preset(mc.preset)
    mc.shape, mc.dcn_shape = tuple(preset.shape), tuple(preset.dcn_shape)
  return mc


def resolve_shape(shape: Sequence[int], n_devices: int, dcn_shape: Sequence[int] = (1, 1, 1)) -> tuple[int, ...]:
  """The per-slice shape with -1 filled in, checked against the device count (clear errors naming both); the
  shapes as values are config.validate's (check_mesh_shapes)."""
  shape, dcn = list(shape), list(dcn_shape)
  slices = math.prod(dcn)
  if n_devices % slices:
    raise ValueError(f"mesh.dcn_shape {dcn} asks for {slices} slices, which does not divide the {n_devices} devices")
  per_slice = n_devices // slices
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if per_slice % known:
      raise ValueError(f"mesh.shape {shape} does not divide the {n_devices} devices"
                       + (f" ({per_slice} per slice)" if slices > 1 else ""))
    shape[shape.index(-1)] = per_slice // known
  if math.prod(shape) * slices != n_devices:
    raise ValueError(f"mesh.shape {shape} x dcn_shape {dcn} holds {math.prod(shape) * slices} devices but "
                     f"{n_devices} are present" if slices > 1 else
                     f"mesh.shape {shape} holds {math.prod(shape)} devices but {n_devices} are present")
  return tuple(shape)


def make_mesh(shape: Sequence[int], devices: Sequence[Any] | None = None,
              dcn_shape: Sequence[int] = (1, 1, 1)) -> Mesh:
  """Mesh over ("data", "fsdp", "tensor"); `shape` may contain one -1 (= the remaining devices).

  One slice: on TPU the devices are ordered by `mesh_utils.create_device_mesh` so that mesh neighbours are
  physical neighbours; elsewhere in the order given. Several slices (`dcn_shape` product > 1):
  `create_hybrid_device_mesh`, slices being TPU slices (distinct `slice_index`) or else processes.
  """
  devices = list(jax.devices() if devices is None else devices)
  ici = resolve_shape(shape, len(devices), dcn_shape)
  if math.prod(dcn_shape) > 1:
    # TPU multi-slice devices carry distinct slice indices; elsewhere each process is one slice.
    granule_is_process = len({getattr(d, "slice_index", 0) for d in devices}) == 1
    granules = {d.process_index if granule_is_process else d.slice_index for d in devices}
    if len(granules) != math.prod(dcn_shape):
      raise ValueError(f"mesh.dcn_shape {list(dcn_shape)} asks for {math.prod(dcn_shape)} slices but the devices form "
                       f"{len(granules)} ({'processes' if granule_is_process else 'TPU slices'})")
    arr = mesh_utils.create_hybrid_device_mesh(ici, tuple(dcn_shape), devices, process_is_granule=granule_is_process,
                                               allow_split_physical_axes=True)
  elif devices[0].platform == "tpu":
    arr = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
  else:
    arr = np.asarray(devices).reshape(ici)
  return Mesh(arr, MESH_AXES)


def mesh_from_config(mc: ml_collections.ConfigDict, devices: Sequence[Any] | None = None) -> Mesh:
  """The run's mesh from `config.mesh` (preset applied)."""
  mc = resolve(mc)
  return make_mesh(tuple(mc.shape), devices, tuple(mc.dcn_shape))


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None, mesh_shape: dict[str, int]) -> P:
  """PartitionSpec for one array; mesh axes that do not divide the dimension (or are size 1) are dropped."""
  unknown = [a for a in axes if a is not None and a not in RULES]
  if unknown:
    raise ValueError(f"logical axis {unknown[0]!r} has no entry in mesh.RULES (known: {sorted(RULES)})")
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


def _is_axes(x: Any) -> bool:
  return isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)


def sharding_tree(axes_tree: Any, shapes_tree: Any, mesh: Mesh, memory_kind: str | None = None) -> Any:
  """NamedShardings for a pytree, given matching pytrees of logical axes and of arrays/ShapeDtypeStructs.
  `memory_kind` "pinned_host" places the arrays in host memory (see `with_memory_kind`)."""
  mesh_shape = dict(mesh.shape)
  return jax.tree.map(lambda ax, x: NamedSharding(mesh, logical_to_spec(ax, x.shape, mesh_shape),
                                                  memory_kind=memory_kind),
                      axes_tree, shapes_tree, is_leaf=_is_axes)


def with_memory_kind(tree: Any, memory_kind: str) -> Any:
  """The same arrays (same shardings) moved to `memory_kind`: "pinned_host" keeps them in host RAM, out of
  accelerator memory; "device" brings them back for computation. XLA:CPU has both kinds too, so the move
  is real there, but on a CPU both live in the same RAM: it saves nothing."""
  if memory_kind not in CHOICES["mesh.ref_params_memory"]:
    raise ValueError(f"memory kind must be one of {CHOICES['mesh.ref_params_memory']}, got {memory_kind!r}")
  return jax.tree.map(lambda x: jax.device_put(x, x.sharding.with_memory_kind(memory_kind)), tree)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Sharding constraint for an activation inside jit; a no-op unless a mesh is set (`jax.set_mesh`)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or mesh.size == 1:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, dict(mesh.shape)))
