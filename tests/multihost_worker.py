"""One process of tests/infra/test_distributed.py: trains the tiny model two steps or restores a checkpoint, on a mesh
spanning every process (CPU devices, gloo collectives over loopback), and writes the full state as .npz.

python tests/multihost_worker.py {train,restore} --devices=4 --port=P --num_processes=2 --process_id=0 ...
"""
import argparse
import json
import os
import sys
import time

ARGS = argparse.ArgumentParser()
ARGS.add_argument("role", choices=("train", "restore", "die", "preempt"))
ARGS.add_argument("--devices", type=int, required=True)  # fake CPU devices of this process
ARGS.add_argument("--port", type=int, default=0)
ARGS.add_argument("--num_processes", type=int, default=1)
ARGS.add_argument("--process_id", type=int, default=0)
ARGS.add_argument("--shape", default="1,-1,1")  # mesh.shape (per slice)
ARGS.add_argument("--dcn_shape", default="1,1,1")
ARGS.add_argument("--ckpt", required=True)  # checkpoint folder to write (train) or read (restore)
ARGS.add_argument("--out", required=True)  # .npz of the full state (written by process 0)
ARGS.add_argument("--watch_poll_s", type=float, default=None)  # peers.POLL_S: 0 keeps the watcher inside its reads
A = ARGS.parse_args()

# Before jax is imported: this process's own device count (the parent's XLA_FLAGS are replaced).
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={A.devices}"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from configs import base  # noqa: E402
from seed_jax import batch as batch_lib  # noqa: E402
from seed_jax import update  # noqa: E402
from seed_jax.infra import checkpoint as ckpt_lib  # noqa: E402
from seed_jax.infra import distributed  # noqa: E402
from seed_jax.infra import mesh as mesh_lib  # noqa: E402
from seed_jax.infra import peers  # noqa: E402
from seed_jax.models import transformer as tf  # noqa: E402
from seed_jax.models import weights  # noqa: E402
from seed_jax.losses import SeedLossConfig  # noqa: E402
from seed_jax.models.spec import ModelSpec  # noqa: E402
from tests.scale_helpers import numpy_params, random_minibatch  # noqa: E402

SPEC = ModelSpec("Qwen3ForCausalLM", vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                 ffn_dim=128)
ROWS, PROMPT, RESPONSE = 16, 16, 8


def optimizer():
  cfg = base.get_base().learner
  cfg.lr, cfg.eps = 1e-2, 1e-3  # as in test_mesh: steps that move weights by ~1e-3..1e-2
  return update.make_optimizer(cfg)


def global_minibatch() -> batch_lib.MiniBatch:
  return random_minibatch(ROWS, PROMPT, RESPONSE, SPEC.vocab_size)


def fresh_state(mesh) -> update.TrainState:
  """Initial weights placed the way the loader places them (weights.default_placer), then the train state."""
  place = weights.default_placer(mesh)
  host = numpy_params(SPEC)
  params = jax.tree.map(lambda ax, x: place(ax, np.asarray(x)), tf.param_axes(SPEC), host,
                        is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x))
  return update.init_state(params, optimizer())


def save_full(state, path: str):
  """Gathers the whole state onto every process (all take part); process 0 writes it. Returns it."""
  full = multihost_utils.process_allgather(state, tiled=True)
  if distributed.is_writer():
    np.savez(path, **{jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(full)})
  return full


def restore(mesh, folder: str, out: str) -> None:
  with ckpt_lib.Checkpointer(folder, base.get_base().train.checkpoint, read_only=True) as ckpt:
    state, meta = ckpt.restore(None, ckpt_lib.abstract_state(fresh_state(mesh)))
  assert all(x.sharding.mesh == mesh for x in jax.tree.leaves(state))
  save_full(state, out)


def main():
  if A.num_processes > 1:
    dc = base.get_base().distributed
    dc.coordinator_address, dc.num_processes, dc.process_id = f"127.0.0.1:{A.port}", A.num_processes, A.process_id
    dc.initialization_timeout_s = 60
    dc.heartbeat_timeout_s = 10 if A.role == "die" else dc.heartbeat_timeout_s
    if A.watch_poll_s is not None:
      peers.POLL_S = A.watch_poll_s
    assert distributed.initialize(dc)
  if A.role == "die":  # the last process dies after one collective; the others go on calling collectives
    multihost_utils.process_allgather(np.ones(2))
    print("process", jax.process_index(), "past the first collective", flush=True)
    # The dying process waits until the others have left the collective too: exiting while a peer's gloo still
    # reads from it aborts that peer inside the first collective (seen once on a 2-core CI machine).
    client, me, last = peers._client(), jax.process_index(), jax.process_count() - 1
    client.key_value_set(f"past/{me}", "1")
    if me == last:
      for i in range(last):
        client.blocking_key_value_get(f"past/{i}", 60_000)
      os._exit(3)
    for _ in range(120):
      multihost_utils.process_allgather(np.ones(2))
      time.sleep(1)
    return
  if A.role == "preempt":  # steps of a loop as loop.train runs them, until a SIGTERM reaches any process
    from seed_jax.infra.stop import StopSignals
    with StopSignals(multi_process=True) as stop:
      for step in range(600):
        multihost_utils.process_allgather(np.ones(2))  # the step's collective work
        if stop.at_sync_point(step):
          print(f"process {jax.process_index()} stopped before step {step} by {stop.requested}", flush=True)
          return
        if step == 3:
          print(f"process {jax.process_index()} running", flush=True)
        time.sleep(0.2)
    sys.exit("no stop within 600 steps")
  mc = base.get_base().mesh
  mc.shape, mc.dcn_shape = tuple(map(int, A.shape.split(","))), tuple(map(int, A.dcn_shape.split(",")))
  mesh = mesh_lib.mesh_from_config(mc)
  if A.role == "restore":
    restore(mesh, A.ckpt, A.out)
    return
  state = fresh_state(mesh)
  opt = optimizer()
  fn = update.make_update_fn(SPEC, SeedLossConfig.from_config(base.get_base().objectives), opt, micro_batch_size=8, chunk=8, remat=False,
                             state_shardings=update.state_shardings(state.params, opt))
  # This process supplies its share of the global rows; the global batch is the same for any process count.
  share = ROWS // jax.process_count()
  local = jax.tree.map(lambda x: x[jax.process_index() * share:(jax.process_index() + 1) * share], global_minibatch())
  batch = distributed.global_batch(local, mesh)
  assert batch.prompt_BP.shape == (ROWS, PROMPT)
  losses = []
  with jax.set_mesh(mesh):
    for _ in range(2):
      state, metrics = fn(state, batch, jnp.float32(1.0))
      losses.append(float(metrics["loss"]))
  full = save_full(state, A.out)
  init = numpy_params(SPEC)
  change = max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(jax.tree.leaves(full.params),
                                                                        jax.tree.leaves(init)))
  with ckpt_lib.Checkpointer(A.ckpt, base.get_base().train.checkpoint) as ckpt:
    ckpt.save(2, state, metadata=dict(losses=losses), force=True)
  info = dict(losses=losses, max_param_change=change, process_index=jax.process_index(),
              process_count=jax.process_count(),
              mesh=dict(mesh.shape), my_tasks=distributed.host_slice(list(range(10)), jax.process_index(),
                                                                      jax.process_count()),
              agreed=distributed.agree_max(3 * (jax.process_index() + 1), 7))
  with open(f"{A.out}.{jax.process_index()}.json", "w") as f:
    json.dump(info, f)


if __name__ == "__main__":
  main()
