"""`SweDomain` on the toy library: splits, prompt format, episodes graded for real
(oracle resolves, a wrong edit does not), checkouts removed, warm-start transcripts."""

from __future__ import annotations

import json
import shutil

import gin
import pytest

from evotrainer.tasks.base import MultiTurnTask
from evotrainer.tasks.swe import task as task_lib
from evotrainer.tasks.swe import tools

from tests.tasks.swe.conftest import write_toy_manifest


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
  """(manifest naming the toy library, cache folder)."""
  tmp = tmp_path_factory.mktemp("swe-domain")
  return write_toy_manifest(tmp / "manifest.json"), str(tmp / "cache")


@pytest.fixture(scope="module")
def domain(toy_tree, suite, paths):
  d = task_lib.SweDomain(sources=["toylib"], manifest=paths[0],
                         trees={"toylib": str(toy_tree)}, max_tasks=8, max_candidates=16,
                         kinds=["operator_swap", "constant_change"],
                         difficulties=["easy", "medium"], fractions=(0.5, 0.25, 0.25),
                         cache_dir=paths[1], suite=suite)
  yield d
  d.close()


def test_splits_are_disjoint_by_function_and_cover_every_task(domain):
  ids = {s: {p.id for p in ps} for s, ps in domain.splits.items()}
  assert all(ids.values())
  assert not (ids["train"] & ids["validation"] or ids["train"] & ids["test"] or
              ids["validation"] & ids["test"])
  assert set().union(*ids.values()) == set(domain.records)
  functions = {s: {domain.records[i].mutation.function for i in v} for s, v in ids.items()}
  assert not (functions["train"] & (functions["validation"] | functions["test"]))
  assert {p.id for p in domain.train_problems(50, 3)} <= ids["train"]
  assert domain.train_problems(5, 3) == domain.train_problems(5, 3)
  assert domain.heldout_problems(1, "test") == domain.splits["test"][:1]
  with pytest.raises(ValueError, match="'validation' or 'test'"):
    domain.heldout_problems(1, "train")


def test_the_domain_is_a_multi_turn_task(domain):
  assert isinstance(domain, MultiTurnTask) and domain.multi_turn is True


def test_prompt_and_observation_format(domain):
  p = domain.splits["train"][0]
  task = domain.records[p.id]
  assert domain.format_prompt(p) == (f"System: {task_lib.SYSTEM}\nUser: "
                                     f"{task.problem_statement}\nAssistant:")
  assert domain.format_observation("3 passed") == "\nTool: 3 passed\nAssistant:"
  assert task_lib.split_turns(" a" + domain.format_observation("x\ny") + " b") == [" a", " b"]
  assert task_lib.split_turns("one turn") == ["one turn"]


def test_a_hugging_face_tokenizer_renders_episodes_in_its_own_template(domain, tmp_path):
  from evotrainer.tokenizers import HFTokenizer
  from tests.test_tokenizers import save_hf
  save_hf(tmp_path, pad=True)
  tok = HFTokenizer.from_dir(str(tmp_path))
  plain_solution = domain.splits["validation"][0].solution
  domain.use_tokenizer(tok)
  try:
    p = domain.splits["validation"][0]
    assert domain.format_prompt(p) == tok.apply_chat_template(
        [{"role": "system", "content": task_lib.SYSTEM},
         {"role": "user", "content": domain.records[p.id].problem_statement}])
    assert domain.format_observation("ok") == "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"
    segments = domain.solution_segments(p)
    assert segments[0][1] is True and not segments[0][0].startswith(" ")
    assert "<|im_start|>tool" in p.solution and "\nTool: " not in p.solution
    # The oracle's episode in the template's layout still replays and resolves.
    assert domain.score_many([p], [p.solution])[0]["correct"] == 1.0
  finally:
    domain.use_tokenizer(None)
  assert domain.splits["validation"][0].solution == plain_solution
  assert domain.format_observation("ok") == "\nTool: ok\nAssistant:"


def test_oracle_episode_resolves_a_wrong_edit_does_not_and_checkouts_go(domain):
  p = domain.splits["validation"][0]
  m = domain.records[p.id].mutation
  envs = [domain.start_episode(p), domain.start_episode(p), domain.start_episode(p)]
  roots = [env.workspace.root for env in envs]
  assert all((r / ".git").is_dir() and (r / m.file).read_text().count(m.replace) >= 1
             for r in roots)
  for turn, _ in domain.task_set.transcripts[p.id]:
    envs[0].step(turn)
  # A wrong edit: the bug's line made different from both the base and the mutant.
  wrong = m.replace.replace("\n", " # wrong\n", 1) if "\n" in m.replace else m.replace + " "
  envs[1].step(tools.call_text("search_replace", path=m.file, search=m.replace,
                               replace=wrong))
  envs[1].step(tools.call_text("submit"))
  envs[2].step("I do nothing useful")  # no valid call at all
  assert [e.stop for e in envs] == ["submitted", "submitted", None]
  right, bad, idle = domain.finish_episodes([p, p, p], envs)
  assert right == {"correct": 1.0, "partial": 1.0, "tamper": 0.0, "tool_validity": 1.0,
                   "tested_before_submit": 1.0, "format": 1.0, "submitted": 1.0}
  assert bad["correct"] == 0.0 and bad["partial"] == 0.0 and bad["format"] == 1.0
  assert bad["tested_before_submit"] == 0.0
  assert idle == {"correct": 0.0, "partial": 0.0, "tamper": 0.0, "tool_validity": 0.0,
                  "tested_before_submit": 0.0, "format": 0.0, "submitted": 0.0}
  assert not any(r.exists() or r.parent.exists() for r in roots)


def test_warm_start_transcript_replays_to_resolved_and_probes_separate(domain):
  p = domain.splits["test"][0]
  turns = domain.task_set.transcripts[p.id]
  names = [tools.parse_call(t).name for t, _ in turns]
  assert names == ["read_file", "search_replace", "run_tests", "submit"]
  assert turns[2][1] == f"{len(domain.records[p.id].FAIL_TO_PASS)} passed"
  # The solution text: turns and formatted observations; the segments: the same text,
  # model turns trained, observations masked.
  segments = domain.solution_segments(p)
  assert "".join(text for text, _ in segments) == p.solution
  assert [trained for _, trained in segments] == [True, False] * 3 + [True]
  assert [text for text, trained in segments if trained] == [t for t, _ in turns]
  assert task_lib.split_turns(p.solution) == [t for t, _ in turns]
  probes = domain.exploit_completions(p)
  right, wrong, exploit = domain.score_many([p] * 3, [probes["right"], probes["wrong"],
                                                      probes["exploit"]])
  assert right["correct"] == 1.0 and wrong["correct"] == 0.0 and exploit["correct"] == 0.0
  assert exploit["format"] == 1.0  # the test edit ran; grading ignores test files


def test_task_set_is_cached(domain, toy_tree, paths):
  cache = domain.task_set
  again = task_lib.build_task_set(  # no suite: a cache hit runs nothing
      ["toylib"], task_lib.synth_lib.SynthConfig(
          max_tasks=8, max_candidates=16, kinds=("operator_swap", "constant_change")),
      None, cache_dir=paths[1], manifest=paths[0], trees={"toylib": str(toy_tree)},
      tool_config=domain.tool_config, fractions=(0.5, 0.25, 0.25))
  assert [t.instance_id for t in again.tasks] == [t.instance_id for t in cache.tasks]
  assert again.transcripts == cache.transcripts


def test_reworded_oracle_turns_replay_the_oracle(domain, toy_tree, suite, paths, monkeypatch):
  """The oracle cache is keyed by the oracle's turn texts: a reworded oracle is replayed
  (its new words reach the transcripts), never served stale transcripts."""
  reworded = task_lib.agents.oracle_turns
  monkeypatch.setattr(task_lib.agents, "oracle_turns",
                      lambda t, c=5: ["Reworded. " + x for x in reworded(t, c)])
  again = task_lib.build_task_set(
      ["toylib"], task_lib.synth_lib.SynthConfig(
          max_tasks=8, max_candidates=16, kinds=("operator_swap", "constant_change")),
      suite, cache_dir=paths[1], manifest=paths[0], trees={"toylib": str(toy_tree)},
      tool_config=domain.tool_config, fractions=(0.5, 0.25, 0.25))
  texts = json.dumps(again.transcripts)
  assert "Reworded. " in texts and "Reworded. " not in json.dumps(domain.task_set.transcripts)


def test_history_demonstrations_read_the_fix_from_the_history(toy_tree, suite, paths,
                                                              tmp_path):
  """`demonstrations='history'`: every transcript asks git for HEAD -> HEAD~1, applies
  the diff's hunk (the mutation undone, read from the observation) and submits; each
  replayed on a history-keeping checkout resolves; on the default checkout (the mutant
  the only commit) its git call shows no fix."""
  git_tools = tools.ToolConfig(git=True)
  d = task_lib.SweDomain(sources=["toylib"], manifest=paths[0],
                         trees={"toylib": str(toy_tree)}, max_tasks=8, max_candidates=16,
                         kinds=["operator_swap", "constant_change"],
                         difficulties=["easy", "medium"], fractions=(0.5, 0.25, 0.25),
                         cache_dir=str(tmp_path), suite=suite, tool_config=git_tools,
                         checkout_options={"keep_history": True},
                         demonstrations="history")
  try:
    assert d.task_set.stats["toylib==0.1.0"]["demonstrations"] == "history"
    for p in d.splits["train"]:
      m = d.records[p.id].mutation
      turns = d.task_set.transcripts[p.id]
      calls = [tools.parse_call(t, git_tools.tool_args()) for t, _ in turns]
      assert [c.name for c in calls] == ["git", "search_replace", "submit"]
      assert calls[0].args == {"command": "diff HEAD HEAD~1"}
      assert m.search in calls[1].args["replace"] and m.replace in calls[1].args["search"]
      assert m.replace in turns[0][1] and m.search in turns[0][1]  # the diff showed both
      assert [trained for _, trained in d.solution_segments(p)] == [True, False] * 2 + [True]
    # Replayed on a history-keeping checkout, a transcript resolves; on the default
    # checkout (the mutant the only commit) its git call shows no fix.
    p = d.splits["validation"][0]
    m = d.records[p.id].mutation
    turns = d.task_set.transcripts[p.id]
    leaky = d.start_episode(p)
    for turn, _ in turns:
      leaky.step(turn)
    assert d.finish_episodes([p], [leaky])[0]["correct"] == 1.0
    d.checkout_options = {}
    cleared = d.start_episode(p)
    observation = cleared.step(turns[0][0])
    assert m.search not in observation and "HEAD~1" in observation
    d.finish_episodes([p], [cleared])
  finally:
    d.close()
  with pytest.raises(ValueError, match="needs ToolConfig.git = True"):
    task_lib.SweDomain(demonstrations="history", suite=object(), cache_dir=str(tmp_path))
  with pytest.raises(ValueError, match="expected one of"):
    task_lib.SweDomain(demonstrations="random", suite=object(), cache_dir=str(tmp_path))


def test_bad_knobs_are_refused(tmp_path):
  with pytest.raises(ValueError, match="difficulties"):
    task_lib.SweDomain(difficulties=["trivial"], suite=object())
  with pytest.raises(ValueError, match="not in the manifest"):
    task_lib.SweDomain(sources=["nosuchlib"], cache_dir=str(tmp_path), suite=object())


def test_call_parses_is_the_tools_syntax_check(domain):
  turns = [t for t, _ in domain.task_set.transcripts[domain.splits["train"][0].id]]
  assert turns and all(domain.call_parses(t) for t in turns)
  assert domain.call_parses("I look first.\n" + tools.call_text("list_dir", path="."))
  for bad in ("no call here", '```tool\n{"tool": "read_file"}\n```',  # missing path
              tools.call_text("git", command="log"),  # not offered by default
              '```tool\n{"tool": "submit", "args": {}\n```',  # not JSON
              tools.call_text("submit") + tools.call_text("submit")):  # two blocks
    assert not domain.call_parses(bad), bad


# ------------------------------------------------------------------ issue levels


def test_the_default_level_is_the_synthesized_text(domain):
  built = {t.instance_id: t for t in domain.task_set.tasks}
  for p in (p for ps in domain.splits.values() for p in ps):
    assert p.id in built and p.prompt == built[p.id].problem_statement
    assert p.meta["level"] == 2 and domain.records[p.id] == built[p.id]


def test_the_levels_knob_through_gin(domain, toy_tree, suite, paths):
  """`SweDomain.levels = [0, 1]`: every task at both levels, the held-out tasks those of
  the default domain (task by task, each at level 0 then 1), training draws of both."""
  gin.parse_config("SweDomain.levels = [0, 1]")
  try:
    leveled = task_lib.SweDomain(  # the module's cache: a cache hit
        sources=["toylib"], manifest=paths[0], trees={"toylib": str(toy_tree)},
        max_tasks=8, max_candidates=16, kinds=["operator_swap", "constant_change"],
        difficulties=["easy", "medium"], fractions=(0.5, 0.25, 0.25), cache_dir=paths[1],
        suite=suite)
  finally:
    gin.clear_config()
  try:
    assert leveled.levels == (0, 1)
    for split, problems in domain.splits.items():
      ids = [p.id for p in problems]
      assert [(p.meta["instance_id"], p.meta["level"]) for p in leveled.splits[split]] == [
          (i, level) for i in ids for level in (0, 1)]
      for p in leveled.splits[split]:
        m = domain.records[p.meta["instance_id"]].mutation
        assert p.id == f"{p.meta['instance_id']}-L{p.meta['level']}"
        assert f"The bug is in the function `{m.function}` of `{m.file}`." in p.prompt
        assert (f"The faulty line is line {m.line}: " in p.prompt) == (p.meta["level"] == 0)
        assert p.solution == domain.splits[split][ids.index(p.meta["instance_id"])].solution
    assert {p.meta["level"] for p in leveled.train_problems(40, 0)} == {0, 1}
    # An L0 problem's episode runs on its task's checkout: the oracle's replay resolves.
    p = leveled.heldout_problems(1, "test")[0]
    assert p.meta["level"] == 0
    assert leveled.score_many([p], [p.solution])[0]["correct"] == 1.0
  finally:
    leveled.close()


def test_bad_levels_are_refused():
  for levels in ([], [3], [0, 0], ["0"]):
    with pytest.raises(ValueError, match="SweDomain.levels"):
      task_lib.SweDomain(levels=levels, suite=object())


def test_the_system_text_opens_every_prompt(domain, toy_tree, suite, paths):
  """`SweDomain.system`: the prompt opens with the given text (the plain layout and the
  oracle's replay unchanged); empty text is refused."""
  example = task_lib.SweDomain(
      sources=["toylib"], manifest=paths[0], trees={"toylib": str(toy_tree)},
      max_tasks=8, max_candidates=16, kinds=["operator_swap", "constant_change"],
      difficulties=["easy", "medium"], fractions=(0.5, 0.25, 0.25), cache_dir=paths[1],
      suite=suite, system=task_lib.SYSTEM_EXAMPLE)
  try:
    p = example.heldout_problems(1, "test")[0]
    assert example.format_prompt(p).startswith("System: " + task_lib.SYSTEM_EXAMPLE)
    assert domain.format_prompt(p).startswith("System: " + task_lib.SYSTEM + "\n")
    assert example.format_prompt(p).endswith(domain.format_prompt(p).split("\n", 1)[1])
    assert example.score_many([p], [p.solution])[0]["correct"] == 1.0
  finally:
    example.close()
  for bad in ("", "  ", None):
    with pytest.raises(ValueError, match="SweDomain.system"):
      task_lib.SweDomain(system=bad, suite=object())


def test_a_cache_written_before_levels_reads_as_level_2(domain, toy_tree, paths, tmp_path):
  """Synthesis cache rows without `level` (as written before levels existed) give the
  same task set, every task at level 2."""
  old = tmp_path / "cache"
  shutil.copytree(paths[1], old)
  synth_files = list((old / "tasks").glob("synth-*.json"))
  assert synth_files
  for path in synth_files:
    data = json.loads(path.read_text())
    assert all(row.pop("level") == 2 for row in data["tasks"])
    path.write_text(json.dumps(data))
  again = task_lib.build_task_set(  # no suite: a cache hit runs nothing
      ["toylib"], task_lib.synth_lib.SynthConfig(
          max_tasks=8, max_candidates=16, kinds=("operator_swap", "constant_change")),
      None, cache_dir=str(old), manifest=paths[0], trees={"toylib": str(toy_tree)},
      tool_config=domain.tool_config, fractions=(0.5, 0.25, 0.25))
  assert again.tasks == domain.task_set.tasks and {t.level for t in again.tasks} == {2}
