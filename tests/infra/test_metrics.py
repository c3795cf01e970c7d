"""Metrics: JSONL round trip, TensorBoard event contents, dumps, phase timing."""
import dataclasses
import glob
import json
import os
import struct
import time

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.crc32c import crc32c
from tensorboardX.proto import event_pb2

from configs import base
from seed_jax.infra import metrics


def _masked_crc(data: bytes) -> int:  # TFRecord framing, as tensorflow/core/lib/hash/crc32c.h masks it
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """Parses every TFRecord event file under `logdir`, checking both CRCs of each record."""
  out: dict[str, list[tuple[int, float]]] = {}
  files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
  assert files, f"no event file in {logdir}"
  for path in files:
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
      header = data[pos:pos + 8]
      (length,) = struct.unpack("<Q", header)
      assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == _masked_crc(header)
      body = data[pos + 12:pos + 12 + length]
      assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == _masked_crc(body)
      pos += 16 + length
      event = event_pb2.Event.FromString(body)
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, v.simple_value))
  return out


def test_jsonl_round_trip_and_tensorboard(tmp_path):
  cfg = base.get_base().log
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=cfg) as w:
    w.write(1, {"loss": 0.25, "success": np.float32(0.5), "n_tokens": np.int64(1234), "kl": jnp.asarray(1e-3),
                "nan": float("nan"), "inf": np.float32(np.inf), "skipped": True})
    w.write(2, {"loss": -1.5, "nan": 2.0})
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  recs = [json.loads(line) for line in lines]
  assert len(recs) == 2
  assert {k: v for k, v in recs[0].items() if k != "wall_time"} == {
      "step": 1, "loss": 0.25, "success": 0.5, "n_tokens": 1234, "kl": float(np.float32(1e-3)), "nan": None,
      "inf": None, "skipped": 1}
  assert isinstance(recs[0]["n_tokens"], int)
  assert abs(recs[0]["wall_time"] - time.time()) < 60
  assert (recs[1]["step"], recs[1]["loss"], recs[1]["nan"]) == (2, -1.5, 2.0)
  assert '"nan": null' in lines[0]

  tb = _read_scalars(str(tmp_path / "tb"))
  assert tb["loss"] == [(1, 0.25), (2, -1.5)]
  assert tb["n_tokens"] == [(1, 1234.0)]
  assert tb["nan"] == [(2, 2.0)]  # the NaN at step 1 was skipped
  assert "inf" not in tb
  assert tb["kl"] == [(1, pytest.approx(1e-3, rel=1e-6))]


def test_append_across_restarts(tmp_path):
  for step in (1, 2):
    with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=base.get_base().log) as w:
      w.write(step, {"x": float(step)})
  steps = [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2]


def test_rewind_keeps_one_record_per_finished_update(tmp_path):
  """A run killed after writing update 2's record but before checkpoint 3 resumes at update 2: that record,
  the evaluation after 3 updates and a line cut off by the kill go; the evaluation after 2 updates (of the
  weights checkpoint 2 holds) and everything earlier stay."""
  cfg = base.get_base().log
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=cfg) as w:
    w.write(0, {"eval/updates_done": 0, "eval/x": 0.0})
    for step in (0, 1, 2):
      w.write(step, {"x": float(step)})
      if step == 1:
        w.write(2, {"eval/updates_done": 2, "eval/x": 2.0})
    w.write(3, {"eval/updates_done": 3, "eval/x": 3.0})
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 3, "x"')  # cut off
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=cfg) as w:
    assert w.rewind(2) == 3
    w.write(2, {"x": 20.0})
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], "eval/x" in r) for r in rows] == [(0, True), (0, False), (1, False), (2, True), (2, False)]
  assert rows[-1]["x"] == 20.0
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=cfg) as w:
    assert w.has_record(2, "eval/updates_done") and not w.has_record(3, "eval/updates_done")
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=cfg) as w:
    assert w.rewind(0) == 5  # nothing saved: every record is redone, the at-start evaluation too
  assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_bad_metric_values_raise(tmp_path):
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=_no_tb()) as w:
    with pytest.raises(ValueError, match="'vec' must be a real scalar"):
      w.write(0, {"vec": np.ones(3)})
    with pytest.raises(ValueError, match="'name' must be a real scalar"):
      w.write(0, {"name": "abc"})
    with pytest.raises(ValueError, match="other than 'step'"):
      w.write(0, {"step": 1})


def _no_tb():
  cfg = base.get_base().log
  cfg.tensorboard = False
  return cfg


@dataclasses.dataclass
class _Rec:
  traj_id: int
  skill: str | None
  logps: np.ndarray


def test_dumps_land_in_the_right_files(tmp_path):
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=_no_tb()) as w:
    path = w.dump_jsonl("skills", 12, [{"traj_id": 0, "skill": "Open the door.", "score": float("nan")},
                                       _Rec(1, None, np.array([-0.5, -1.25], np.float32))])
    assert path == str(tmp_path / "dumps" / "skills_step000012.jsonl")
    w.dump_jsonl("trajectories", 3, [])
    with pytest.raises(ValueError, match="dump name"):
      w.dump_jsonl("../escape", 1, [])
  recs = [json.loads(l) for l in open(path)]
  assert recs == [{"traj_id": 0, "skill": "Open the door.", "score": None},
                  {"traj_id": 1, "skill": None, "logps": [-0.5, -1.25]}]
  assert (tmp_path / "dumps" / "trajectories_step000003.jsonl").read_text() == ""
  assert sorted(os.listdir(tmp_path / "dumps")) == ["skills_step000012.jsonl", "trajectories_step000003.jsonl"]


def test_non_writer_writes_nothing(tmp_path):
  d = tmp_path / "w"
  w = metrics.MetricsWriter(str(d), is_writer=False, cfg=base.get_base().log)
  rec = w.write(5, {"x": 1.0})
  assert (rec["step"], rec["x"]) == (5, 1.0)
  assert w.dump_jsonl("skills", 5, [{"a": 1}]) is None
  w.close()
  assert not d.exists()


def test_wandb_missing_is_not_fatal(tmp_path):
  cfg = _no_tb()
  cfg.wandb = True
  try:
    import wandb  # noqa: F401
    pytest.skip("wandb is installed; this test covers its absence")
  except ImportError:
    pass
  with metrics.MetricsWriter(str(tmp_path), is_writer=True, cfg=cfg) as w:
    w.write(0, {"x": 1.0})
  assert json.loads((tmp_path / "metrics.jsonl").read_text())["x"] == 1.0


def test_phase_timer(tmp_path):
  timer = metrics.PhaseTimer(progress=False)
  with timer.phase("rollout", total=2) as bar:
    bar.update(1)
    time.sleep(0.05)
  with timer.phase("rollout"):
    time.sleep(0.02)
  with timer.phase("update"):
    pass
  with pytest.raises(RuntimeError):
    with timer.phase("analyze"):
      raise RuntimeError("boom")  # time is still recorded
  t = timer.pop()
  assert sorted(t) == ["time/analyze_s", "time/rollout_s", "time/update_s"]
  assert 0.07 <= t["time/rollout_s"] < 1.0
  assert 0.0 <= t["time/update_s"] < 0.05
  assert timer.pop() == {}


def test_phase_timer_with_bar(capsys):
  timer = metrics.PhaseTimer(progress=True)
  with timer.phase("rollout", total=3) as bar:
    for _ in range(3):
      bar.update(1)
  assert "rollout" in capsys.readouterr().out
  assert list(timer.pop()) == ["time/rollout_s"]
