"""Multi-host runs: process start-up, global batches from process-local rows, and the split of work.

Every process runs the same program. Device work is SPMD over the global mesh, so each jitted call is made
by all processes with arrays of the same global shape; each process supplies only the rows that live on its
own devices (`global_batch`; `grouped_global_batch` for micro-batches) and reads back only those
(`local_rows`); a process's rows are one contiguous block (`row_block`). Shapes are agreed first
(`agree_max`), small host data is gathered (`allgather_objects`). Host work (environments, prompts) is split
deterministically (`host_slice`), and only process 0 writes logs, dumps and metrics.
"""
from __future__ import annotations

import logging
import math
import os
import pickle
import socket
import time
from typing import Any, Sequence, TypeVar

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

log = logging.getLogger(__name__)
T = TypeVar("T")
BATCH_AXES = ("data", "fsdp")  # the mesh axes rows are split over (mesh.RULES["batch"])

# Environment variables that mark a multi-worker job JAX can configure itself from (TPU pod slices and
# multi-slice jobs, GKE/JobSet, SLURM, Open MPI).
_CLUSTER_MARKERS = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS",
                    "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE")


class SetupError(ValueError):
  """A multi-process job that cannot start or cannot split its work (one line for the user)."""


def _cluster_detected() -> bool:
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts:
    return True
  return any(os.environ.get(k) for k in _CLUSTER_MARKERS[1:])


def initialize(dc: ml_collections.ConfigDict) -> bool:
  """Joins the multi-process job described by `config.distributed` (before any other JAX call).

  With `coordinator_address` the address, process count and id come from the config (CPU/GPU clusters);
  otherwise `jax.distributed.initialize()` detects them (TPU pod slices, GKE, SLURM). Returns whether this
  is a multi-process run. Calling it again is a no-op.
  """
  if dc.mode not in ("auto", "on", "off"):
    raise SetupError(f"distributed.mode must be 'auto', 'on' or 'off', got {dc.mode!r}")
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  explicit = bool(dc.coordinator_address)
  if dc.mode == "off" or (dc.mode == "auto" and not explicit and not _cluster_detected()):
    return False
  kwargs: dict[str, Any] = dict(initialization_timeout=int(dc.initialization_timeout_s),
                                heartbeat_timeout_seconds=int(dc.heartbeat_timeout_s))
  if explicit:
    if dc.num_processes < 1 or not 0 <= dc.process_id < dc.num_processes:
      raise SetupError(f"distributed.coordinator_address is set, so distributed.num_processes (>= 1) and "
                       f"distributed.process_id (in [0, num_processes)) must be too; got "
                       f"num_processes={dc.num_processes}, process_id={dc.process_id}")
    kwargs.update(coordinator_address=dc.coordinator_address, num_processes=dc.num_processes,
                  process_id=dc.process_id)
  if explicit and dc.process_id != 0:  # JAX aborts the process on a coordinator it cannot reach: say it in one line
    _wait_for_coordinator(dc.coordinator_address, float(dc.initialization_timeout_s), dc.process_id,
                          dc.num_processes)
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # e.g. DEADLINE_EXCEEDED: the coordinator never answered
    where = (f"coordinator {dc.coordinator_address} as process {dc.process_id} of {dc.num_processes}" if explicit
             else "the detected cluster")
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise SetupError(f"could not join {where} within distributed.initialization_timeout_s="
                     f"{dc.initialization_timeout_s}: {msg}") from e
  log.info("process %d of %d; %d local devices of %d", jax.process_index(), jax.process_count(),
           jax.local_device_count(), jax.device_count())
  from seed_jax.infra import peers
  peers.start_watcher()  # a fatal error on any process ends every process (peers.fail_all)
  return jax.process_count() > 1


def _wait_for_coordinator(address: str, timeout_s: float, process_id: int, num_processes: int) -> None:
  """Returns once something listens at `address` (process 0 starts the coordinator there)."""
  host, _, port = address.rpartition(":")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=2):
        return
    except OSError as e:
      if time.monotonic() > deadline:
        raise SetupError(f"the coordinator {address} did not come up within distributed.initialization_timeout_s="
                         f"{timeout_s:g} (process {process_id} of {num_processes}; {e.strerror or e}): start "
                         "process 0 there, or fix distributed.coordinator_address") from None
      time.sleep(0.5)


def is_multi_process() -> bool:
  """Whether this process joined a job of several (without starting a backend when it did not)."""
  return jax.distributed.is_initialized() and jax.process_count() > 1


def is_writer() -> bool:
  """Only process 0 writes logs, metrics, dumps and exported weights."""
  return jax.process_index() == 0


def host_slice(items: Sequence[T], process_index: int, process_count: int) -> list[T]:
  """This process's share of a list every process holds identically: items[process_index::process_count].

  Round-robin keeps the shares within one item of each other and keeps each item whole (a task and its G
  group members stay on one host, so group statistics need no communication)."""
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"host_slice: need 0 <= process_index < process_count, got {process_index} of {process_count}")
  return list(items[process_index::process_count])


def batch_sharding(mesh: Mesh, ndim: int = 1, rows: int | None = None, axis: int = 0) -> NamedSharding:
  """Rows (axis `axis`) split over every data-parallel mesh axis, the other axes whole. With `rows` that the
  data-parallel size does not divide, the rows are replicated instead (one process only)."""
  dp = math.prod(mesh.shape[a] for a in BATCH_AXES)
  if rows is not None and rows % dp:
    if jax.process_count() > 1:
      raise ValueError(f"a global batch of {rows} rows does not divide over data x fsdp = {dp} devices")
    return NamedSharding(mesh, P())
  return NamedSharding(mesh, P(*([None] * axis), BATCH_AXES, *([None] * (ndim - axis - 1))))


def local_dp(mesh: Mesh) -> int:
  """Data-parallel shards of rows on this process's devices: each process supplies that many row shards."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES) // jax.process_count()


def check_row_split(mesh: Mesh) -> None:
  """Every process must own an equal, contiguous block of the rows (its own environments' rows): the
  data-parallel axes (data x fsdp) must divide over the processes, and no tensor-parallel group may span two."""
  P_ = jax.process_count()
  dp = math.prod(mesh.shape[a] for a in BATCH_AXES)
  if dp % P_:
    raise SetupError(f"data x fsdp = {dp} devices do not divide over {P_} processes: each process must own the "
                     f"rows of its own environments; make config.mesh.shape (or dcn_shape) give data x fsdp a "
                     f"multiple of {P_}")
  row_block(mesh, dp)  # raises when a process's rows are not one contiguous block


def row_block(mesh: Mesh, rows: int) -> tuple[int, int]:
  """(first row, row count) of this process's block of a [rows] axis split over the data-parallel devices."""
  if jax.process_count() == 1:
    return 0, rows
  idx = batch_sharding(mesh, 1, rows).addressable_devices_indices_map((rows,))
  starts = sorted({(sl[0].start or 0, sl[0].stop if sl[0].stop is not None else rows) for sl in idx.values()})
  lo, hi = starts[0][0], starts[-1][1]
  if hi - lo != rows // jax.process_count() or any(a[1] != b[0] for a, b in zip(starts, starts[1:])):
    raise SetupError(f"process {jax.process_index()}'s devices hold rows {starts} of {rows}, not one contiguous "
                     f"block: order config.mesh so each host's devices are adjacent on the data axes")
  return lo, hi - lo


def block_index(mesh: Mesh) -> int:
  """The position of this process's row block among the processes' blocks (row_block), in row order."""
  dp = math.prod(mesh.shape[a] for a in BATCH_AXES)
  return row_block(mesh, dp)[0] // (dp // jax.process_count())


def global_batch(local: Any, mesh: Mesh, axis: int = 0) -> Any:
  """Global device arrays whose rows (axis `axis`) are every process's `local` rows, each process's in its
  row block (row_block; a pytree of numpy arrays, the same shapes on every process). One process: a placement."""
  def one(x):
    x = np.asarray(x)
    rows = x.shape[axis] * jax.process_count() if x.ndim > axis else None
    if rows is None:
      return jax.make_array_from_process_local_data(NamedSharding(mesh, P()), x, x.shape)
    shape = x.shape[:axis] + (rows,) + x.shape[axis + 1:]
    return jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim, rows, axis), x, shape)
  return jax.tree.map(one, local)


def grouped_global_batch(local: Any, mesh: Mesh, groups: int) -> Any:
  """Each leaf's rows [groups * k, ...] (groups in order, e.g. micro-batches) as a global [groups, P * k, ...]
  array whose group g is every process's group g, spread over the data-parallel devices."""
  return global_batch(jax.tree.map(lambda x: np.asarray(x).reshape((groups, -1) + np.shape(x)[1:]), local), mesh,
                      axis=1)


def local_rows(x: jax.Array, axis: int = 0) -> np.ndarray:
  """This process's rows (axis `axis`) of an array laid out as by `global_batch`, whatever sharding the
  program that made it chose (the inverse of `global_batch`)."""
  if jax.process_count() == 1:
    return np.asarray(x)
  spec = P(*([None] * axis), BATCH_AXES)
  return np.asarray(multihost_utils.global_array_to_host_local_array(x, x.sharding.mesh, spec))


def agree_max(*values: int) -> tuple[int, ...]:
  """The element-wise maximum over all processes (e.g. row counts and bucketed lengths, so every process
  calls a jitted program with the same global shapes). Every process must call it at the same point."""
  if jax.process_count() == 1:
    return tuple(int(v) for v in values)
  gathered = multihost_utils.process_allgather(np.asarray(values, np.int64))
  return tuple(int(v) for v in np.max(np.asarray(gathered).reshape(jax.process_count(), -1), axis=0))


def any_process(flag: bool) -> bool:
  """Whether `flag` holds on some process (e.g. an episode still running somewhere)."""
  return agree_max(int(bool(flag)))[0] > 0


def allgather_objects(obj: Any) -> list[Any]:
  """Every process's (picklable) `obj`, in process order, on every process: small host data such as
  trajectory summaries and metric counts."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(pickle.dumps(obj), np.uint8)
  (n,) = agree_max(data.size)
  padded = np.zeros((n + 8,), np.uint8)
  padded[:8] = np.frombuffer(np.int64(data.size).tobytes(), np.uint8)
  padded[8:8 + data.size] = data
  rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(jax.process_count(), -1)
  return [pickle.loads(r[8:8 + int(np.frombuffer(r[:8].tobytes(), np.int64)[0])].tobytes()) for r in rows]
