"""Host-side types shared by every environment, the rollout loop, the analyzer and the pipeline.

An environment file owns: its simulator adapter (an `Env`), its task panels (`task_panel`), how an observation
is rendered into a single-turn prompt (`render_prompt`), how a model response becomes an action
(`parse_action`) and its success rule, gathered in one `EnvFamily`. The rest of seed_jax only sees the types
below.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

# Why an episode ended. Only "done" and "max_steps" episodes enter the advantages; "env_error" episodes are
# excluded (and counted), "context_overflow" ends an episode whose prompt cannot fit even after truncation.
TERMINATIONS = ("done", "max_steps", "env_error", "context_overflow")

# The default step templates state the task on one line starting with TASK_LINE_PREFIX and ask for the answer
# on a line starting with TURN_LINE_PREFIX (prompting.turn_line): skills.augment_prompt inserts the skill block
# after the former (else before the latter, else at the end), so H(h, s) works the same for every environment.
TASK_LINE_PREFIX = "Your task:"
TURN_LINE_PREFIX = "Now it is your turn"


@dataclasses.dataclass(frozen=True)
class Task:
  """One reproducible task instance: `env` resets to exactly this state from `spec`.

  `spec` holds what the simulator needs (task name, variation, seed, game file, ...), as plain JSON values.
  `family` is the reporting bucket in evaluation (e.g. ScienceWorld task type, ALFWorld task family).
  """
  task_id: str
  split: str
  env: str
  spec: dict[str, Any]
  family: str = ""

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "Task":
    return cls(**d)


@dataclasses.dataclass
class Observation:
  """What the agent sees after reset/step: raw env text (the GiGPO anchor), the task description,
  and the admissible actions rendered for the prompt (None when the env has no such list)."""
  text: str
  task_description: str
  admissible: Sequence[str] | None = None
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepResult:
  observation: Observation
  reward: float
  done: bool
  # `success` (bool) and `score` (env-native progress, e.g. ScienceWorld 0..100) at least.
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ParsedAction:
  """`action` is what is sent to the environment (also for invalid outputs); `valid` feeds the penalty."""
  action: str
  valid: bool
  # why invalid: "no_action_tags", "nested_tags", "empty", "no_think_tags", "cjk" (prompting.parse_action),
  # "not_admissible" (outside a fixed vocabulary), "multiple_actions" (Search: more than one tag opened)
  reason: str = ""


@dataclasses.dataclass
class Step:
  """One step-sample: a single-turn prompt and the model's whole response."""
  prompt_text: str
  prompt_tokens: list[int]
  response_text: str
  response_tokens: list[int]
  logps: list[float]  # sampled-token log-probs under pi_old at the rollout temperature, one per response token
  observation: str  # raw observation the prompt was built from (GiGPO anchor state)
  action: str
  action_valid: bool
  reward: float = 0.0
  done: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  # The uint8 [H, W, 3] frame of the prompt's <image> (env.observation "image"), else None. Kept as rendered:
  # the skill-augmented context reattaches this same array, and preprocessing happens per batch.
  image: Any = None


@dataclasses.dataclass
class Trajectory:
  task: Task
  group_id: int
  traj_id: int
  steps: list[Step]
  episode_return: float = 0.0
  success: bool = False
  score: float = 0.0
  termination: str = "done"
  truncated_prompts: int = 0  # prompts whose history was left-truncated to fit the context
  task_description: str = ""
  info: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {"env_error": "..."}

  @property
  def length(self) -> int:
    return len(self.steps)

  @property
  def invalid_actions(self) -> int:
    return sum(not s.action_valid for s in self.steps)


# Why an env call failed: the worker hung past its timeout, died, raised, or was asked to step before a reset.
ENV_ERROR_KINDS = ("timeout", "crashed", "exception", "not_reset")


@dataclasses.dataclass
class EnvError:
  """Returned by the pool in place of a result when an env call failed; the rollout records the episode as
  termination "env_error". After "timeout" and "crashed" the worker was restarted: reset before stepping."""
  kind: str
  message: str = ""


class Env(Protocol):
  """One simulator instance. Implementations may be slow (JVM); the pool runs them in worker processes."""

  def reset(self, task: Task) -> Observation: ...

  def step(self, action: str) -> StepResult: ...

  def gold_actions(self) -> list[str] | None:
    """The gold action sequence from the current reset state, where the simulator exposes one."""
    ...

  def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class EnvFamily:
  """Everything specific to one environment: the `FAMILY` object at the end of its envs/<name>.py file.

  The fields are that file's module-level functions make_env, task_panel, render_prompt and parse_action, so
  the object pickles by reference into the pool's worker processes. `cfg` is always the env config
  (cfg.env of a run).
  """
  name: str
  # Builds a fresh simulator; called inside a worker process.
  make_env: Callable[[Any], Env]
  # (cfg, split) -> a fixed, ordered task panel: identical on every run, host and process count.
  tasks: Callable[[Any, str], list[Task]]
  # (task_description, history, obs, cfg) -> the user message for one step: task line, the last
  # `history_length` (observation, action) pairs, the current observation, admissible actions and the
  # answer-format instruction.
  render_prompt: Callable[[str, Sequence[tuple[str, str]], Observation, Any], str]
  # (response, cfg) -> the action sent to the env, and whether it counts as valid.
  parse_action: Callable[[str, Any], ParsedAction]
  # Whether its envs' gold_actions() give a gold path (demonstrations, the oracle analyzer need one).
  has_gold_paths: bool = True
