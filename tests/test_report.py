"""The end-of-run summary: the table's numbers from a run's metrics records, and curves.png."""
from __future__ import annotations

from seed_jax import records, report

# Two updates (the second without analysis) and evaluations at the start and after update 2, as metrics.jsonl
# holds them; a record redone after a resume appears twice and the later copy counts.
HISTORY = [
    {"step": 0, "eval/updates_done": 0, "eval/valid/success": 0.25, "eval/valid/success/all": 0.25},
    {"step": 0, "rollout/success": 0.9, "rollout/invalid_action_rate": 0.5, "advantages/abs_mean": 0.5,
     "analysis/parse_rate": 0.5, "update/opd_tokens": 10.0, "time/rollout_s": 1.0},
    {"step": 0, "rollout/success": 0.5, "rollout/invalid_action_rate": 0.25, "advantages/abs_mean": 0.75,
     "analysis/parse_rate": 0.75, "update/opd_tokens": 120.0, "time/rollout_s": 2.0, "time/analysis_s": 3.0,
     "time/rescore_s": 4.0, "time/update_s": 5.0},
    {"step": 1, "rollout/success": 0.625, "rollout/invalid_action_rate": 0.0, "advantages/abs_mean": 0.0,
     "update/opd_tokens": 0.0, "time/rollout_s": 1.5, "time/rescore_s": 2.5, "time/update_s": None},
    {"step": 2, "eval/updates_done": 2, "eval/valid/success": 0.5, "eval/valid/success/all": 0.5},
]


def test_summary_table_rows():
  updates, evals = report.split_records(HISTORY)
  lines = report.summary_table(updates, evals).splitlines()
  assert lines[0].split() == ["update", "success", "invalid", "|A|", "parse", "opd-tokens", "rollout", "s",
                              "analysis", "s", "rescore", "s", "update", "s", "eval", "valid"]
  assert set(lines[1]) <= {"-", " "}
  rows = [line.split() for line in lines[2:]]
  assert rows == [["0", "-", "-", "-", "-", "-", "-", "-", "-", "-", "0.250"],
                  ["1", "0.500", "0.25", "0.750", "0.75", "120", "2.0", "3.0", "4.0", "5.0", "-"],
                  ["2", "0.625", "0.00", "0.000", "-", "0", "1.5", "-", "2.5", "-", "0.500"]]


def test_run_summary_writes_a_png(tmp_path):
  path = tmp_path / "metrics.jsonl"
  records.write_records(str(path), HISTORY)
  table = report.run_summary(str(path), str(tmp_path))
  assert table.splitlines()[3].split()[:2] == ["1", "0.500"]
  png = (tmp_path / report.CURVES_FILE).read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
