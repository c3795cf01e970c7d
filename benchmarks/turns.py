"""Sides of a comparison that take turns. Each side is a child process that, under `--gate`, prints one JSON line
and waits for a line on stdin before each measured round; the driver runs one side at a time and rotates their
order from round to round, so a slow spell of the host falls on every side and the per-round ratios compare
sides measured minutes apart. Standard library only: TRL's Python imports this file too.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Sequence


def gate(note: dict[str, Any]) -> None:
  """A child's side of a turn: says where it stands (one JSON line), then waits for the driver's go."""
  print(json.dumps(note), flush=True)
  if not sys.stdin.readline():
    raise SystemExit("the benchmark's driver closed stdin before this side's next turn")


class Side:
  """A child the driver runs turn by turn. Its first report (`ready`) comes after its warm-up; each turn's report
  is {"round": i} after it, the last turn's its final JSON line."""

  def __init__(self, name: str, args: Sequence[str], **popen: Any):
    self.name = name
    self.proc = subprocess.Popen(list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **popen)

  def report(self) -> dict[str, Any]:
    """The child's next JSON-object line (other stdout lines, such as a trainer's log dicts, are skipped)."""
    for line in self.proc.stdout:
      try:
        obj = json.loads(line)
      except ValueError:
        continue
      if isinstance(obj, dict):
        return obj
    raise SystemExit(f"{self.name}'s side ended (exit {self.proc.wait()}) before its next report; its log is above")

  def turn(self) -> dict[str, Any]:
    self.proc.stdin.write("go\n")
    self.proc.stdin.flush()
    return self.report()

  def close(self, timeout_s: float = 30.0) -> int:
    """Lets a finished child exit (a stuck or unfinished one is killed); its exit status."""
    self.proc.stdin.close()  # a child still waiting at its gate ends there
    try:
      return self.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      return self.proc.wait()


def alternate(sides: Sequence[Side], rounds: int) -> dict[str, dict[str, Any]]:
  """`rounds` turns of every side (all past their `ready` report), the order rotated each round: A B C, B C A,
  C A B, ... Returns each side's final line."""
  finals = {}
  for r in range(rounds):
    k = r % len(sides)
    for side in list(sides[k:]) + list(sides[:k]):
      t0 = time.perf_counter()
      out = side.turn()
      print(f"round {r + 1}/{rounds}: {side.name} {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
      if r == rounds - 1:
        finals[side.name] = out
  return finals
