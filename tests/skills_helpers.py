"""Shared by the skill and analyzer tests: a toy trajectory with numbered steps."""
from __future__ import annotations

from seed_jax.envs.base import Step, Task, Trajectory


def toy_trajectory(n_steps: int, ret: float, invalid_at: tuple[int, ...] = ()) -> Trajectory:
  steps = [Step(prompt_text="", prompt_tokens=[], response_text=f"<think>t{k}</think><action>act {k}</action>",
                response_tokens=[], logps=[], observation=f"obs {k}", action=f"act {k}",
                action_valid=k not in invalid_at) for k in range(1, n_steps + 1)]
  task = Task(task_id="t0", split="train", env="toy", spec={})
  return Trajectory(task=task, group_id=0, traj_id=0, steps=steps, episode_return=ret, success=ret >= 1,
                    task_description="boil water", termination="done" if ret else "max_steps")
