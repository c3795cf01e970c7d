"""benchmarks.turns: the sides of a peer benchmark run one at a time, in an order rotated each round, and a side
that dies is named."""
from __future__ import annotations

import sys

import pytest

from benchmarks.turns import Side, alternate
from helpers import REPO

# A side as benchmarks.update --gate runs: warm-up, `ready`, then per turn: its work, `round` (the last: final line).
CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from benchmarks.turns import gate
name, rounds, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("a log line that is not JSON", flush=True)
gate({{"ready": True}})
for r in range(rounds):
  with open(log, "a") as f:
    f.write(f"{{name}}{{r}} start\\n")
  time.sleep(0.05)  # another side running now would write its start line here
  with open(log, "a") as f:
    f.write(f"{{name}}{{r}} end\\n")
  if name == "dies" and r == 1:
    sys.exit(5)
  if r < rounds - 1:
    gate({{"round": r}})
print('{{"bench": "final", "side": "' + name + '"}}', flush=True)
"""


def _sides(tmp_path, names, rounds):
  script, log = tmp_path / "child.py", tmp_path / "log"
  script.write_text(CHILD.format(root=str(REPO)))
  sides = [Side(n, [sys.executable, str(script), n, str(rounds), str(log)]) for n in names]
  assert all(s.report() == {"ready": True} for s in sides)
  return sides, log


def test_sides_take_turns_one_at_a_time_in_rotated_order(tmp_path):
  sides, log = _sides(tmp_path, ["a", "b", "c"], 4)
  finals = alternate(sides, 4)
  assert [s.close() for s in sides] == [0, 0, 0]
  assert finals == {n: {"bench": "final", "side": n} for n in "abc"}
  lines = log.read_text().split()
  turns = lines[0::2]  # "a0", "start", "a0", "end", ...: each start is followed by its own end
  assert lines[1::2] == ["start", "end"] * 12 and turns[0::2] == turns[1::2]
  assert turns[0::2] == ["a0", "b0", "c0", "b1", "c1", "a1", "c2", "a2", "b2", "a3", "b3", "c3"]


def test_a_side_that_dies_is_named(tmp_path):
  sides, _ = _sides(tmp_path, ["ok", "dies"], 3)
  try:
    with pytest.raises(SystemExit, match=r"dies's side ended \(exit 5\) before its next report"):
      alternate(sides, 3)
  finally:
    codes = [s.close() for s in sides]
  assert codes == [1, 5]  # the survivor ends at its gate when the driver closes its stdin
