"""Search-QA env, the built-in BM25 retriever over loopback HTTP, and the question loaders."""
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import helpers
from configs import search as search_config
from seed_jax.envs import base, retriever, search, search_data

FIXTURES = os.path.join(helpers.FIXTURES, "search")
CORPUS = os.path.join(FIXTURES, "corpus.jsonl")
QUESTIONS = os.path.join(FIXTURES, "questions.jsonl")


@pytest.fixture(scope="module")
def server():
  with retriever.start_server(retriever.BM25Index.from_jsonl(CORPUS)) as s:
    yield s


@pytest.fixture()
def cfg(server):
  c = search_config.env_config()
  c.retriever_url = server.url
  c.test_files = QUESTIONS
  return c


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------- scoring


def test_normalize_and_exact_match():
  assert search.normalize_answer("  The Eiffel-Tower!! ") == "eiffeltower"
  assert search.normalize_answer("An apple, a day") == "apple day"
  assert search.exact_match("the Louvre.", ["Louvre Museum", "Louvre"]) == 1.0
  assert search.exact_match("Louvres", ["Louvre"]) == 0.0
  assert search.exact_match("Van  Rossum", ["Guido van Rossum", "van rossum"]) == 1.0


def test_bm25_scores_match_hand_computation():
  # N=3, avgdl=2. "cat": df=2, idf=ln(1+1.5/2.5)=0.4700036; d0 tf=1 dl=2 -> 1*1.9/(1+0.9)=1.0;
  # d1 tf=2 dl=3 -> 2*1.9/(2+0.9*(0.6+0.4*1.5))=1.2337662. "the" is a stop word and is ignored.
  idx = retriever.BM25Index([{"contents": "cat dog"}, {"contents": "cat cat bird"}, {"contents": "fish"}])
  hits = idx.search("the cat", 5)
  assert [i for i, _ in hits] == [1, 0]
  assert hits[0][1] == pytest.approx(0.4700036 * 1.2337662, rel=1e-5)
  assert hits[1][1] == pytest.approx(0.4700036, rel=1e-5)
  assert idx.search("zebra", 3) == []


# ---------------------------------------------------------------------------------------------- server


def _post(url: str, payload) -> tuple[int, dict]:
  host, port = url.split("//")[1].split("/")[0].split(":")
  conn = http.client.HTTPConnection(host, int(port), timeout=5)
  conn.request("POST", "/retrieve", body=json.dumps(payload) if not isinstance(payload, bytes) else payload)
  resp = conn.getresponse()
  out = resp.status, json.loads(resp.read())
  conn.close()
  return out


def test_server_speaks_search_r1_protocol(server):
  status, reply = _post(server.url, {"queries": ["capital of Australia", "Mona Lisa painter"], "topk": 2,
                                     "return_scores": True})
  assert status == 200 and len(reply["result"]) == 2
  first = reply["result"][0][0]
  assert set(first) == {"document", "score"} and first["document"]["contents"].startswith('"Canberra"\n')
  assert reply["result"][0][0]["score"] >= reply["result"][0][1]["score"]
  # Without return_scores the items are the bare documents.
  status, reply = _post(server.url, {"queries": ["highest mountain above sea level"], "topk": 1})
  assert status == 200 and reply["result"][0][0]["id"] == "3"
  assert _post(server.url, {"queries": "not a list"})[0] == 400
  assert _post(server.url, b"{broken")[0] == 400
  assert _post(server.url, [1, 2])[0] == 400


def test_client_formats_passages(server):
  client = retriever.RetrieverClient(server.url)
  [passages] = client.retrieve(["Who designed the Eiffel Tower?"], topk=3)
  assert len(passages) == 3 and passages[0].title == '"Eiffel Tower"'
  text = search.format_passages(passages[:1])
  assert text.startswith('Doc 1(Title: "Eiffel Tower") The Eiffel Tower is a wrought-iron') and text.endswith("\n")
  client.close()


@pytest.mark.slow
def test_cli_starts_server_with_one_command():
  proc = subprocess.Popen([sys.executable, "-m", "seed_jax.envs.retriever", "--corpus", CORPUS, "--port", "0"],
                          stdout=subprocess.PIPE, text=True)
  try:
    line = proc.stdout.readline()
    assert line.startswith("retriever ready: 20 passages"), line
    url = line.split("serving ")[1].strip()
    [[p]] = retriever.RetrieverClient(url).retrieve(["Guido van Rossum"], topk=1)
    assert p.title == '"Guido van Rossum"'
  finally:
    proc.terminate()
    proc.wait(timeout=10)


def test_client_retries_a_flaky_server_then_gives_up():
  calls = []

  class Flaky(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
      self.rfile.read(int(self.headers["Content-Length"]))
      calls.append(1)
      ok = len(calls) == 2  # the first request fails with 503, the second succeeds, later ones fail
      body = json.dumps({"result": [[{"contents": "T\nx"}]]} if ok else {"error": "busy"}).encode()
      self.send_response(200 if ok else 503)
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *a):
      pass

  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
  threading.Thread(target=httpd.serve_forever, daemon=True).start()
  try:
    client = retriever.RetrieverClient(f"http://127.0.0.1:{httpd.server_address[1]}/retrieve", retries=1,
                                       backoff_s=0.01)
    assert client.retrieve(["q"])[0][0].text == "x"
    assert len(calls) == 2
    with pytest.raises(retriever.RetrieverError, match="failed after 2 attempt"):
      client.retrieve(["q"])
    assert len(calls) == 4
  finally:
    httpd.shutdown()
    httpd.server_close()


def test_unreachable_retriever_fails_at_construction():
  c = search_config.env_config()
  c.retriever_url = f"http://127.0.0.1:{_free_port()}/retrieve"
  c.backoff_s = 0.01
  t0 = time.time()
  with pytest.raises(retriever.RetrieverUnavailableError, match=c.retriever_url):
    search.FAMILY.make_env(c)
  assert time.time() - t0 < 5
  c.retriever_url = "localhost:8000"
  with pytest.raises(ValueError, match="retriever_url"):
    search.FAMILY.make_env(c)


# ---------------------------------------------------------------------------------------------- episodes


def test_search_then_answer_earns_reward_10(cfg):
  tasks = search.FAMILY.tasks(cfg, "test")
  task = next(t for t in tasks if t.spec["question"] == "What is the capital of Australia?")
  env = search.FAMILY.make_env(cfg)
  obs = env.reset(task)
  assert obs.text == obs.task_description == "What is the capital of Australia?"
  history = []
  prompt = search.FAMILY.render_prompt(obs.task_description, history, obs, cfg)
  assert "Your task: answer the question: What is the capital of Australia?" in prompt.splitlines()
  assert prompt.splitlines()[-1].startswith(base.TURN_LINE_PREFIX)

  act = search.FAMILY.parse_action("<think>look it up</think><search> capital city of Australia </search>", cfg)
  assert act == base.ParsedAction("<search>capital city of australia</search>", True)
  r = env.step(act.action)
  assert (r.reward, r.done, r.info["success"]) == (0.0, False, False)
  assert r.observation.text.startswith('<information>Doc 1(Title: "Canberra") Canberra is the capital city')
  history.append((obs.text, act.action))
  prompt = search.FAMILY.render_prompt(obs.task_description, history, r.observation, cfg)
  assert "Step 1 action: <search>capital city of australia</search>\nStep 2 observation (now):\n<information>Doc 1" in prompt

  act = search.FAMILY.parse_action("<think>Doc 1 says so</think><answer>canberra.</answer>", cfg)
  r = env.step(act.action)
  assert (r.reward, r.done, r.info["success"], r.info["score"]) == (10.0, True, True, 1.0)
  assert r.info["data_source"] == "nq" and not r.info["truncated"]
  with pytest.raises(ValueError, match="after the episode ended"):
    env.step("<answer>x</answer>")
  env.close()


def test_wrong_answer_and_turn_limit(cfg):
  env = search.FAMILY.make_env(cfg)
  task = search.FAMILY.tasks(cfg, "test")[2]  # Jupiter
  env.reset(task)
  r = env.step("<answer>Saturn</answer>")
  assert (r.reward, r.done, r.info["score"], r.info["success"]) == (0.0, True, 0.0, False)
  env.reset(task)
  for turn in range(1, 5):
    r = env.step("<search>largest planet</search>" if turn % 2 else "no tags at all")
    assert r.done == (turn == 4) and r.reward == 0.0
  assert r.info["truncated"] and r.observation.text == search.INVALID_TEXT
  assert env.gold_actions() == ["<answer>Jupiter</answer>"]
  env.reset(task)
  assert env.step(env.gold_actions()[0]).reward == 10.0


def _parse(response: str, think: bool = False) -> base.ParsedAction:
  c = search_config.env_config()
  c.require_think = think
  return search.parse_action(response, c)


def test_malformed_outputs_are_invalid(cfg):
  parse = _parse
  assert parse("I think it is Paris") == base.ParsedAction("i think it is paris", False, "no_action_tags")
  assert parse("<answer>Paris") .reason == "no_action_tags"
  both = parse("<search>eiffel</search> <answer>Paris</answer>")
  assert both == base.ParsedAction("<search>eiffel</search>", False, "multiple_actions")
  assert parse("<answer>A</answer><answer>B</answer>") == base.ParsedAction("<answer>a</answer>", False,
                                                                             "multiple_actions")
  assert parse("<search>  </search>").reason == "empty"
  assert parse("<answer>Paris</answer>", think=True).reason == "no_think_tags"
  assert parse("<think>t</think><ANSWER> Paris </ANSWER>", think=True) == base.ParsedAction("<answer>paris</answer>",
                                                                                         True)
  env = search.FAMILY.make_env(cfg)
  env.reset(search.FAMILY.tasks(cfg, "test")[0])
  r = env.step(parse("I think it is Paris").action)  # an invalid action is a no-op turn
  assert (r.reward, r.done, r.info["invalid_action"]) == (0.0, False, True)


# ---------------------------------------------------------------------------------------------- datasets


def test_task_panel_from_jsonl(cfg):
  tasks = search.FAMILY.tasks(cfg, "test")
  assert [t.task_id for t in tasks] == ["nq:1", "nq:2", "triviaqa:3", "triviaqa:4", "hotpotqa:5", "bamboogle:6"]
  assert [t.family for t in tasks] == ["NQ", "NQ", "TriviaQA", "TriviaQA", "HotpotQA", "Bamboogle"]
  assert tasks[0].spec == {"question": "Who designed the Eiffel Tower?", "golden_answers": ["Gustave Eiffel"],
                           "data_source": "nq"}
  cfg.max_tasks_per_source = 1
  sub = search.FAMILY.tasks(cfg, "test")
  assert [t.family for t in sub] == ["NQ", "TriviaQA", "HotpotQA", "Bamboogle"]
  assert [t.task_id for t in sub] == [t.task_id for t in search.FAMILY.tasks(cfg, "test")]  # fixed panel
  with pytest.raises(ValueError, match="train_files"):
    search.FAMILY.tasks(cfg, "train")
  with pytest.raises(ValueError, match="split"):
    search.FAMILY.tasks(cfg, "dev")


def test_parquet_and_bad_rows(cfg, tmp_path):
  pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
  rows = [{"id": "7", "question": "Who painted the Mona Lisa?", "data_source": "popqa",
           "reward_model": {"ground_truth": {"target": ["Leonardo da Vinci"]}}}]
  pq.write_table(pa.Table.from_pylist(rows), tmp_path / "q.parquet")
  cfg.train_files = f"{tmp_path / 'q.parquet'}, {QUESTIONS}"
  tasks = search.FAMILY.tasks(cfg, "train")
  assert tasks[0].task_id == "popqa:7" and tasks[0].family == "PopQA"
  assert tasks[0].spec["golden_answers"] == ["Leonardo da Vinci"] and len(tasks) == 7
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"question": "Q?", "answers": ["x"]}) + "\n")
  with pytest.raises(ValueError, match="golden_answers"):
    search_data.load_questions(str(bad))
  with pytest.raises(ValueError, match="does not exist"):
    search_data.load_questions(str(tmp_path / "missing.jsonl"))
  with pytest.raises(ValueError, match="tfds:NAME"):
    search_data.load_questions("tfds:natural_questions_open")


def test_tfds_source_reads_prepared_dataset(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  import numpy as np
  from tensorflow_datasets.datasets.natural_questions_open import natural_questions_open_dataset_builder as nq

  with tfds.core.registered.skip_registration():
    class TinyNQ(nq.Builder):  # the real dataset's name, version and features; three rows of local data
      name = "natural_questions_open"

      def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"question": np.str_, "answer": tfds.features.Sequence(np.str_)}))

      def _split_generators(self, dl_manager):
        return {"validation": self._generate_examples(None)}

      def _generate_examples(self, file_path):
        yield 0, {"question": "who designed the eiffel tower", "answer": ["Gustave Eiffel", "Eiffel"]}
        yield 1, {"question": "capital of australia", "answer": ["Canberra"]}

  TinyNQ(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  cfg = search_config.env_config()
  cfg.test_files = "tfds:natural_questions_open:validation"
  cfg.tfds_data_dir = str(tmp_path)
  tasks = search.FAMILY.tasks(cfg, "test")
  assert [(t.task_id, t.family) for t in tasks] == [("natural_questions_open:0", "NQ"),
                                                     ("natural_questions_open:1", "NQ")]
  by_q = {t.spec["question"]: t.spec["golden_answers"] for t in tasks}  # TFDS stores rows in hashed-key order
  assert by_q == {"who designed the eiffel tower?": ["Gustave Eiffel", "Eiffel"], "capital of australia?": ["Canberra"]}


def test_tfds_missing_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # as if the package were not installed
  with pytest.raises(ImportError, match="needs tensorflow-datasets"):
    search_data.load_questions("tfds:trivia_qa/rc.nocontext:validation")
