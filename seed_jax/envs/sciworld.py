"""ScienceWorld (`scienceworld` 1.2.3, a JVM simulator): 30 task types of elementary-school science.

Instances are (task type, variation, simplifications). Panels:
  train    seen task types x their train variations (all of them, sorted)
  dev      seen task types x a fixed sample of their dev variations
  eval_l0  seen task types x a fixed sample of their test variations (L0: seen types, unseen variations)
  eval_l2  held-out task types x a fixed sample of their test variations (L2: unseen task types)
Reward 10 when the task is completed with score 100, else 0; the score (0..100, negative on failure) is in
info. The prompt shows the action templates and the visible objects, not the thousands of valid
object combinations (listing them costs more than the step itself).
"""
from __future__ import annotations

import contextlib
import json
import os
import random
from typing import Any, Iterator, Sequence

from seed_jax.envs import prompting
from seed_jax.envs.base import EnvFamily, Observation, StepResult, Task

# (train, dev, test) variation counts per task type in scienceworld 1.2.3; each split is a contiguous range
# of variation ids in that order (tests check this table against the JVM). Panels never need a JVM.
VARIATION_SPLITS = {
    "boil": (14, 7, 9),
    "change-the-state-of-matter-of": (14, 7, 9),
    "chemistry-mix": (16, 8, 8),
    "chemistry-mix-paint-secondary-color": (18, 9, 9),
    "chemistry-mix-paint-tertiary-color": (18, 9, 9),
    "find-animal": (150, 75, 75),
    "find-living-thing": (150, 75, 75),
    "find-non-living-thing": (150, 75, 75),
    "find-plant": (150, 75, 75),
    "freeze": (14, 7, 9),
    "grow-fruit": (62, 31, 33),
    "grow-plant": (62, 31, 33),
    "identify-life-stages-1": (6, 3, 5),
    "identify-life-stages-2": (4, 2, 4),
    "inclined-plane-determine-angle": (84, 42, 42),
    "inclined-plane-friction-named-surfaces": (692, 346, 348),
    "inclined-plane-friction-unnamed-surfaces": (80, 40, 42),
    "lifespan-longest-lived": (62, 31, 32),
    "lifespan-longest-lived-then-shortest-lived": (62, 31, 32),
    "lifespan-shortest-lived": (62, 31, 32),
    "measure-melting-point-known-substance": (218, 109, 109),
    "measure-melting-point-unknown-substance": (150, 75, 75),
    "melt": (14, 7, 9),
    "mendelian-genetics-known-plant": (60, 30, 30),
    "mendelian-genetics-unknown-plant": (240, 120, 120),
    "power-component": (10, 5, 5),
    "power-component-renewable-vs-nonrenewable-energy": (10, 5, 5),
    "test-conductivity": (450, 225, 225),
    "test-conductivity-of-unknown-substances": (300, 150, 150),
    "use-thermometer": (270, 135, 135),
}
TASK_TYPES = tuple(sorted(VARIATION_SPLITS))
SIMPLIFICATIONS = ("teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction", "easy")
# split -> (variation split index, seen types?)
SPLITS = {"train": (0, True), "dev": (1, True), "eval_l0": (2, True), "eval_l2": (2, False)}
# Template wording as the parser also accepts it, closer to what the gold paths say ("go to kitchen").
_TEMPLATE_TEXT = {"go OBJ": "go to OBJ", "teleport OBJ": "teleport to OBJ"}
_HIDDEN_TEMPLATES = ("reset task",)  # restarting the episode from inside it only wastes steps


def _names(field: str, value: str) -> list[str]:
  names = [n.strip() for n in value.split(",") if n.strip()]
  bad = [n for n in names if n not in VARIATION_SPLITS]
  if bad:
    raise ValueError(f"config.{field}: unknown task types {bad}; allowed: {TASK_TYPES}")
  return names


def _check_simplification(value: str) -> str:
  bad = [s for s in value.split(",") if s and s not in SIMPLIFICATIONS]
  if bad:
    raise ValueError(f"config.simplification={value!r}: unknown {bad}; allowed: {SIMPLIFICATIONS}")
  return value


def task_types(cfg: Any, split: str) -> list[str]:
  """The task types of a split, sorted: held-out ones for eval_l2, the others (or cfg.task_types) else."""
  unseen = sorted(set(_names("unseen_task_types", cfg.unseen_task_types)))
  if not SPLITS[split][1]:
    return unseen
  seen = _names("task_types", cfg.task_types) or [t for t in TASK_TYPES if t not in unseen]
  overlap = sorted(set(seen) & set(unseen))
  if overlap:
    raise ValueError(f"config.task_types and config.unseen_task_types share {overlap}")
  return sorted(set(seen))


def task_panel(cfg: Any, split: str) -> list[Task]:
  """Fixed task panel, sorted by (task type, variation). Samples use a string-seeded RNG, so a panel is the
  same in every process and on every host, whatever the worker count."""
  if split not in SPLITS:
    raise ValueError(f"split={split!r}; allowed: {tuple(SPLITS)}")
  simplification = _check_simplification(cfg.simplification)
  part = SPLITS[split][0]
  per_type = {"train": 0, "dev": cfg.dev_per_type, "eval_l0": cfg.eval_l0_per_type,
              "eval_l2": cfg.eval_l2_per_type}[split]
  tasks = []
  for name in task_types(cfg, split):
    sizes = VARIATION_SPLITS[name]
    variations = list(range(sum(sizes[:part]), sum(sizes[:part + 1])))
    if split != "train":
      if per_type < 1:
        raise ValueError(f"config.{split}_per_type={per_type} must be >= 1")
      k = min(per_type, len(variations))
      variations = sorted(random.Random(f"sciworld:{cfg.panel_seed}:{split}:{name}").sample(variations, k))
    for v in variations:
      tasks.append(Task(task_id=f"sciworld/{name}/{v}", split=split, env="sciworld",
                        spec={"task_name": name, "variation": v, "simplification": simplification},
                        family=name))
  return tasks


@contextlib.contextmanager
def _java_tool_options(options: str) -> Iterator[None]:
  """Sets JAVA_TOOL_OPTIONS while the package launches its JVM (it takes no JVM options itself)."""
  old = os.environ.get("JAVA_TOOL_OPTIONS")
  if options:
    os.environ["JAVA_TOOL_OPTIONS"] = options
  try:
    yield
  finally:
    if old is None:
      os.environ.pop("JAVA_TOOL_OPTIONS", None)
    else:
      os.environ["JAVA_TOOL_OPTIONS"] = old


class SciWorldEnv:
  """One ScienceWorld simulator (its own JVM). Steps call the simulator directly with only what the prompt
  needs (observation, score, completion, visible objects): the package's `step` also lists every valid
  action combination, look and inventory, which the prompt never shows."""

  def __init__(self, cfg: Any):
    from scienceworld import ScienceWorldEnv  # imported here: workers build envs, drivers need not
    with _java_tool_options(cfg.jvm_options):
      self._sim = ScienceWorldEnv("", envStepLimit=10**9)  # step limits are the rollout's job
    self._server = self._sim.server
    self._success_reward = float(cfg.success_reward)
    self._gold_at_reset = bool(cfg.gold_path)
    self._spec: dict[str, Any] = {}
    self._actions: list[str] = []  # actions since reset, to rebuild the state when the gold path is made later
    self._gold: list[str] | None = None
    self._templates: list[str] = []
    self._task_description = ""
    self._done = True

  def reset(self, task: Task) -> Observation:
    spec = task.spec
    name, variation = spec["task_name"], int(spec["variation"])
    if name not in VARIATION_SPLITS or not 0 <= variation < sum(VARIATION_SPLITS[name]):
      raise ValueError(f"task {task.task_id}: no variation {variation} of task type {name!r}")
    self._spec = {"name": name, "variation": variation,
                  "simplification": _check_simplification(spec["simplification"])}
    text = self._load(self._gold_at_reset)
    self._gold = list(self._server.getGoldActionSequence()) if self._gold_at_reset else None
    self._task_description = self._server.getTaskDescription()
    templates = {d["action_example"] for d in json.loads(self._server.getPossibleActionsWithIDs())}
    self._templates = sorted(_TEMPLATE_TEXT.get(t, t) for t in templates if t not in _HIDDEN_TEMPLATES)
    self._actions = []
    self._done = False
    return self._observation(text)

  def step(self, action: str) -> StepResult:
    if self._done:
      raise RuntimeError("step after the episode ended; reset first")
    text = self._server.step(action)
    self._actions.append(action)
    score = int(round(100 * self._server.getScore()))
    completed = bool(self._server.getCompleted())
    success = completed and score >= 100
    self._done = completed or score < 0  # a negative score means the task was failed irrecoverably
    info = {"success": success, "score": score}
    return StepResult(self._observation(text), self._success_reward if success else 0.0, self._done, info)

  def gold_actions(self) -> list[str]:
    """The simulator's gold path from the reset state. Made on demand by reloading the task with gold-path
    generation and replaying this episode's actions, which leaves the current state as it was."""
    if self._gold is None:
      self._load(True)
      for a in self._actions:
        self._server.step(a)
      self._gold = list(self._server.getGoldActionSequence())
    return list(self._gold)

  def close(self) -> None:
    self._sim.close()

  def _load(self, gold: bool) -> str:
    s = self._spec
    self._sim.load(s["name"], s["variation"], s["simplification"], generateGoldPath=gold)
    return self._server.step("look around")  # the first observation, as the package's own reset does

  def _observation(self, text: str) -> Observation:
    objects = sorted(set(json.loads(self._server.getPossibleObjectReferentLUTJSON()).values()))
    return Observation(text=text, task_description=self._task_description, admissible=self._templates,
                       info={"objects": objects})


def make_env(cfg: Any) -> SciWorldEnv:
  return SciWorldEnv(cfg)


def render_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: Observation, cfg: Any) -> str:
  return prompting.render_env_prompt("sciworld", task_description, history, obs.text, obs.admissible or (),
                                     cfg, objects=", ".join(obs.info.get("objects", [])))


parse_action = prompting.parse_env_action


FAMILY = EnvFamily(name="sciworld", make_env=make_env, tasks=task_panel, render_prompt=render_prompt,
                   parse_action=parse_action)
