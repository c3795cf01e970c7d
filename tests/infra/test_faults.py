"""Fault-drill plans: parsing, the process an item names, what runs on several processes, once per workdir."""
import json

import pytest

from seed_jax.infra import faults


def test_a_plan_parses_into_kind_update_and_process():
  assert faults.parse_plan(" env_kill@1, ckpt_write@3:p1 ,") == {("env_kill", 1, None), ("ckpt_write", 3, 1)}


@pytest.mark.parametrize("item", ["boom@1", "ckpt_write@x", "ckpt_write@1:p", "ckpt_write@1:q1", "ckpt_write@1:px"])
def test_a_bad_item_is_named(item):
  with pytest.raises(ValueError, match=f"config.faults.plan item {item!r}: want kind@update"):
    faults.parse_plan(item)


def test_only_checkpoint_write_drills_run_on_several_processes():
  assert faults.multi_process_problem("ckpt_write@1:p1,ckpt_write@2") is None
  assert faults.multi_process_problem("ckpt_write@1,sigterm@2,env_kill@0:p1") == (
      "config.faults.plan: only ckpt_write drills run on several processes, not env_kill, sigterm")


def test_an_item_naming_a_process_fires_there_only_and_once_per_workdir(tmp_path):
  plan = "ckpt_write@1:p1,nan_grad@2"
  zero, one = faults.Faults(plan, str(tmp_path), process=0), faults.Faults(plan, str(tmp_path), process=1)
  assert not zero.take("ckpt_write", 1) and one.take("ckpt_write", 1) and not one.take("ckpt_write", 1)
  assert zero.take("nan_grad", 2) and one.take("nan_grad", 2)  # an item without :pN: every process
  with open(tmp_path / faults.FIRED_FILE) as f:
    assert [json.loads(line) for line in f] == [{"kind": "ckpt_write", "update": 1, "process": 1},
                                                {"kind": "nan_grad", "update": 2, "process": 0},
                                                {"kind": "nan_grad", "update": 2, "process": 1}]
  # resumed: each process reads its own record, so neither fires again
  again = [faults.Faults(plan, str(tmp_path), process=p) for p in (0, 1)]
  assert not any(f.take(k, u) for f in again for k, u in (("ckpt_write", 1), ("nan_grad", 2)))
