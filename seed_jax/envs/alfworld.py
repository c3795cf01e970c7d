"""ALFWorld (text): the TextWorld PDDL engine over the official ALFWorld game folders.

Data (from `alfworld-download`): <data_dir>/json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/ with
traj_data.json, initial_state.pddl and game.tw-pddl (a JSON file holding the PDDL domain, the text grammar,
the PDDL problem, `solvable` and `walkthrough`). Games are selected as alfworld's
AlfredTWEnv.collect_game_files does: the six task types, no movable/sliced trials, a game file present and
marked solvable. Panels are sorted by trial path, so they never depend on filesystem order or worker count
(the official data gives valid_seen 140 and valid_unseen 134 games).

The engine (textworld.envs.PddlEnv wrapped by alfworld's AlfredDemangler, as alfworld's text env does) is
imported lazily: listing tasks needs only the files.
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

from seed_jax.envs import base, prompting

NAME = "alfworld"
SPLITS = ("train", "valid_seen", "valid_unseen")
GAMES_DIR = "json_2.1.1"
WIN_REWARD = 10.0
# traj_data["task_type"] -> reporting family; the keys are alfred_tw_env.TASK_TYPES.
FAMILIES = {
  "pick_and_place_simple": "pick",
  "look_at_obj_in_light": "look",
  "pick_clean_then_place_in_recep": "clean",
  "pick_heat_then_place_in_recep": "heat",
  "pick_cool_then_place_in_recep": "cool",
  "pick_two_obj_and_place": "pick_two",
}
_TASK_MARKER = "Your task is to: "
_DOWNLOAD_HINT = ("Obtain the official data with `pip install alfworld` then `alfworld-download` (it writes to "
                  "$ALFWORLD_DATA, default ~/.cache/alfworld), or point the config field data_dir at a folder "
                  f"that holds {GAMES_DIR}/.")


def data_root(cfg: Any) -> str:
  """The data folder after defaults; a clear error when json_2.1.1/ is not there."""
  root = cfg.data_dir or os.environ.get("ALFWORLD_DATA") or os.path.expanduser("~/.cache/alfworld")
  if not os.path.isdir(os.path.join(root, GAMES_DIR)):
    raise FileNotFoundError(f"ALFWorld data not found: {os.path.join(root, GAMES_DIR)} does not exist "
                            f"(data_dir={cfg.data_dir!r}). {_DOWNLOAD_HINT}")
  return root


def _is_playable(trial_dir: str, rel: str) -> str | None:
  """The task type of a trial folder that alfworld's collect_game_files keeps, else None."""
  if "movable" in rel or "Sliced" in rel:  # movable receptacles and slicing are unsupported in the text engine
    return None
  with open(os.path.join(trial_dir, "traj_data.json")) as f:
    task_type = json.load(f).get("task_type")
  game_file = os.path.join(trial_dir, "game.tw-pddl")
  if task_type not in FAMILIES or not os.path.exists(game_file):
    return None
  with open(game_file) as f:
    if not json.load(f).get("solvable"):  # a missing key counts as unsolvable, as in alfworld
      return None
  return task_type


def task_panel(cfg: Any, split: str) -> list[base.Task]:
  if split not in SPLITS:
    raise ValueError(f"alfworld split={split!r}; expected one of {SPLITS}")
  split_dir = os.path.join(data_root(cfg), GAMES_DIR, split)
  if not os.path.isdir(split_dir):
    raise FileNotFoundError(f"ALFWorld split folder {split_dir} does not exist. {_DOWNLOAD_HINT}")
  tasks = []
  for dirpath, _, files in os.walk(split_dir):
    if "traj_data.json" not in files:
      continue
    rel = os.path.relpath(dirpath, split_dir).replace(os.sep, "/")
    task_type = _is_playable(dirpath, rel)
    if task_type is not None:
      spec = {"game_file": f"{GAMES_DIR}/{split}/{rel}/game.tw-pddl", "task_type": task_type}
      tasks.append(base.Task(f"{split}/{rel}", split, NAME, spec, FAMILIES[task_type]))
  return sorted(tasks, key=lambda t: t.task_id)


class AlfworldEnv:
  """One engine instance; reloads the game only when the task's game file changes."""

  def __init__(self, cfg: Any):
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    self._root = data_root(cfg)
    infos = textworld.EnvInfos(won=True, admissible_commands=True)
    self._env = AlfredDemangler(PddlEnv(infos), shuffle=False)  # shuffle=False: alfworld's eval setting
    self._game_file: str | None = None
    self._walkthrough: list[str] | None = None
    self._task_description = ""

  def reset(self, task: base.Task) -> base.Observation:
    game_file = task.spec.get("game_file")
    if not isinstance(game_file, str):
      raise ValueError(f"alfworld task {task.task_id!r}: spec.game_file={game_file!r} is not a path")
    if game_file != self._game_file:
      path = os.path.join(self._root, game_file)
      with open(path) as f:
        data = json.load(f)
      self._env.load(data)
      self._game_file, self._walkthrough = game_file, data.get("walkthrough")
    state = self._env.reset()
    text = state.feedback
    start = text.find(_TASK_MARKER)
    if start < 0:
      raise ValueError(f"alfworld game {game_file}: no {_TASK_MARKER!r} line in the intro text {text!r}")
    self._task_description = text[start + len(_TASK_MARKER):].strip()
    return self._observation(state)

  def step(self, action: str) -> base.StepResult:
    state, _, _ = self._env.step(action)
    won = bool(state["won"])
    info = {"success": won, "score": float(won), "won": won}
    return base.StepResult(self._observation(state), WIN_REWARD if won else 0.0, won, info)

  def gold_actions(self) -> list[str] | None:
    """The game file's walkthrough (written by alfworld-generate), a winning sequence from the reset state."""
    return list(self._walkthrough) if self._walkthrough else None

  def close(self) -> None:
    self._env.close()

  def _observation(self, state: Any) -> base.Observation:
    # "help" is an engine command but not a task action; the reference prompt drops it.
    admissible = [c for c in state["admissible_commands"] if c != "help"]
    return base.Observation(state.feedback, self._task_description, admissible, {"game_file": self._game_file})


def make_env(cfg: Any) -> AlfworldEnv:
  return AlfworldEnv(cfg)


def render_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: base.Observation,
                  cfg: Any) -> str:
  return prompting.render_env_prompt(NAME, task_description, history, obs.text, obs.admissible or (), cfg)


parse_action = prompting.parse_env_action


FAMILY = base.EnvFamily(name=NAME, make_env=make_env, tasks=task_panel, render_prompt=render_prompt,
                        parse_action=parse_action)
