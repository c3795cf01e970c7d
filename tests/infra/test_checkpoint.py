"""Checkpoints: bit-exact round trip, keep-N, latest step, fingerprint check, resharding, crash safety, a failed
write reported as one line."""
import contextlib
import logging
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from helpers import REPO
from configs import base
from seed_jax.infra import checkpoint

FP = {"model.num_layers": 2, "model.dims": [8, 4], "model.vocab": 32}


def _cfg(**kw):
  cfg = base.get_base().train.checkpoint  # save_interval_steps 1
  cfg.update(kw)
  return cfg


def _state(seed: int = 0):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  params = {"w": jax.random.normal(k1, (8, 4), jnp.float32),
            "emb": jax.random.normal(k2, (32, 4), jnp.float32).astype(jnp.bfloat16),
            "b": jnp.arange(4, dtype=jnp.int32) + seed}
  opt = optax.adamw(1e-3).init(params)
  return {"params": params, "opt": opt, "step": jnp.asarray(seed, jnp.int32), "key": jax.random.key(seed)}


def _assert_bit_equal(a, b):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def test_round_trip_is_bit_exact(tmp_path):
  state = _state(3)
  meta = {"sampler": {"epoch": 1, "position": 17, "order": [3, 1, 2]}, "history": [{"step": 3, "loss": 0.125}]}
  with checkpoint.Checkpointer(str(tmp_path), _cfg(), fingerprint=FP) as ck:
    assert ck.latest_step() is None
    assert ck.save(3, state, meta)
    ck.wait()
    restored, meta2 = ck.restore(3, checkpoint.abstract_state(state))
  _assert_bit_equal(restored, state)
  assert type(restored["opt"][0]) is type(state["opt"][0])  # optax named tuples survive
  assert meta2 == meta
  # a fresh process-like reopen reads the same thing
  ck2 = checkpoint.Checkpointer(str(tmp_path), _cfg(), fingerprint=FP, read_only=True)
  stored = ck2.restore_metadata(3)
  assert {k: stored[k] for k in ("fingerprint", "metadata")} == {"fingerprint": FP, "metadata": meta}
  assert set(stored["checksums"]) == set(stored["arrays"]) == set(checkpoint.array_specs(state))
  restored2, _ = ck2.restore(None, checkpoint.abstract_state(state))
  _assert_bit_equal(restored2, state)
  ck2.close()


def test_keep_n_latest_and_interval(tmp_path):
  with checkpoint.Checkpointer(str(tmp_path), _cfg(max_to_keep=2, save_interval_steps=2)) as ck:
    saved = [ck.save(s, _state(s), {"s": s}) for s in range(1, 8)]
    assert saved == [False, True, False, True, False, True, False]
    assert ck.save(7, _state(7), {"s": 7}, force=True)
    ck.wait()
    assert ck.all_steps() == [6, 7]
    assert ck.latest_step() == 7
    state, meta = ck.restore(None, checkpoint.abstract_state(_state(0)))
  assert meta == {"s": 7}
  _assert_bit_equal(state, _state(7))
  assert sorted(os.listdir(tmp_path)) == ["6", "7"]


def test_incompatible_fingerprint_names_fields(tmp_path):
  with checkpoint.Checkpointer(str(tmp_path), _cfg(), fingerprint=FP) as ck:
    ck.save(1, _state(1), {})
  other = dict(FP, **{"model.num_layers": 4})
  del other["model.vocab"]
  other["model.heads"] = 2
  ck = checkpoint.Checkpointer(str(tmp_path), _cfg(), fingerprint=other)
  with pytest.raises(checkpoint.IncompatibleCheckpointError) as err:
    ck.restore(1, checkpoint.abstract_state(_state(1)))
  msg = str(err.value)
  assert "step 1" in msg
  assert "model.num_layers: checkpoint=2, current=4" in msg
  assert "model.vocab: checkpoint=32, current='<missing>'" in msg
  assert "model.heads: checkpoint='<missing>', current=2" in msg
  assert "model.dims" not in msg
  ck.close()


def test_config_fingerprint():
  cfg = ml_collections.ConfigDict({"model": {"num_layers": 2, "dims": (8, 4), "rope": {"theta": 1e4}}, "lr": 1e-6})
  fp = checkpoint.config_fingerprint(cfg, ["model.num_layers", "model.dims", "model.rope"])
  assert fp == {"model.num_layers": 2, "model.dims": [8, 4], "model.rope": {"theta": 10000.0}}
  with pytest.raises(KeyError, match="model.heads"):
    checkpoint.config_fingerprint(cfg, ["model.heads"])


def test_restore_onto_another_sharding(tmp_path):
  devs = np.array(jax.devices())
  assert devs.size == 8
  mesh_a = Mesh(devs.reshape(8), ("data",))
  mesh_b = Mesh(devs.reshape(2, 4), ("fsdp", "tensor"))
  x = jnp.arange(64 * 16, dtype=jnp.float32).reshape(64, 16) / 7.0
  y = jnp.arange(16, dtype=jnp.int32)
  state = {"x": jax.device_put(x, NamedSharding(mesh_a, P("data", None))),
           "y": jax.device_put(y, NamedSharding(mesh_a, P()))}
  with checkpoint.Checkpointer(str(tmp_path), _cfg()) as ck:
    ck.save(5, state, {})
    target = {"x": jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=NamedSharding(mesh_b, P("tensor", "fsdp"))),
              "y": jax.ShapeDtypeStruct((16,), jnp.int32, sharding=NamedSharding(mesh_b, P("tensor")))}
    restored, _ = ck.restore(5, target)
  assert restored["x"].sharding == target["x"].sharding
  assert restored["y"].sharding == target["y"].sharding
  assert restored["x"].addressable_shards[0].data.shape == (16, 8)
  _assert_bit_equal(restored, {"x": x, "y": y})


def test_missing_dir_and_step(tmp_path):
  missing = tmp_path / "nope"
  with pytest.raises(FileNotFoundError, match="does not exist"):
    checkpoint.Checkpointer(str(missing), _cfg(), read_only=True)
  with checkpoint.Checkpointer(str(tmp_path / "ck"), _cfg()) as ck:
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
      ck.restore(None, {})
    ck.save(2, _state(2), {})
    with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 9 .*available steps: \[2\]"):
      ck.restore(9, checkpoint.abstract_state(_state(2)))
    with pytest.raises(ValueError, match="JSON values"):
      ck.save(3, _state(3), {"bad": object()})


@pytest.mark.slow
def test_crash_during_save_is_never_restored(tmp_path):
  """A process is killed right after an async save starts: the half-written step is ignored and cleaned up."""
  ck = checkpoint.Checkpointer(str(tmp_path), _cfg())
  ck.save(1, _state(1), {"s": 1})
  ck.close()
  script = textwrap.dedent(f"""
      import os, time, jax.numpy as jnp
      from configs import base
      from seed_jax.infra import checkpoint
      cfg = base.get_base().train.checkpoint  # save_interval_steps 1
      ck = checkpoint.Checkpointer({str(tmp_path)!r}, cfg)
      ck.save(2, {{"big": jnp.ones((4096, 4096), jnp.float32)}}, {{"s": 2}})
      # The step's temporary folder can appear after save() returns (the write is in the background): die as
      # soon as it exists, while the write is in progress, rather than racing it.
      deadline = time.monotonic() + 60
      while not any(d.startswith("2") for d in os.listdir({str(tmp_path)!r})) and time.monotonic() < deadline:
        time.sleep(0.001)
      os._exit(0)
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120, cwd=str(REPO))
  leftovers = [d for d in os.listdir(tmp_path) if d.startswith("2")]
  assert leftovers and all("tmp" in d for d in leftovers), leftovers
  ck = checkpoint.Checkpointer(str(tmp_path), _cfg())
  assert ck.latest_step() == 1
  state, meta = ck.restore(None, checkpoint.abstract_state(_state(1)))
  _assert_bit_equal(state, _state(1))
  assert meta == {"s": 1}
  assert sorted(os.listdir(tmp_path)) == ["1"]  # the temporary directory was removed on start
  ck.close()


@contextlib.contextmanager
def _files_capped_at(limit_bytes):
  """Writes past `limit_bytes` fail with EFBIG (File too large) in this process, like a full disk, without the
  privileges a tmpfs mount needs; the soft limit and SIGXFSZ are restored afterwards."""
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, handler)


def test_failed_async_write_is_one_error_naming_step_folder_and_cause(tmp_path, capfd):
  """A background write that fails is reported by the next poll (one line: step, folder, the OS's cause, the
  latest good step), without Orbax's tracebacks; the good checkpoint stays restorable and close() is quiet."""
  ck = checkpoint.Checkpointer(str(tmp_path), _cfg(max_to_keep=3))
  ck.save(1, _state(1), {"s": 1})
  ck.wait()
  big = {"big": jax.random.normal(jax.random.PRNGKey(0), (1024, 1024), jnp.float32)}  # 4 MiB, incompressible
  with _files_capped_at(1 << 20):
    ck.save(2, big, {"s": 2})
    with pytest.raises(checkpoint.CheckpointWriteError) as e:
      for _ in range(600):
        ck.poll()  # never blocks: returns while the write is still running
        time.sleep(0.05)
  assert str(e.value) == (f"checkpoint 2 could not be written in {tmp_path}: File too large (errno 27); "
                          "the latest saved checkpoint is 1")
  ck.close()
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err, err[-2000:]
  ck = checkpoint.Checkpointer(str(tmp_path), _cfg())
  assert ck.all_steps() == [1]
  state, meta = ck.restore(None, checkpoint.abstract_state(_state(1)))
  _assert_bit_equal(state, _state(1))
  ck.close()


def test_abandoned_orbax_write_logged_by_asyncio_is_dropped_and_other_errors_are_not():
  """asyncio's 'exception was never retrieved' for an abandoned Orbax write names Orbax only in its traceback,
  or (TensorStore's errors carry no Python frames) only by the path of Orbax's temporary step folder: those
  records are dropped; an error that does neither is still logged."""
  def record(code_file, path="/data/run/checkpoints/3/x"):
    try:
      exec(compile(f"raise ValueError('OUT_OF_RANGE: Error writing {path}')", code_file, "exec"))
    except ValueError as e:
      exc_info = (ValueError, e, e.__traceback__ if code_file else None)
    return logging.LogRecord("asyncio", logging.ERROR, "/usr/lib/python3.11/asyncio/base_events.py", 1771,
                             "Future exception was never retrieved\nfuture: <Future finished exception=%r>",
                             (exc_info[1],), exc_info)
  orbax_file = os.path.join(os.sep, "venv", "orbax", "checkpoint", "_src", "serialization", "serialization.py")
  logged = lambda r: all(f.filter(r) for f in logging.getLogger("asyncio").filters)
  assert not logged(record(orbax_file))
  assert not logged(record("", "/data/run/checkpoints/1.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/d/92d6"))
  assert logged(record(os.path.join(os.sep, "app", "mine.py")))
  assert logged(record(""))


# ----------------------------------------------------------------------------------------------------------
# Damaged steps: detected, moved aside, resumed from the newest intact one


def _big_state(seed: int):
  return dict(_state(seed), big=jax.random.normal(jax.random.PRNGKey(100 + seed), (256, 256), jnp.float32))


def _files(step_dir):
  return sorted((os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs), key=os.path.getsize)


def _flip(path, at=None, n=64):
  data = bytearray(open(path, "rb").read())
  at = len(data) // 2 if at is None else at
  for i in range(at, min(at + n, len(data))):
    data[i] ^= 0xFF
  open(path, "wb").write(bytes(data))


DAMAGES = {
    "data bytes": lambda d: _flip(_files(os.path.join(d, "state"))[-1]),
    "our metadata": lambda d: _flip(os.path.join(d, "meta", "metadata"), n=8),
    "array metadata": lambda d: _flip(os.path.join(d, "state", "_METADATA"), n=8),
    "truncated": lambda d: os.truncate(_files(os.path.join(d, "state"))[-1], 1000),
    "deleted": lambda d: os.remove(_files(os.path.join(d, "state"))[-1]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_step_is_reported_moved_aside_and_the_previous_one_resumed(damage, tmp_path, caplog):
  folder = str(tmp_path / "checkpoints")
  with checkpoint.Checkpointer(folder, _cfg(), fingerprint=FP) as ck:
    ck.save(1, _big_state(1), {"next": 1})
    ck.save(2, _big_state(2), {"next": 2})
  DAMAGES[damage](os.path.join(folder, "2"))
  with caplog.at_level(logging.WARNING, logger="seed_jax.infra.checkpoint"), \
      checkpoint.Checkpointer(folder, _cfg(), fingerprint=FP) as ck:
    state, meta = ck.restore_latest(checkpoint.abstract_state(_big_state(0)))
    assert ck.all_steps() == [1]
  _assert_bit_equal(state, _big_state(1))
  assert meta == {"next": 1}
  lines = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
  assert len(lines) == 1 and lines[0].startswith("checkpoint 2 is damaged (") and lines[0].endswith("resuming from 1")
  assert os.path.isdir(str(tmp_path / "checkpoints.damaged" / "2"))  # kept, not deleted


def test_every_step_damaged_starts_over_and_another_model_is_not_damage(tmp_path, caplog):
  folder = str(tmp_path / "checkpoints")
  with checkpoint.Checkpointer(folder, _cfg(), fingerprint=FP) as ck:
    ck.save(1, _big_state(1), {"next": 1})
  other = dict(_big_state(1), big=jnp.zeros((256, 128), jnp.float32))
  with checkpoint.Checkpointer(folder, _cfg(), fingerprint=FP) as ck:
    with pytest.raises(checkpoint.IncompatibleCheckpointError, match=r"\['big'\]: checkpoint='\(256, 256\) float32'"):
      ck.restore_latest(checkpoint.abstract_state(other))
    assert ck.all_steps() == [1]  # a config mismatch leaves the step where it is
  DAMAGES["data bytes"](os.path.join(folder, "1"))
  with caplog.at_level(logging.WARNING, logger="seed_jax.infra.checkpoint"), \
      checkpoint.Checkpointer(folder, _cfg(), fingerprint=FP) as ck:
    assert ck.restore_latest(checkpoint.abstract_state(_big_state(0))) is None
    assert ck.all_steps() == []
  assert any(r.getMessage().endswith("no older checkpoint: starting from the beginning") for r in caplog.records)


def test_checksums_ignore_the_sharding_and_see_one_changed_element():
  from seed_jax.infra import checksum
  state = _big_state(3)
  plain = checksum.tree_checksums(state)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
  sharded = dict(state, big=jax.device_put(state["big"], NamedSharding(mesh, P("a", "b"))),
                 params=dict(state["params"], emb=jax.device_put(state["params"]["emb"], NamedSharding(mesh, P(None, "a")))))
  assert checksum.tree_checksums(sharded) == plain
  nudged = dict(state, big=state["big"].at[17, 5].set(jnp.nextafter(state["big"][17, 5], jnp.inf)))  # one ulp
  assert checksum.differing(plain, checksum.tree_checksums(nudged)) == ["['big']"]
  swapped = dict(state, big=state["big"].at[0, :2].set(state["big"][0, 1::-1]))  # two elements trade places
  assert checksum.differing(plain, checksum.tree_checksums(swapped)) == ["['big']"]
