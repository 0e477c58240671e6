"""SWE-bench JSONL, splits and pinned sources: no sandbox, no network."""

from __future__ import annotations

import json
import tarfile

import pytest

from evotrainer.tasks.swe import records, sources, splits
from evotrainer.tasks.swe.records import Mutation, SweTask


def _task(i: int, repo: str = "lib==1.0", function: str = "f") -> SweTask:
  return SweTask(f"lib-1.0-{i}", repo, "abc123", f"issue {i}", (f"t.py::test_{i}",),
                 ("t.py::test_ok",), "1.0", "hard", "",
                 Mutation("lib.py", function, "removed_statement", 3, "x = 1\n", ""))


def test_jsonl_round_trip_and_swe_bench_rows(tmp_path):
  path = tmp_path / "tasks.jsonl"
  tasks = [_task(0), _task(1, function="g")]
  records.write_jsonl(tasks, path)
  assert records.read_jsonl(path) == tasks
  # A SWE-bench row: base_commit, test lists as JSON strings, none of our fields.
  row = {"instance_id": "me__proj-1", "repo": "me/proj", "base_commit": "deadbeef",
         "problem_statement": "it breaks", "FAIL_TO_PASS": '["tests/t.py::test_a"]',
         "PASS_TO_PASS": "[]", "patch": "diff ..."}
  path.write_text(json.dumps(row) + "\n\n")
  (task,) = records.read_jsonl(path)
  assert task.base == "deadbeef" and task.FAIL_TO_PASS == ("tests/t.py::test_a",)
  assert task.PASS_TO_PASS == () and task.mutation is None


@pytest.mark.parametrize("change, message", [
    ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS: a task needs at least one test"),
    ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS: a string that is not a JSON list"),
    ({"PASS_TO_PASS": [1]}, "PASS_TO_PASS: expected a list of test ids"),
    ({"repo": ""}, "repo: expected a non-empty string"),
    ({"difficulty": "extreme"}, "difficulty: expected one of"),
    ({"mutation": {"file": "x.py"}}, "mutation: expected an object with"),
    ({"PASS_TO_PASS": ["t.py::test_0"]}, "in both FAIL_TO_PASS and PASS_TO_PASS"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, change, message):
  good = _task(0).to_row()
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(_task(1).to_row()) + "\n" + json.dumps({**good, **change}) + "\n")
  with pytest.raises(records.TaskFormatError) as err:
    records.read_jsonl(path)
  assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value)


def test_missing_fields_not_json_and_duplicates(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"instance_id": "a"}\n')
  with pytest.raises(records.TaskFormatError, match=r"bad.jsonl:1: missing field\(s\) repo"):
    records.read_jsonl(path)
  path.write_text(json.dumps(_task(0).to_row()) + "\n{oops\n")
  with pytest.raises(records.TaskFormatError, match=r"bad.jsonl:2: not JSON"):
    records.read_jsonl(path)
  path.write_text((json.dumps(_task(0).to_row()) + "\n") * 2)
  with pytest.raises(records.TaskFormatError, match=r"bad.jsonl:2: .* already on line 1"):
    records.read_jsonl(path)


def test_splits_are_disjoint_by_function_and_by_repo():
  tasks = [_task(i, repo=f"lib{i % 5}==1.0", function=f"f{i % 7}") for i in range(70)]
  by_function = splits.assign_splits(tasks, group_by="function")
  assert by_function == splits.assign_splits(tasks, group_by="function")  # deterministic
  owner = {}
  for t in by_function:
    key = (t.repo, t.mutation.file, t.mutation.function)
    assert owner.setdefault(key, t.split) == t.split
  counts = {s: sum(t.split == s for t in by_function) for s in splits.SPLITS}
  # 35 groups of 2: 80/10/10 of 70 lands within one group of the target.
  assert abs(counts["train"] - 56) <= 2 and abs(counts["test"] - 7) <= 2
  assert counts["validation"] > 0
  by_repo = splits.assign_splits(tasks, fractions=(0.6, 0.2, 0.2), group_by="repo")
  repo_owner = {}
  for t in by_repo:
    assert repo_owner.setdefault(t.repo, t.split) == t.split
  assert {t.split for t in by_repo} == set(splits.SPLITS)  # 5 repos: 3 / 1 / 1
  with pytest.raises(ValueError, match="group_by"):
    splits.assign_splits(tasks, group_by="file")


def test_manifest_pins_and_hash_mismatch_is_refused(tmp_path):
  manifest = sources.load_manifest()
  assert {s.name for s in manifest} >= {"xmltodict"}
  assert all(len(s.sha256) == 64 and s.sdist.startswith(s.name) for s in manifest)
  # A cached sdist whose bytes are not the pinned ones: refused before extraction.
  source = sources.find_source("xmltodict")
  fake = tmp_path / "sdists" / source.sdist
  fake.parent.mkdir()
  with tarfile.open(fake, "w:gz") as tar:
    tar.add(__file__, arcname="xmltodict-1.0.4/evil.py")
  with pytest.raises(sources.SourceError, match="is not the pinned"):
    sources.fetch(source, tmp_path)
  assert not (tmp_path / "src" / "xmltodict-1.0.4").exists()
  bad = tmp_path / "m.json"
  bad.write_text('{"sources": [{"name": "x", "version": "1"}]}')
  with pytest.raises(sources.SourceError, match=r"sources\[0\] lacks"):
    sources.load_manifest(bad)
