"""Search-QA questions in Search-R1's fields (question, golden_answers, data_source), read from local
JSONL/parquet files (Search-R1's parquet layout with reward_model.ground_truth.target is accepted too) or from
prepared TFDS datasets named `tfds:NAME[/CONFIG]:SPLIT`."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterator


@dataclasses.dataclass(frozen=True)
class Question:
  qid: str
  question: str
  golden_answers: tuple[str, ...]
  data_source: str


def _as_str_list(x: Any) -> list[str]:
  if x is None:
    return []
  if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
    x = [x]
  return [v.decode() if isinstance(v, bytes) else str(v) for v in x]


def _question_from_row(row: dict[str, Any], where: str, default_source: str) -> Question:
  q = row.get("question")
  answers = row.get("golden_answers")
  if answers is None:  # Search-R1's processed parquet keeps the answers under reward_model
    answers = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
  answers = [a for a in _as_str_list(answers) if a.strip()]
  if not isinstance(q, str) or not q.strip() or not answers:
    raise ValueError(f"{where}: a question row needs a non-empty 'question' and 'golden_answers', "
                     f"got keys {sorted(row)}")
  q = q.strip()
  if not q.endswith("?"):  # as Search-R1's make_prefix does
    q += "?"
  source = str(row.get("data_source") or default_source)
  return Question(str(row.get("id", "")), q, tuple(answers), source)


def _read_rows(path: str) -> Iterator[dict[str, Any]]:
  if path.endswith(".jsonl"):
    with open(path, encoding="utf-8") as f:
      for line in f:
        if line.strip():
          yield json.loads(line)
  elif path.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq  # only this code path needs pyarrow
    except ImportError as e:
      raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow)") from e
    yield from pq.read_table(path).to_pylist()
  else:
    raise ValueError(f"question file {path!r}: expected a .jsonl or .parquet file or tfds:NAME:SPLIT")


def _tfds_rows(name: str, split: str, data_dir: str) -> Iterator[dict[str, Any]]:
  """Rows of a prepared TFDS dataset, in Search-R1 field names. Reads array_record datasets without
  tensorflow (tfds.data_source); tfrecord ones need tensorflow installed."""
  try:
    import tensorflow_datasets as tfds  # a user-side dataset path: imported only here
  except ImportError as e:
    raise ImportError(f"loading tfds:{name}:{split} needs tensorflow-datasets (pip install tensorflow-datasets) "
                      f"and the dataset prepared under its data_dir") from e
  builder = tfds.builder(name, data_dir=data_dir or None)
  if builder.info.file_format.value == "array_record":
    examples: Any = builder.as_data_source(split=split)
  else:
    try:
      examples = tfds.as_numpy(builder.as_dataset(split=split))
    except ImportError as e:
      raise ImportError(f"tfds:{name} is stored as {builder.info.file_format.value}, which needs tensorflow; "
                        f"install it or prepare the dataset with file_format='array_record'") from e
  base_name = name.split("/")[0]
  for i, ex in enumerate(examples):
    ans = ex["answer"]
    if isinstance(ans, dict):  # trivia_qa: the canonical value, then its aliases
      answers = list(dict.fromkeys(_as_str_list(ans["value"]) + _as_str_list(ans["aliases"])))
    else:  # natural_questions_open and other flat answer lists
      answers = _as_str_list(ans)
    qid = ex.get("question_id", i)
    yield {"id": _as_str_list(qid)[0], "question": _as_str_list(ex["question"])[0], "golden_answers": answers,
           "data_source": base_name}


def load_questions(source: str, tfds_data_dir: str = "") -> list[Question]:
  """All questions of one source: a .jsonl/.parquet path or tfds:NAME[/CONFIG]:SPLIT."""
  if source.startswith("tfds:"):
    parts = source.split(":")
    if len(parts) != 3 or not parts[1] or not parts[2]:
      raise ValueError(f"question source {source!r}: expected tfds:NAME[/CONFIG]:SPLIT")
    rows: Iterator[dict[str, Any]] = _tfds_rows(parts[1], parts[2], tfds_data_dir)
    default_source = parts[1].split("/")[0]
  else:
    if not os.path.exists(source):
      raise ValueError(f"question file {source!r} does not exist")
    rows, default_source = _read_rows(source), os.path.splitext(os.path.basename(source))[0]
  return [_question_from_row(r, f"{source} row {i}", default_source) for i, r in enumerate(rows)]
