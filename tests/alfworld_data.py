"""ALFWorld test data in the official on-disk format, built from tests/fixtures/alfworld.

The fixtures hold two scenes (objects + initial state, ALFRED's PDDL) and nine trial folders with traj_data.json.
`build_data` lays them out as alfworld-download's data: initial_state.pddl = scene + the goal from alfworld's own
goal library, and game.tw-pddl as alfworld-generate writes it (shipped domain, shipped grammar with the templated
goal text, a planner walkthrough, `solvable`).
"""
import json
import pathlib
import random
import shutil

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "alfworld"


def write_game(trial: pathlib.Path, domain: str, grammar: str) -> None:
  import textworld
  from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
  from alfworld.agents.utils.misc import add_task_to_grammar
  from alfworld.gen import goal_library
  from textworld.envs import PddlEnv

  traj = json.loads((trial / "traj_data.json").read_text())
  params = traj["pddl_params"]
  goal_type = traj["task_type"] + ("_slice" if params["object_sliced"] else "")
  goal = goal_library.gdict[goal_type]["pddl"].replace("#", "-").format(
    obj=params["object_target"], recep=params["parent_target"], toggle=params["toggle_target"],
    mrecep=params["mrecep_target"])
  scene = (FIXTURES / "scenes" / f"{traj['scene']['floor_plan']}.pddl").read_text()
  problem = scene + goal
  (trial / "initial_state.pddl").write_text(problem)
  state = random.getstate()
  random.seed(0)  # alfworld picks one of two goal templates with the global RNG
  game = {"pddl_domain": domain, "grammar": add_task_to_grammar(grammar, traj), "pddl_problem": problem}
  random.setstate(state)
  planner = AlfredDemangler(PddlEnv(textworld.EnvInfos(extras=["walkthrough"])), shuffle=False)
  try:
    planner.load(dict(game, walkthrough=None))
    plan = planner.reset()["extra.walkthrough"]
  except KeyError:  # fast-downward's translator proved the goal unreachable; the engine cannot load it
    plan = []
  game.update(walkthrough=plan or None, solvable=bool(plan))
  (trial / "game.tw-pddl").write_text(json.dumps(game))


def build_data(root: pathlib.Path, split: str = "*") -> str:
  """Copies the trial folders under `root`/json_2.1.1 and writes the game files of `split` (default: all);
  returns `root`."""
  import alfworld as alfworld_pkg

  shipped = pathlib.Path(alfworld_pkg.__file__).parent / "data"
  domain, grammar = (shipped / "alfred.pddl").read_text(), (shipped / "alfred.twl2").read_text()
  shutil.copytree(FIXTURES / "json_2.1.1", root / "json_2.1.1")
  for traj in sorted(root.glob(f"json_2.1.1/{split}/*/*/traj_data.json")):
    write_game(traj.parent, domain, grammar)
  return str(root)
