"""End to end on a real pinned library fetched from the package registry (slow)."""

from __future__ import annotations

import random
import time
import urllib.request

import pytest

from evotrainer.tasks.swe import agents, episode, records, repo, sources, splits, synth, tools

REGISTRY = "https://pypi.org/simple/xmltodict/"


def _fetch_or_skip(source, cache):
  try:
    return sources.fetch(source, cache)
  except sources.SourceError as e:
    try:
      urllib.request.urlopen(REGISTRY, timeout=15).close()
    except OSError as probe:
      pytest.skip(f"the package registry is unreachable ({REGISTRY}: {probe}); "
                  f"pip said: {str(e)[-300:]}")
    raise  # the registry answers, so the failure is ours


@pytest.mark.slow
def test_xmltodict_tasks_oracle_and_random(tmp_path_factory, suite):
  cache = tmp_path_factory.mktemp("swe-cache")
  source = sources.find_source("xmltodict")
  start = time.monotonic()
  tree = _fetch_or_skip(source, cache)
  assert sources.sha256_of(cache / "sdists" / source.sdist) == source.sha256
  tasks, stats = synth.synthesize(source, tree, suite,
                                  synth.SynthConfig(max_tasks=6, max_candidates=16))
  assert stats.stable_tests >= 100 and stats.base_suite_s < 10
  assert len(tasks) >= 4, stats
  work = tmp_path_factory.mktemp("episodes")
  tasks = [synth.with_base(t, tree, work / "base") for t in tasks]
  oracle_dirs, random_dirs = [], []
  rng = random.Random(1)
  for task in tasks:
    for kind, dirs in (("oracle", oracle_dirs), ("random", random_dirs)):
      dest = work / kind / task.instance_id
      assert repo.checkout(tree, task, dest) == task.base
      agents.oracle(task, dest) if kind == "oracle" else agents.random_agent(dest, rng)
      dirs.append(dest)
  n = len(tasks)
  oracle = repo.grade_many(tasks, [tree] * n, oracle_dirs, suite, [source.tests] * n)
  rand = repo.grade_many(tasks, [tree] * n, random_dirs, suite, [source.tests] * n)
  assert all(g.resolved for g in oracle), [(t.instance_id, g) for t, g in zip(tasks, oracle)
                                           if not g.resolved]
  assert sum(g.resolved for g in rand) <= 1
  # The tasks survive their JSONL, and splits keep functions apart.
  path = tmp_path_factory.mktemp("jsonl") / "xmltodict.jsonl"
  records.write_jsonl(splits.assign_splits(tasks), path)
  back = records.read_jsonl(path)
  assert [t.instance_id for t in back] == [t.instance_id for t in tasks]
  assert {t.split for t in back} <= set(splits.SPLITS)
  assert time.monotonic() - start < 120
  # The history leak on the real library: reading `git diff HEAD HEAD~1` resolves every
  # task where the checkout keeps its base, none where the history is cleared (default).
  config = tools.ToolConfig(git=True, max_output_chars=600)  # gin/swe_train.gin's cap
  for keep_history in (True, False):
    dirs = []
    for task in tasks:
      dest = work / f"history-{keep_history}" / task.instance_id
      repo.checkout(tree, task, dest, keep_history=keep_history)
      agents.history_agent(episode.SweEpisode(tools.Workspace(dest, suite, source.tests,
                                                              config)))
      dirs.append(dest)
    resolved = [g.resolved for g in repo.grade_many(tasks, [tree] * n, dirs, suite,
                                                   [source.tests] * n)]
    assert resolved == [keep_history] * n, (keep_history, resolved)
