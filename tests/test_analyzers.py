"""Analyzer backends: the policy (a stub decoder) and the external client against a real HTTP server on
loopback (retries, Retry-After, JSON retry turn, timeouts, keys)."""
import http.server
import json
import threading
import time

import pytest
from skills_helpers import toy_trajectory

from configs import base
from seed_jax import analyzers, skills, templates


# ---------------------------------------------------------------------------------------------------------
# Policy backend and analyze_trajectories

def test_analyze_trajectories_with_policy_backend():
  def generate(prompts):  # a deterministic "model": answers well only for successful episodes
    return [skills.format_skill_json("ok", "Keep doing X.") if "SUCCEEDED" in p else "no idea" for p in prompts]

  cfg = base.get_base().analyzer
  analyzer = analyzers.make_analyzer(cfg, generate)
  trajs = [toy_trajectory(2, 10.0), toy_trajectory(3, 0.0), toy_trajectory(1, 10.0), toy_trajectory(4, 0.0)]
  res = skills.analyze_trajectories(analyzer, trajs, cfg, count_tokens=len)
  assert [p.ok for p in res.parses] == [True, False, True, False]
  assert res.skills == ["Keep doing X.", None, "Keep doing X.", None]
  assert res.parse_rate == 0.5
  assert analyzer.stats.requests == 4
  assert res.prompts[1] == skills.analysis_prompt(trajs[1])


def test_bad_backend_and_reply_count():
  cfg = base.get_base().analyzer
  cfg.backend = "oracle"
  with pytest.raises(ValueError, match="analyzer.backend"):
    analyzers.make_analyzer(cfg, lambda ps: ps)
  with pytest.raises(ValueError, match="2 replies for 1 prompts"):
    analyzers.PolicyAnalyzer(lambda ps: ["a", "b"]).analyze(["p"])


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
      retry_turn = analyzers.json_retry_message()
      fixed = len(msgs) == 3 and msgs[1]["role"] == "assistant" and msgs[2]["content"] == retry_turn
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
  analyzer = analyzers.make_analyzer(cfg)
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
  trajs = [toy_trajectory(2, 10.0), toy_trajectory(1, 0.0)]
  res = skills.analyze_trajectories(analyzers.make_analyzer(cfg), trajs, cfg)
  assert res.skills == ["Repeat it.", "Avoid it."] and res.parse_rate == 1.0
  assert sorted(server.hits) == sorted(skills.analysis_prompt(t) for t in trajs)


def test_external_analyzer_connection_refused_and_missing_key(monkeypatch):
  monkeypatch.delenv("SEED_TEST_ANALYZER_KEY", raising=False)
  cfg = _external_cfg("http://127.0.0.1:9/v1")
  with pytest.raises(ValueError, match="SEED_TEST_ANALYZER_KEY"):
    analyzers.ExternalAnalyzer(cfg.external)
  cfg.external.api_key_env = ""
  analyzer = analyzers.ExternalAnalyzer(cfg.external)
  assert analyzer.analyze(["valid", "valid"]) == ["", ""]
  assert analyzer.stats.as_dict() == {"requests": 4, "retries": 2, "failures": 2, "json_retries": 0}


def test_the_json_retry_turn_can_carry_the_parse_error_and_the_reply_tail(server, monkeypatch, tmp_path):
  """A json_retry template naming {error} and {reply_tail} (the reference's retry turn carries both)."""
  monkeypatch.setenv("SEED_TEST_ANALYZER_KEY", "k")
  path = tmp_path / "retry.txt"
  path.write_text('Your reply did not parse ({error}); it ended: "{reply_tail}". Reply with only '
                  '{{"episode_summary": "...", "episode_skill": "..."}}.\n', encoding="utf-8")
  templates.use({"json_retry": str(path)})
  try:
    assert analyzers.make_analyzer(_external_cfg(server.url)).analyze(["still_broken"]) == ["no json here"]
  finally:
    templates.use(None)
  retry = [b["messages"] for b in server.bodies if len(b["messages"]) == 3]
  assert retry == [[{"role": "user", "content": "still_broken"}, {"role": "assistant", "content": "no json here"},
                    {"role": "user", "content": 'Your reply did not parse (no JSON object found); it ended: "no json '
                     'here". Reply with only {"episode_summary": "...", "episode_skill": "..."}.'}]]
