"""Skills: analysis prompt, JSON parsing, H(h, s), and the analyzer backends (a real HTTP server on loopback)."""
import http.server
import json
import math
import threading
import time

import pytest

from configs import base
from seed_jax import skills
from seed_jax.envs.base import Step, Task, Trajectory


def _traj(n_steps: int, ret: float, invalid_at: tuple[int, ...] = ()) -> Trajectory:
  steps = [Step(prompt_text="", prompt_tokens=[], response_text=f"<think>t{k}</think><action>act {k}</action>",
                response_tokens=[], logps=[], observation=f"obs {k}", action=f"act {k}",
                action_valid=k not in invalid_at) for k in range(1, n_steps + 1)]
  task = Task(task_id="t0", split="train", env="toy", spec={})
  return Trajectory(task=task, group_id=0, traj_id=0, steps=steps, episode_return=ret, success=ret >= 1,
                    task_description="boil water", termination="done" if ret else "max_steps")


# ---------------------------------------------------------------------------------------------------------
# parse_skill

OBJ = '{"episode_summary": "went to the kitchen", "episode_skill": "Open the fridge first."}'

PARSE_CASES = [
    ("plain", OBJ, "Open the fridge first.", "went to the kitchen"),
    ("fenced", "Sure.\n```json\n" + OBJ + "\n```\nDone.", "Open the fridge first.", "went to the kitchen"),
    ("fenced_no_lang", "```\n" + OBJ + "\n```", "Open the fridge first.", "went to the kitchen"),
    ("prose_around", "Here's my analysis: " + OBJ + " Hope it's useful!", "Open the fridge first.",
     "went to the kitchen"),
    ("second_has_skill", 'Draft: {"episode_summary": "x"} Final: {"episode_summary": "y", "episode_skill": "Do B."}',
     "Do B.", "y"),
    ("trailing_commas", '{"episode_summary": "s", "episode_skill": "Use [a, b],",}', "Use [a, b],", "s"),
    ("python_literal", "{'episode_summary': None, 'episode_skill': 'Check the stove.', 'confident': True}",
     "Check the stove.", None),
    ("braces_in_strings", '{"episode_summary": "saw {a} and \\"}\\"", "episode_skill": "If {x} appears, stop."}',
     "If {x} appears, stop.", 'saw {a} and "}"'),
    ("nested_object", 'text {"meta": {"k": 1}, "episode_summary": "s", "episode_skill": "Go north."} end',
     "Go north.", "s"),
    ("list_skill", '{"episode_summary": "s", "episode_skill": ["Go north.", "Take key."]}',
     "Go north.\nTake key.", "s"),
    ("whitespace_stripped", '{"episode_summary": " s ", "episode_skill": "  Go.\\n"}', "Go.", "s"),
]


@pytest.mark.parametrize("name,reply,skill,summary", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_ok(name, reply, skill, summary):
  p = skills.parse_skill(reply)
  assert (p.ok, p.skill, p.summary, p.error) == (True, skill, summary, "")


FAIL_CASES = [
    ("empty_reply", "", "empty reply"),
    ("blank_reply", "  \n ", "empty reply"),
    ("garbage", "I cannot do that {not json at all", "no JSON object found"),
    ("empty_skill", '{"episode_summary": "s", "episode_skill": ""}', "no object with a non-empty string"),
    ("no_skill_field", '{"episode_summary": "s"}', "no object with a non-empty string"),
    ("skill_not_string", '{"episode_summary": "s", "episode_skill": 3}', "no object with a non-empty string"),
    ("truncated", '{"episode_summary": "s", "episode_skill": "Go nor', "no JSON object found"),
    ("array_only", '["episode_skill", "x"]', "no JSON object found"),
]


@pytest.mark.parametrize("name,reply,error", FAIL_CASES, ids=[c[0] for c in FAIL_CASES])
def test_parse_fails_with_reason(name, reply, error):
  p = skills.parse_skill(reply)
  assert (p.ok, p.skill) == (False, None)
  assert p.error.startswith(error)


def test_parse_never_raises_on_odd_input():
  for reply in [None, "{" * 5000, "}" * 10 + "{" * 10, "{'a': [1, 2" * 200, "```", "```json\n{\n", "{'a': 1e999999}",
                '{"a":' * 5000 + "1" + "}" * 5000]:
    assert skills.parse_skill(reply).ok is False


def test_format_skill_json_round_trips():
  text = skills.format_skill_json("sum \"q\"", "rule {x}")
  p = skills.parse_skill(text)
  assert (p.ok, p.summary, p.skill) == (True, 'sum "q"', "rule {x}")


# ---------------------------------------------------------------------------------------------------------
# augment_prompt

def test_augment_after_task_line():
  prompt = "Intro.\nYour task: boil water\nHistory: none\nNow it is your turn to act."
  assert skills.augment_prompt(prompt, " Heat the pot first. ") == (
      "Intro.\nYour task: boil water\nSkill from experience: Heat the pot first.\nHistory: none\n"
      "Now it is your turn to act.")


def test_augment_task_line_last_without_newline():
  assert skills.augment_prompt("A\nYour task: x", "S.") == "A\nYour task: x\nSkill from experience: S.\n"


def test_augment_before_turn_line():
  prompt = "Observation: dark room\nNow it is your turn to act.\n"
  assert skills.augment_prompt(prompt, "Turn on the light.") == (
      "Observation: dark room\nSkill from experience: Turn on the light.\nNow it is your turn to act.\n")


def test_augment_appends():
  assert skills.augment_prompt("Observation: x", "S.") == "Observation: x\nSkill from experience: S."
  assert skills.augment_prompt("Observation: x\n", "S.") == "Observation: x\nSkill from experience: S."
  assert skills.augment_prompt("", "S.") == "Skill from experience: S."


def test_augment_empty_skill_is_identity():
  prompt = "Your task: x\nNow it is your turn"
  for skill in (None, "", "  \n"):
    assert skills.augment_prompt(prompt, skill) is prompt


# ---------------------------------------------------------------------------------------------------------
# analysis prompt

def test_analysis_prompt_success_and_failure():
  ok = skills.analysis_prompt(_traj(2, 10.0, invalid_at=(2,)))
  assert "SUCCEEDED" in ok and "workflow" in ok and "avoidance" not in ok
  assert "Task: boil water\nOutcome: success (return 10, 2 steps, ended by done)\n" in ok
  assert ("\nStep 1\nObservation:\nobs 1\nResponse:\n<think>t1</think><action>act 1</action>\n"
          "Action valid: true\n") in ok
  assert ("\nStep 2\nObservation:\nobs 2\nResponse:\n<think>t2</think><action>act 2</action>\n"
          "Action valid: false\n") in ok
  assert '{"episode_summary": "<what happened>", "episode_skill": "<the rule>"}' in ok
  assert ok.index("Step 1") < ok.index("Step 2") < ok.index("# Answer")

  bad = skills.analysis_prompt(_traj(1, 0.0))
  assert "FAILED" in bad and "avoidance" in bad and "warning signs" in bad and "workflow" not in bad
  assert "Outcome: failure (return 0, 1 steps, ended by max_steps)" in bad
  # success means return >= threshold, independent of traj.success
  assert "Outcome: success" in skills.analysis_prompt(_traj(1, 0.5), success_threshold=0.5)


GOLDEN_FAILURE_PROMPT = """\
You are reviewing one episode of an agent acting in a text environment.
The agent FAILED. Distill avoidance rules: the core mistake that prevented success and the warning signs that \
show the mistake is happening, so it can be recognised and avoided next time.
Write `episode_skill` as a short rule addressed to the agent (imperative, at most a few sentences) that it can \
apply in a new attempt, not as a story of what happened. Write `episode_summary` as one or two sentences on what \
happened.
Answer with JSON only, exactly this object and nothing else:
{"episode_summary": "<what happened>", "episode_skill": "<the rule>"}

# Episode
Task: boil water
Outcome: failure (return 0, 1 steps, ended by max_steps)

Step 1
Observation:
obs 1
Response:
<think>t1</think><action>act 1</action>
Action valid: true

# Answer
Reply with the JSON object with `episode_summary` and `episode_skill` only."""


def test_analysis_prompt_golden():
  """The prompt is a contract with SFT data and checkpoints: any change to it must be deliberate."""
  assert skills.analysis_prompt(_traj(1, 0.0)) == GOLDEN_FAILURE_PROMPT


def test_fitted_drops_oldest_steps_and_keeps_schema():
  traj = _traj(10, 0.0)
  header, blocks, footer = skills.analysis_parts(traj)
  calls = []
  count = lambda s: calls.append(1) or len(s)  # one token per character

  assert skills.analysis_prompt_fitted(traj, count, 10**6) == skills.analysis_prompt(traj)

  keep3 = header + "\n[7 earlier steps omitted]\n" + "".join(blocks[7:]) + footer
  calls.clear()
  assert skills.analysis_prompt_fitted(traj, count, len(keep3)) == keep3
  assert len(calls) <= 1 + math.ceil(math.log2(10))
  keep2 = header + "\n[8 earlier steps omitted]\n" + "".join(blocks[8:]) + footer
  assert skills.analysis_prompt_fitted(traj, count, len(keep3) - 1) == keep2

  tiny = skills.analysis_prompt_fitted(traj, count, 5)
  assert tiny == header + "\n[10 earlier steps omitted]\n" + footer
  assert "Step" not in tiny.split("# Episode")[1].split("# Answer")[0].replace("steps", "")
  assert '"episode_skill": "<the rule>"' in tiny and "Reply with the JSON object" in tiny


# ---------------------------------------------------------------------------------------------------------
# Policy backend and analyze_trajectories

def test_analyze_trajectories_with_policy_backend():
  def generate(prompts):  # a deterministic "model": answers well only for successful episodes
    return [skills.format_skill_json("ok", "Keep doing X.") if "SUCCEEDED" in p else "no idea" for p in prompts]

  cfg = base.get_base().analyzer
  analyzer = skills.make_analyzer(cfg, generate)
  trajs = [_traj(2, 10.0), _traj(3, 0.0), _traj(1, 10.0), _traj(4, 0.0)]
  res = skills.analyze_trajectories(analyzer, trajs, cfg, count_tokens=len)
  assert [p.ok for p in res.parses] == [True, False, True, False]
  assert res.skills == ["Keep doing X.", None, "Keep doing X.", None]
  assert res.parse_rate == 0.5
  assert analyzer.stats.requests == 4
  assert res.prompts[1] == skills.analysis_prompt(trajs[1])


def test_max_skill_chars_and_bad_backend():
  cfg = base.get_base().analyzer
  cfg.max_skill_chars = 5
  analyzer = skills.PolicyAnalyzer(lambda ps: [skills.format_skill_json("s", "abcdefgh")] * len(ps))
  assert skills.analyze_trajectories(analyzer, [_traj(1, 0.0)], cfg).skills == ["abcde"]
  cfg.backend = "oracle"
  with pytest.raises(ValueError, match="analyzer.backend"):
    skills.make_analyzer(cfg, lambda ps: ps)
  with pytest.raises(ValueError, match="2 replies for 1 prompts"):
    skills.PolicyAnalyzer(lambda ps: ["a", "b"]).analyze(["p"])


# ---------------------------------------------------------------------------------------------------------
# External backend against a real HTTP server on 127.0.0.1

GOOD = {"episode_summary": "s", "episode_skill": "Good skill."}


class _Server:
  """Chat-completions server whose behaviour is chosen by the prompt text (the first user message)."""

  def __init__(self):
    self.hits: dict[str, list[float]] = {}
    self.headers: list[str | None] = []
    self.bodies: list[dict] = []
    self.lock = threading.Lock()
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *a):
        pass

      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        case = body["messages"][0]["content"]
        with outer.lock:
          outer.hits.setdefault(case, []).append(time.monotonic())
          outer.headers.append(self.headers.get("Authorization"))
          outer.bodies.append(body)
          n = len(outer.hits[case])
        try:
          outer.respond(self, case, n, body)
        except (BrokenPipeError, ConnectionResetError):
          pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.httpd.daemon_threads = True
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

  @staticmethod
  def _send(h, code, payload, extra=None):
    data = json.dumps(payload).encode()
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for k, v in (extra or {}).items():
      h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)

  def _reply(self, h, content):
    self._send(h, 200, {"choices": [{"message": {"role": "assistant", "content": content}}]})

  def respond(self, h, case, n, body):
    if case == "valid":
      self._reply(h, json.dumps(GOOD))
    elif case == "fenced":
      self._reply(h, "Analysis:\n```json\n" + json.dumps(GOOD) + "\n```")
    elif case == "broken":  # fixed on the JSON-retry turn
      msgs = body["messages"]
      fixed = len(msgs) == 3 and msgs[1]["role"] == "assistant" and msgs[2]["content"] == skills.JSON_RETRY_MESSAGE
      self._reply(h, json.dumps(GOOD) if fixed else '{"episode_summary": "s", "episode_skill": "Good sk')
    elif case == "still_broken":
      self._reply(h, "no json here")
    elif case in ("429", "500"):
      if n == 1:
        self._send(h, int(case), {"error": "busy"}, {"Retry-After": "0.3"} if case == "429" else None)
      else:
        self._reply(h, json.dumps(GOOD))
    elif case == "timeout":
      time.sleep(1.0)
      self._reply(h, json.dumps(GOOD))
    elif case == "bad_request":
      self._send(h, 400, {"error": "bad"})
    else:  # an analysis prompt
      self._reply(h, skills.format_skill_json("s", "Repeat it." if "SUCCEEDED" in case else "Avoid it."))

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def server():
  s = _Server()
  yield s
  s.close()


def _external_cfg(url):
  cfg = base.get_base().analyzer
  cfg.backend = "external"
  e = cfg.external
  e.base_url, e.model, e.api_key_env = url, "judge-model", "SEED_TEST_ANALYZER_KEY"
  e.timeout_s, e.max_retries, e.backoff_base_s, e.backoff_jitter, e.concurrency = 0.3, 1, 0.01, 0.0, 4
  return cfg


def test_external_analyzer_end_to_end(server, monkeypatch):
  monkeypatch.setenv("SEED_TEST_ANALYZER_KEY", "sk-test-123")
  cfg = _external_cfg(server.url)
  analyzer = skills.make_analyzer(cfg)
  assert "sk-test-123" not in repr(analyzer)
  cases = ["valid", "fenced", "broken", "still_broken", "429", "500", "timeout", "bad_request"]
  t0 = time.monotonic()
  replies = analyzer.analyze(cases)
  parses = [skills.parse_skill(r) for r in replies]
  assert [p.ok for p in parses] == [True, True, True, False, True, True, False, False]
  assert [p.skill for p in parses if p.ok] == ["Good skill."] * 5
  assert replies[6] == "" and replies[7] == ""
  assert replies[3] == "no json here"
  # requests: 1 + 1 + 2 (json retry) + 2 (json retry) + 2 (429) + 2 (500) + 2 (timeout) + 1 (400, not retried)
  assert analyzer.stats.as_dict() == {"requests": 13, "retries": 3, "failures": 2, "json_retries": 2}
  assert {c: len(v) for c, v in server.hits.items()} == {
      "valid": 1, "fenced": 1, "broken": 2, "still_broken": 2, "429": 2, "500": 2, "timeout": 2, "bad_request": 1}
  # Retry-After: 0.3 was honoured although the exponential backoff would have waited 0.01 s
  assert server.hits["429"][1] - server.hits["429"][0] >= 0.29
  assert server.hits["500"][1] - server.hits["500"][0] < 0.25
  assert time.monotonic() - t0 < 5.0
  assert set(server.headers) == {"Bearer sk-test-123"}
  body = server.bodies[0]
  assert (body["model"], body["temperature"], body["max_tokens"]) == ("judge-model", 0.0, 4096)
  assert body["messages"][0]["role"] == "user"


def test_external_analyzer_through_analyze_trajectories(server, monkeypatch):
  monkeypatch.setenv("SEED_TEST_ANALYZER_KEY", "k")
  cfg = _external_cfg(server.url)
  cfg.external.json_retry = False
  trajs = [_traj(2, 10.0), _traj(1, 0.0)]
  res = skills.analyze_trajectories(skills.make_analyzer(cfg), trajs, cfg)
  assert res.skills == ["Repeat it.", "Avoid it."] and res.parse_rate == 1.0
  assert sorted(server.hits) == sorted(skills.analysis_prompt(t) for t in trajs)


def test_external_analyzer_connection_refused_and_missing_key(monkeypatch):
  monkeypatch.delenv("SEED_TEST_ANALYZER_KEY", raising=False)
  cfg = _external_cfg("http://127.0.0.1:9/v1")
  with pytest.raises(ValueError, match="SEED_TEST_ANALYZER_KEY"):
    skills.ExternalAnalyzer(cfg.external)
  cfg.external.api_key_env = ""
  analyzer = skills.ExternalAnalyzer(cfg.external)
  assert analyzer.analyze(["valid", "valid"]) == ["", ""]
  assert analyzer.stats.as_dict() == {"requests": 4, "retries": 2, "failures": 2, "json_retries": 0}
