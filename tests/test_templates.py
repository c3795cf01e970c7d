"""Prompt templates: the default templates render every prompt byte-identically to the golden outputs; a
replaced template (a verl-agent-style one, the skill placements) renders as written; a bad one is one clear
config error.

tests/fixtures/prompts/golden.json holds each case's prompt as the code rendered it before prompts became
template files; `python tests/test_templates.py --write` rewrites it (only for a deliberate wording change).
"""
import importlib
import itertools
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # skills_helpers, also when run as a script
from skills_helpers import toy_trajectory  # noqa: E402

from configs import alfworld as alfworld_config  # noqa: E402
from seed_jax import analyzers, batch, config as config_lib, skills, templates  # noqa: E402
from seed_jax.envs import get_family, prompting  # noqa: E402
from seed_jax.envs.base import Observation, Step  # noqa: E402
from seed_jax.rollout import fit_prompt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "fixtures" / "prompts" / "golden.json"
ENVS = ("alfworld", "sciworld", "textworld_express", "webshop", "ezpoints", "search", "sokoban")
# Values with braces and placeholder names must come through as plain text.
TASKS = ("Your task is to  put a clean\nmug in {the} sink.", "Task description: Your task is to boil water.",
         "find the coin")
OBS = "  You are in the kitchen.\nOn the counter: a mug, a {current_observation}.  \n"
ADMISSIBLE = ["go to sink 1", "take mug 1 from counter 1", "look"]


def _history(n: int) -> list[tuple[str, str]]:
  return [(f"obs {k}: a long room description with {{braces}} and more words {k}", f"act {k}") for k in range(1, n + 1)]


def _env_cfg(env: str, **overrides):
  cfg = importlib.import_module(f"configs.{env}").env_config()
  for k, v in overrides.items():
    cfg[k] = v
  return cfg


def _step_cases() -> dict:
  """(env, case) -> a zero-argument renderer, over first/later steps, windows, clipping, think rule, choices."""
  cases = {}
  for env in ENVS:
    fam = get_family(env)
    grid = [
        ("first", TASKS[0], [], {}, ADMISSIBLE),
        ("first_no_think", TASKS[1], [], {"require_think": False}, ADMISSIBLE),
        ("later_default", TASKS[0], _history(7), {"history_length": 3}, ADMISSIBLE),
        ("later_all_shown", TASKS[2], _history(2), {"history_length": 5}, ADMISSIBLE),
        ("later_clipped", TASKS[1], _history(4), {"history_length": 2, "history_obs_chars": 12}, ADMISSIBLE),
        ("later_no_window", TASKS[0], _history(4), {"history_length": 0}, ADMISSIBLE),
        ("later_no_think", TASKS[2], _history(3), {"history_length": 3, "require_think": False}, ADMISSIBLE),
        ("empty_choices", TASKS[0], _history(1), {"history_length": 1}, []),
        ("none_choices", TASKS[2], [], {}, None),
    ]
    if env in ("ezpoints", "sokoban"):
      grid += [("image", TASKS[2], _history(2), {"history_length": 1, "observation": "image"}, ADMISSIBLE)]
    for name, task, hist, over, admissible in grid:
      info = {"objects": ["door to kitchen", "air", "{x}"]} if admissible else {}
      obs = Observation(OBS + "Formula: 3+", task, admissible, info)
      cfg = _env_cfg(env, **over)
      cases[f"step/{env}/{name}"] = (lambda f=fam, t=task, h=hist, o=obs, c=cfg: f.render_prompt(t, h, o, c))
  return cases


def _analysis_cases() -> dict:
  by_chars = len
  by_words = lambda s: len(s.split())
  trajs = {
      "success_2": (toy_trajectory(2, 10.0, invalid_at=(2,)), 1.0),
      "failure_1": (toy_trajectory(1, 0.0), 1.0),
      "threshold": (toy_trajectory(3, 0.5), 0.5),
      "failure_10": (toy_trajectory(10, 0.0, invalid_at=(3, 4)), 1.0),
      "success_0_steps": (toy_trajectory(0, 1.0), 1.0),
  }
  braces = toy_trajectory(2, 0.0)
  braces.task_description = "open {the} box {0}"
  braces.steps[0].observation = "a {current_observation} here\nsecond line"
  braces.steps[1].response_text = '{"episode_skill": "x"} {}'
  trajs["braces"] = (braces, 1.0)
  cases = {}
  for name, (t, thr) in trajs.items():
    cases[f"analysis/{name}"] = lambda t=t, thr=thr: skills.analysis_prompt(t, thr)
    full = len(skills.analysis_prompt(t, thr))
    for budget_name, count, budget in (("fits", by_chars, full), ("minus1", by_chars, full - 1),
                                       ("most", by_chars, full - 250), ("none", by_chars, 5),
                                       ("words", by_words, 150)):
      cases[f"analysis_fitted/{name}/{budget_name}"] = (
          lambda t=t, thr=thr, c=count, b=budget: skills.analysis_prompt_fitted(t, c, b, thr))
  return cases


def _augment_cases() -> dict:
  alf = get_family("alfworld").render_prompt(TASKS[0], _history(2), Observation(OBS, TASKS[0], ADMISSIBLE),
                                             _env_cfg("alfworld"))
  prompts = {
      "env_prompt": alf,
      "after_task": "Intro.\nYour task: boil water\nHistory: none\nNow it is your turn to act.",
      "after_task_indented": "Intro.\n   Your task: boil water\nNow it is your turn to act.",
      "task_line_last": "A\nYour task: x",
      "before_turn": "Observation: dark room\nNow it is your turn to act.\n",
      "append": "Observation: x",
      "append_newline": "Observation: x\n",
      "empty": "",
  }
  skills_ = {"plain": "Heat the pot first.", "padded": "  Open it. \n", "braces": "Use {x} then {}.",
             "multiline": "Go north.\nTake key.", "blank": "  \n"}
  return {f"augment/{p}/{s}": (lambda p=prompt, s=skill: skills.augment_prompt(p, s))
          for p, prompt in prompts.items() for s, skill in skills_.items()}


def golden_cases() -> dict:
  cases = {**_step_cases(), **_analysis_cases(), **_augment_cases()}
  cases["json_retry"] = analyzers.json_retry_message
  for think in (True, False):
    cases[f"turn_line/think={think}"] = lambda t=think: prompting.turn_line(t)
    cases[f"turn_line/search/think={think}"] = lambda t=think: prompting.turn_line(t, ("search", "answer"))
  return cases


CASES = golden_cases()


@pytest.fixture(scope="module")
def golden() -> dict:
  return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_golden_covers_every_case(golden):
  assert sorted(golden) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_default_prompts_render_byte_identically(name, golden):
  assert CASES[name]() == golden[name]


# ----------------------------------------------------------------------------------------------------------
# Replaced templates

@pytest.fixture(autouse=True)
def default_templates():
  yield
  templates.use(None)


_FILE_NUMBERS = itertools.count()


def _files(tmp_path, **texts) -> dict:
  """Writes one new file per template (with the final newline editors add; a process reads each path once) and
  returns config.templates naming them."""
  tcfg = alfworld_config.get_config().templates
  for kind, text in texts.items():
    if kind not in templates.KINDS:  # a rendering option
      tcfg[kind] = text
      continue
    path = tmp_path / f"{kind}-{next(_FILE_NUMBERS)}.txt"
    path.write_text(text + "\n", encoding="utf-8")
    tcfg[kind] = str(path)
  return tcfg


def _with(tcfg):
  cfg = alfworld_config.get_config()
  cfg.templates = tcfg
  return cfg


REFERENCE_LATER = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}. "
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} "
    "observaitons and the corresponding actions you took: {action_history}\n"
    "You are now at step {current_step} and your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action, inside <action> </action> tags.")
REFERENCE_FIRST = (
    "You are an expert agent operating in the ALFRED Embodied Environment.\n"
    "Your current observation is: {current_observation}\n"
    "Your admissible actions of the current situation are: [{admissible_actions}].\n\n"
    "Now it's your turn to take an action, inside <action> </action> tags.")
HISTORY = [("You are in the middle of a room.", "go to sink 1"), ("You arrive at sink 1.", "look")]
NOW = Observation("You see a mug 1.", "put a clean mug in the sink", ["take mug 1 from sink 1", "look"])
REFERENCE_HISTORY = "[Observation {step}: '{observation}', Action {step}: '{action}']"
EXPECTED_LATER = (
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a clean mug in the "
    "sink. Prior to this step, you have already taken 2 step(s). Below are the most recent 2 observaitons and the "
    "corresponding actions you took: [Observation 1: 'You are in the middle of a room.', Action 1: 'go to sink 1']"
    "\n[Observation 2: 'You arrive at sink 1.', Action 2: 'look']\n"
    "You are now at step 3 and your current observation is: You see a mug 1.\n"
    "Your admissible actions of the current situation are: ['take mug 1 from sink 1'\n 'look'].\n\n"
    "Now it's your turn to take an action, inside <action> </action> tags.")


def _alfworld(history, **cfg):
  return get_family("alfworld").render_prompt("Your task is to put a clean mug in the sink", history, NOW,
                                              _env_cfg("alfworld", **cfg))


def test_a_verl_agent_style_template_with_its_quoted_action_list(tmp_path):
  """A template written in verl-agent's ALFWorld style, its actions quoted one per line ("\\n ".join("'a'"))."""
  tcfg = _files(tmp_path, step_first=REFERENCE_FIRST, step_later=REFERENCE_LATER, step_history=REFERENCE_HISTORY,
                action_list="quoted_lines")
  config_lib.validate(_with(tcfg))
  templates.use(tcfg)
  assert _alfworld(HISTORY) == EXPECTED_LATER
  assert _alfworld(HISTORY, history_length=0) == _alfworld([]) == (
      "You are an expert agent operating in the ALFRED Embodied Environment.\n"
      "Your current observation is: You see a mug 1.\n"
      "Your admissible actions of the current situation are: ['take mug 1 from sink 1'\n 'look'].\n\n"
      "Now it's your turn to take an action, inside <action> </action> tags.")
  tcfg.action_list = ""  # the env's own: comma-joined
  templates.use(tcfg)
  assert "are: [take mug 1 from sink 1, look]." in _alfworld([])


@pytest.mark.parametrize("fmt,expected", [
    ("comma", "search[<your query>], click[back to search]"),
    ("lines", "search[<your query>]\nclick[back to search]"),
    ("quoted_lines", "'search[<your query>]'\n 'click[back to search]'"),
    ("quoted_commas", "'search[<your query>]',\n'click[back to search]',"),
])
def test_action_list_formats(tmp_path, fmt, expected):
  tcfg = _files(tmp_path, step_first="{available_actions}", action_list=fmt)
  templates.use(tcfg)
  acts = ("search[<your query>]", "click[back to search]")
  assert prompting.render_step_prompt("webshop", task_description="t", history=[], observation="o",
                                      admissible_actions=acts, history_length=0, require_think=True) == expected
  templates.use(_files(tmp_path, step_first="{available_actions}"))  # "": the env's own (WebShop: one per line)
  obs = Observation("o", "buy a mug", list(acts))
  assert get_family("webshop").render_prompt("buy a mug", [], obs, _env_cfg("webshop")) == "\n".join(acts)


def test_an_unknown_action_list_format_is_one_line(tmp_path):
  cfg = _with(_files(tmp_path, action_list="bullets"))
  with pytest.raises(ValueError, match=r"templates.action_list.*bullets"):
    config_lib.validate(cfg)


def test_analysis_json_retry_and_skill_block_templates(tmp_path):
  header = ("Episode of {task_description}: {outcome} (success={success}, return {episode_return:.1f} in "
            "{step_count} steps, {termination}). Reply as JSON with episode_summary and episode_skill.")
  tcfg = _files(tmp_path, analysis_success=header, analysis_failure=header, analysis_step="#{step} {action} "
                "valid={action_valid}\n{observation} => {response}", analysis_omitted="({omitted} older steps cut)",
                analysis_footer="JSON now.", json_retry="Only the JSON with episode_summary and episode_skill.",
                skill_block="Hint: {skill} (end)")
  config_lib.validate(_with(tcfg))
  templates.use(tcfg)
  traj = toy_trajectory(3, 0.0, invalid_at=(2,))
  steps = ["#1 act 1 valid=true\nobs 1 => <think>t1</think><action>act 1</action>",
           "#2 act 2 valid=false\nobs 2 => <think>t2</think><action>act 2</action>",
           "#3 act 3 valid=true\nobs 3 => <think>t3</think><action>act 3</action>"]
  head = ("Episode of boil water: failure (success=false, return 0.0 in 3 steps, max_steps). Reply as JSON with "
          "episode_summary and episode_skill.")
  assert skills.analysis_prompt(traj) == "\n\n".join([head, *steps, "JSON now."])
  keep1 = "\n\n".join([head, "(2 older steps cut)", steps[2], "JSON now."])
  assert skills.analysis_prompt_fitted(traj, len, len(keep1)) == keep1
  assert analyzers.json_retry_message() == "Only the JSON with episode_summary and episode_skill."
  assert skills.augment_prompt("Your task: x\nNow it is your turn.", " Go. ") == (
      "Your task: x\nHint: Go. (end)\nNow it is your turn.")


def test_history_pairs_each_action_with_its_result(tmp_path):
  tcfg = _files(tmp_path, step_later="{action_history}\nNow: {current_observation}",
                step_history="{step}: {action} -> {observation}", history_pairs="result")
  config_lib.validate(_with(tcfg))
  templates.use(tcfg)
  history = [("question", "<search>a</search>"), ("doc a", "<search>b</search>")]
  render = lambda n: prompting.render_step_prompt("search", task_description="t", history=history, observation="doc b",
                                                  history_length=n, require_think=False)
  assert render(2) == "1: <search>a</search> -> doc a\n2: <search>b</search> -> doc b\nNow: doc b"
  assert render(1) == "2: <search>b</search> -> doc b\nNow: doc b"
  tcfg.history_pairs = "before"
  templates.use(tcfg)
  assert render(2) == "1: <search>a</search> -> question\n2: <search>b</search> -> doc a\nNow: doc b"


def test_analysis_numbering_separators_empty_task_and_a_stripped_teacher(tmp_path):
  """verl-agent-style options: steps from 0, separators written in the files ("" joins the parts as they are),
  a fallback for an empty task, and H(h, s) stripped at both ends."""
  header = "Task: {task_description}\nOutcome: {outcome}. Reply with episode_summary and episode_skill.\n"
  tcfg = _files(tmp_path, analysis_success=header, analysis_failure=header,
                analysis_step="[Step {step}] {observation} -> {response}\n", analysis_omitted="...\n",
                analysis_footer="Answer now.", skill_block="\n{skill}\n", skill_placement="placeholder",
                step_first="{skill}{current_observation}\n", step_later="{skill}{action_history}",
                analysis_first_step=0, analysis_separator="", empty_task="not available", strip_teacher=True)
  config_lib.validate(_with(tcfg))
  templates.use(tcfg)
  traj = toy_trajectory(3, 0.0)
  traj.task_description = ""
  assert skills.analysis_prompt(traj) == (
      "Task: not available\nOutcome: failure. Reply with episode_summary and episode_skill.\n"
      + "".join(f"[Step {k - 1}] obs {k} -> <think>t{k}</think><action>act {k}</action>\n" for k in (1, 2, 3))
      + "Answer now.")
  traj.task_description = "boil water"
  assert skills.analysis_prompt_fitted(traj, len, 100).startswith("Task: boil water\n")
  assert skills.augment_prompt("You see a pot.\n", "Heat it.", 0) == "Heat it.\n\nYou see a pot."
  tcfg.strip_teacher, tcfg.analysis_first_step = False, 1
  templates.use(tcfg)
  assert skills.augment_prompt("You see a pot.\n", "Heat it.", 0) == "\nHeat it.\n\nYou see a pot.\n"
  assert "[Step 1] obs 1 ->" in skills.analysis_prompt(traj)
  tcfg.analysis_first_step = 2
  with pytest.raises(ValueError, match="analysis_first_step"):
    config_lib.validate(_with(tcfg))


def test_skill_placements(tmp_path):
  prompt = _alfworld(HISTORY)
  task_line, turn_line = "Your task: put a clean mug in the sink", prompting.turn_line(True)
  after_task = skills.augment_prompt(prompt, "Wash it.")
  assert after_task == prompt.replace(task_line + "\n", task_line + "\nSkill from experience: Wash it.\n")
  templates.use(_files(tmp_path, skill_placement="before_turn"))
  assert skills.augment_prompt(prompt, "Wash it.") == prompt.replace(turn_line,
                                                                     "Skill from experience: Wash it.\n" + turn_line)
  tcfg = _files(tmp_path, skill_placement="placeholder", step_first="{skill}" + REFERENCE_FIRST,
                step_later=REFERENCE_LATER.replace("You are now at step", "{skill}You are now at step"),
                step_history=REFERENCE_HISTORY, action_list="quoted_lines")
  config_lib.validate(_with(tcfg))
  templates.use(tcfg)
  tok = type("CharTokenizer", (), {"encode_chat": lambda self, text: [ord(c) for c in text]})()
  fitted = fit_prompt(get_family("alfworld"), _env_cfg("alfworld"), tok, "put a clean mug in the sink", HISTORY, NOW,
                      10_000)
  assert fitted.text == EXPECTED_LATER and fitted.skill_at == EXPECTED_LATER.index("You are now at step 3")
  augmented = EXPECTED_LATER.replace("You are now at step", "Skill from experience: Wash it.\nYou are now at step")
  assert skills.augment_prompt(fitted.text, "Wash it.", fitted.skill_at) == augmented
  step = Step(fitted.text, fitted.ids, "r", [1], [0.0], "o", "a", True, info={"skill_at": fitted.skill_at})
  traj = toy_trajectory(1, 0.0)
  traj.steps = [step]
  samples = batch.collect_samples([traj], ["Wash it."], tok, 10_000)
  assert samples.skill_prompts[0] == tok.encode_chat(augmented)
  with pytest.raises(ValueError, match="skill_at"):
    skills.augment_prompt(fitted.text, "Wash it.")


def _error(tcfg) -> str:
  with pytest.raises(ValueError) as e:
    config_lib.validate(_with(tcfg))
  assert "\n" not in str(e.value)
  return str(e.value)


def test_bad_templates_are_one_clear_error(tmp_path):
  tcfg = _files(tmp_path, step_later=REFERENCE_LATER.replace("{current_observation}", "{current_observaton}"))
  assert _error(tcfg).startswith(f"config.templates.step_later: {tcfg.step_later}: unknown placeholder "
                                 "{current_observaton}; a step_later template may use {task_description}, ")
  tcfg = _files(tmp_path, step_later=REFERENCE_LATER.replace("{action_history}", "the past"))
  assert _error(tcfg) == (f"config.templates.step_later: {tcfg.step_later}: the required placeholder "
                          "{action_history} is missing")
  tcfg = _files(tmp_path)
  tcfg.json_retry = str(tmp_path / "nowhere.txt")
  assert _error(tcfg).startswith(f"config.templates.json_retry: {tcfg.json_retry}: cannot read it (")
  tcfg = _files(tmp_path, json_retry="JSON only.")
  assert _error(tcfg) == ("config.templates.json_retry: 'episode_summary', a key the reply is parsed for, appears "
                          f"nowhere in {tcfg.json_retry}")
  tcfg = _files(tmp_path, skill_placement="placeholder", step_first="{skill}{current_observation}")
  assert _error(tcfg) == (f"config.templates.skill_placement='placeholder': {templates.PACKAGE_DIR}/alfworld/"
                          "step_later.txt has no {skill}")
  assert "which only config.templates.skill_placement='placeholder' fills" in _error(
      _files(tmp_path, step_first="{skill}{current_observation}"))
  assert "Single '}' encountered" in _error(_files(tmp_path, skill_block="{skill} }"))
  assert "unknown placeholder {objects}" in _error(_files(tmp_path, step_first="{current_observation} {objects}"))
  assert "Unknown format code" in _error(_files(tmp_path, step_first="{current_observation:d}"))
  assert "unknown placeholder {0}" in _error(_files(tmp_path, analysis_omitted="{0} steps"))


def test_replaced_templates_key_the_warm_start_cache_by_content(tmp_path):
  from seed_jax import warmstart
  cfg = alfworld_config.get_config()
  default = warmstart.cache_key(cfg)
  assert templates.fingerprint(cfg.templates) == {}  # the defaults leave the cache keys of earlier runs as they were
  cfg.templates = _files(tmp_path, analysis_step="{response}")
  replaced = warmstart.cache_key(cfg)
  cfg.templates = _files(tmp_path, analysis_step="{response}")  # the same text in another file
  assert warmstart.cache_key(cfg) == replaced != default
  cfg.templates = _files(tmp_path, analysis_step="Reply: {response}")
  assert warmstart.cache_key(cfg) not in (default, replaced)


def test_default_templates_are_package_data():
  tomllib = pytest.importorskip("tomllib")
  globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
  folder = pathlib.Path(templates.PACKAGE_DIR)
  shipped = {p for g in globs["seed_jax.templates"] for p in folder.glob(g)}
  assert shipped == {p for p in folder.rglob("*") if p.is_file() and p.suffix != ".py" and "__pycache__" not in str(p)}
  assert {p.parent.name for p in folder.glob("*/step_first.txt")} == set(ENVS)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
  GOLDEN.parent.mkdir(parents=True, exist_ok=True)
  GOLDEN.write_text(json.dumps({k: f() for k, f in sorted(CASES.items())}, indent=1, ensure_ascii=False) + "\n",
                    encoding="utf-8")
  print(f"wrote {len(CASES)} prompts to {GOLDEN}")
