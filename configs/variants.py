"""The named variants of the run configs: `--config=configs/<env>.py:paper,sft` names entries of one table.

Each entry is an overlay on the ConfigDict, `overlay(c, paper)`. "paper" is the sizing: SEED's settings in place
of the CPU default. It is applied first wherever it is named, since the other overlays size themselves by it (a
Stage 1 stage is CPU-sized without it); the other names apply left to right. Shared entries: the Stage 1 stages
(configs/stage1.py, at most one per spec) and "vl" (configs/vl.py) for the visual games; a config file adds its
own. An unknown name is a ValueError listing the known ones.
"""
from typing import Callable, Mapping

import ml_collections

from configs import stage1, vl

Overlay = Callable[[ml_collections.ConfigDict, bool], None]
PAPER = "paper"


def _stage(name: str) -> Overlay:
  def overlay(c, paper: bool) -> None:
    stage1.apply(c, name, paper)
  return overlay


STAGES: dict[str, Overlay] = {name: _stage(name) for name in stage1.STAGES}
VL: dict[str, Overlay] = {"vl": vl.apply}


def names(spec: str, table: Mapping[str, Overlay], config: str) -> list[str]:
  """The names of a comma-separated spec such as "sft,paper", each checked against `table`."""
  parts = [p for p in spec.split(",") if p]
  for p in parts:
    if p not in table:
      raise ValueError(f"unknown variant {p!r} of configs/{config}.py; known: "
                       f"{', '.join(repr(k) for k in ('', *sorted(table)))}")
  stages = [p for p in parts if p in STAGES]
  if len(stages) > 1:
    raise ValueError(f"variant {spec!r} of configs/{config}.py names {len(stages)} Stage 1 stages "
                     f"({', '.join(stages)}); name one at most")
  return parts


def build(spec: str, config: str, c: ml_collections.ConfigDict, cpu: Callable[[ml_collections.ConfigDict], None],
          table: Mapping[str, Overlay]) -> ml_collections.ConfigDict:
  """`c` (the env's config before its sizing) sized by `cpu` or table["paper"], then the other named overlays
  of `spec` applied left to right."""
  parts = names(spec, table, config)
  paper = PAPER in parts
  if paper:
    table[PAPER](c, True)
  else:
    cpu(c)
  for p in parts:
    if p != PAPER:
      table[p](c, paper)
  return c
