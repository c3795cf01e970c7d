"""Two processes x 4 CPU devices joined by jax.distributed on loopback: the sharded update equals the
one-process update on the same global batch, and Orbax checkpoints move between process counts and meshes
bit-exactly. Each process is tests/multihost_worker.py; see it for what runs inside."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO
from seed_jax.infra.distributed import host_slice

pytestmark = pytest.mark.slow  # several JAX processes

ROOT = str(REPO)
WORKER = os.path.join(ROOT, "tests", "multihost_worker.py")
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(role: str, processes: int, *args: str) -> list[subprocess.Popen]:
  """`processes` workers of one job (4 devices each when several, else 8), started at once."""
  port = _free_port()
  devices = 8 // processes
  return [subprocess.Popen([sys.executable, WORKER, role, f"--devices={devices}", f"--port={port}",
                            f"--num_processes={processes}", f"--process_id={i}", *args],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for i in range(processes)]


def _wait(procs: list[subprocess.Popen]) -> None:
  try:
    for p in procs:
      out, _ = p.communicate(timeout=TIMEOUT_S)
      assert p.returncode == 0, out[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def _load(path) -> dict[str, np.ndarray]:
  with np.load(path) as f:
    return dict(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  d = tmp_path_factory.mktemp("multihost")
  # Stage 1: the same two steps in one process (mesh 1x8x1) and in two (two "slices" of 4: data across them).
  # One after the other: three JAX processes at once on two cores, beside the suite's other worker, once aborted
  # the pair inside gloo ("terminate called", a fresh-clone run on a 2-core AMD EPYC Zen 3).
  _wait(_launch("train", 2, "--dcn_shape=2,1,1", f"--ckpt={d}/ck2", f"--out={d}/train2.npz"))
  _wait(_launch("train", 1, f"--ckpt={d}/ck1", f"--out={d}/train1.npz"))
  # Stage 2: each checkpoint restored by the other process count, on yet another mesh.
  r1 = _launch("restore", 1, "--shape=1,2,4", f"--ckpt={d}/ck2", f"--out={d}/restored_in_1.npz")
  r2 = _launch("restore", 2, "--shape=2,2,2", f"--ckpt={d}/ck1", f"--out={d}/restored_in_2.npz")
  _wait(r1 + r2)
  return d


def test_two_process_update_equals_one_process(runs):
  one, two = _load(runs / "train1.npz"), _load(runs / "train2.npz")
  params = [k for k in one if k.startswith(".params")]
  assert len(params) == 14 and set(one) == set(two)  # untied Qwen3: 3 top-level + 11 per-layer weights
  for k in params:
    np.testing.assert_allclose(two[k], one[k], atol=1e-5, rtol=0, err_msg=k)
  assert int(one[".step"]) == int(two[".step"]) == 2
  info1 = json.loads((runs / "train1.npz.0.json").read_text())
  info2 = [json.loads((runs / f"train2.npz.{i}.json").read_text()) for i in range(2)]
  np.testing.assert_allclose(info2[0]["losses"], info1["losses"], atol=1e-5)
  assert info1["max_param_change"] > 1e-3  # the steps really moved the weights: the comparison can fail
  assert info2[0]["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1} and info2[1]["process_count"] == 2
  # Work split and agreement across processes: round-robin shares, the same maximum everywhere.
  assert [i["my_tasks"] for i in info2] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
  assert [i["agreed"] for i in info2] == [[6, 7], [6, 7]]
  assert not (runs / "train2.npz.npz").exists() and (runs / "train2.npz").exists()


def test_checkpoints_move_between_process_counts_bit_exactly(runs):
  for written, restored in (("train2.npz", "restored_in_1.npz"), ("train1.npz", "restored_in_2.npz")):
    a, b = _load(runs / written), _load(runs / restored)
    assert set(a) == set(b) and len(a) > 30  # params, both AdamW moments, counters
    for k in a:
      np.testing.assert_array_equal(b[k], a[k], err_msg=f"{restored}: {k}")


def test_a_dead_peer_ends_the_survivor_naming_it():
  """Process 1 dies after the first collective: within the heartbeat timeout (10 s here) JAX's coordination
  service ends process 0 with a non-zero status and a log line naming the dead task, instead of a hang."""
  procs = _launch("die", 2, "--ckpt=unused", "--out=unused")
  try:
    outs = [p.communicate(timeout=90)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert procs[1].returncode == 3 and "process 1 past the first collective" in outs[1]
  assert procs[0].returncode != 0 and "process 0 past the first collective" in outs[0], outs[0][-4000:]
  # JAX words it either way, depending on which of its threads notices first; both name task 1.
  assert re.search(r"Task 1 heartbeat timeout|unhealthy \(stopped sending heartbeats\):\s*1", outs[0]), outs[0][-3000:]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_on_one_process_stops_every_process_at_the_same_step(sig):
  """A preempted host gets SIGTERM (JAX's preemption notifier spreads it), Ctrl-C on one host SIGINT (the
  processes agree on it): StopSignals.at_sync_point is true on both processes before the same step, so all save
  the same update. The peers watcher polls without pause: a process that finalizes while the watcher is inside a
  read of the coordination service aborts ("FATAL: exception not rethrown"; 7 exits in 10 before peers stopped
  the watcher at exit)."""
  procs = _launch("preempt", 2, "--ckpt=unused", "--out=unused", "--watch_poll_s=0")
  try:
    for line in procs[1].stdout:
      if "process 1 running" in line:
        break
    procs[1].send_signal(getattr(signal, sig))
    outs = [p.communicate(timeout=120)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  tails = "\n".join(f"--- process {i}, status {p.returncode}:\n{out[-2000:]}" for i, (p, out) in
                    enumerate(zip(procs, outs)))
  assert [p.returncode for p in procs] == [0, 0], tails
  steps = [re.search(rf"process \d stopped before step (\d+) by {sig}", out) for out in outs]
  assert all(steps), outs
  assert steps[0].group(1) == steps[1].group(1)


def test_host_slice_is_a_deterministic_partition():
  tasks = [f"task{i}" for i in range(11)]
  shares = [host_slice(tasks, p, 3) for p in range(3)]
  assert shares == [tasks[0::3], tasks[1::3], tasks[2::3]]
  assert sorted(sum(shares, [])) == sorted(tasks) and [len(s) for s in shares] == [4, 4, 3]
  assert host_slice(tasks, 0, 1) == tasks
  with pytest.raises(ValueError, match="need 0 <= process_index < process_count, got 3 of 3"):
    host_slice(tasks, 3, 3)


def test_initialize_stays_single_process_without_a_cluster(monkeypatch):
  from configs import base
  from seed_jax.infra import distributed
  for var in ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID",
              "OMPI_COMM_WORLD_SIZE"):
    monkeypatch.delenv(var, raising=False)
  dc = base.get_base().distributed
  assert distributed.initialize(dc) is False  # auto, nothing configured or detected
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")  # a one-host TPU VM is not a cluster
  assert distributed.initialize(dc) is False
  dc.mode = "sometimes"
  with pytest.raises(ValueError, match="distributed.mode must be 'auto', 'on' or 'off', got 'sometimes'"):
    distributed.initialize(dc)
  dc.mode, dc.coordinator_address, dc.num_processes, dc.process_id = "auto", "127.0.0.1:1234", 2, 2
  with pytest.raises(ValueError, match="got num_processes=2, process_id=2"):
    distributed.initialize(dc)


def test_global_batch_replicates_rows_that_do_not_divide_the_mesh():
  import jax
  from seed_jax.infra import distributed
  from seed_jax.infra.mesh import make_mesh
  mesh = make_mesh((2, 4, 1))
  rows = np.arange(24).reshape(12, 2)
  sharded = distributed.global_batch({"x": rows[:8]}, mesh)["x"]
  assert sharded.addressable_shards[0].data.shape == (1, 2)  # 8 rows over data x fsdp = 8 devices
  replicated = distributed.global_batch({"x": rows}, mesh)["x"]  # 12 rows: not divisible by 8
  assert replicated.sharding.spec == jax.sharding.PartitionSpec()
  np.testing.assert_array_equal(distributed.local_rows(replicated), rows)
  np.testing.assert_array_equal(distributed.local_rows(sharded), rows[:8])
