"""The multi-turn rollout engine on a toy echo task and the tiny from-scratch model.

The environment's observation is a pure function of the turn text (`EchoEnv.observe`),
so each test rebuilds the expected trajectory from the sampled ids independently.
"""

import json
import re
import time

import gin
import jax
import numpy as np
import pytest
from flax import nnx

from bench.multiturn import CharTokenizer, EchoEnv, EchoTask, tiny_model
from evotrainer.rollouts import (BUDGET_STOPS, Generation, MultiTurnEngine, TurnBudget,
                                 merge, rollout_for)
from evotrainer.rollouts.schema import episodes_to_table, table_to_episodes
from evotrainer.sampling import Sampler, SamplingParams

TOK = CharTokenizer()
SP = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def model():
  return tiny_model(max_positions=128)


@pytest.fixture(scope="module")
def sampler(model):  # shared: every test reuses the compiled programs
  return Sampler(model, pad_id=TOK.pad_id)


def _run(model, sampler, env_factory=None, budget=None, problems=2, group=2, key=0,
         pad_rows_to=None, sampling=SP, kv_continuation=True, overlap_waves=1):
  task = EchoTask(env_factory)
  rollout = MultiTurnEngine(task, TOK, sampler, budget=budget or TurnBudget(
      max_turns=3, max_context=64, max_tokens_per_turn=8), kv_continuation=kv_continuation,
      overlap_waves=overlap_waves)
  gen = rollout(nnx.state(model), task.train_problems(problems, seed=0), group,
                jax.random.key(key), sampling, pad_rows_to=pad_rows_to)
  return task, rollout, gen


def _split_turns(gen: Generation, i: int) -> list:
  """[(turn ids, observation ids)] of row i, read from its turn spans."""
  spans = gen.infos[i]["turn_spans"]
  ends = [s[0] for s in spans[1:]] + [int(gen.lengths[i])]
  return [(gen.tokens[i, s:e].tolist(), gen.tokens[i, e:nxt].tolist())
          for (s, e, _), nxt in zip(spans, ends)]


@pytest.mark.slow
def test_token_in_token_out(model, sampler):
  task, _, gen = _run(model, sampler, budget=TurnBudget(max_turns=4, max_context=64,
                                                        max_tokens_per_turn=8))
  n = len(gen.problems)
  assert gen.loss_mask.shape == gen.tokens.shape == gen.logprobs.shape
  saw_observation = False
  for i in range(n):
    turns = _split_turns(gen, i)
    assert len(turns) == gen.infos[i]["turns"] >= 1
    expected_ids, expected_mask, text = [], [], ""
    for k, (ids, obs) in enumerate(turns):
      assert 1 <= len(ids) <= 8
      # A turn ends at its first stop id or at the per-turn cap; never a stop id inside.
      assert TOK.eos_id not in ids[:-1]
      turn_text = TOK.decode([t for t in ids if t != TOK.eos_id])
      last = k == len(turns) - 1
      # The observation appended is the env's answer to the decoded turn text, wrapped
      # by format_observation and encoded without BOS; none after the last turn.
      want_obs = [] if last else TOK.encode(f"<{EchoEnv.observe(turn_text)}>\n")
      assert obs == want_obs
      saw_observation |= bool(obs)
      expected_ids += ids + obs
      expected_mask += [True] * len(ids) + [False] * len(obs)
      text += turn_text + ("" if last else f"<{EchoEnv.observe(turn_text)}>\n")
    n_i = int(gen.lengths[i])
    assert gen.tokens[i, :n_i].tolist() == expected_ids
    assert gen.loss_mask[i].tolist() == expected_mask + [False] * (gen.tokens.shape[1] - n_i)
    assert gen.texts[i] == text
    # Log-probs: 0 at observations and padding, negative at every sampled id.
    lp = gen.logprobs[i]
    assert np.all(lp[~gen.loss_mask[i]] == 0) and np.all(lp[gen.loss_mask[i]] < 0)
    # Turn spans carry each turn's summed log-probs.
    for s, e, total in gen.infos[i]["turn_spans"]:
      assert total == pytest.approx(float(lp[s:e].sum()), abs=1e-4)
  assert saw_observation  # the check above was not vacuous
  # Episodes: env info + engine record, the stop consistent with the scores.
  eps = gen.episodes(task, version="v0", step=1, split="train", group=2)
  for ep, info in zip(eps, gen.infos):
    assert ep.info["stop"] == info["stop"] and ep.reward_parts[f"stop_{info['stop']}"] == 1.0
    assert ep.info["env_stop"] in (None, "submitted")  # EchoEnv.info() reached Episode.info


class _ClosingTask(EchoTask):
  end_of_turn = "."  # the template's end of a turn, for turns cut without their stop id


def test_a_cut_turn_is_closed_before_its_observation(model, sampler):
  """A turn that hits `max_tokens_per_turn` without the stop id gets the task's
  `end_of_turn` ids (mask 0) before its observation; a turn that sampled the stop id
  gets none; the text keeps neither."""
  task = _ClosingTask()
  rollout = MultiTurnEngine(task, TOK, sampler, budget=TurnBudget(
      max_turns=3, max_context=64, max_tokens_per_turn=4))
  gen = rollout(nnx.state(model), task.train_problems(4, seed=0), 2, jax.random.key(3), SP)
  seen = set()
  for i in range(len(gen.problems)):
    text = ""
    for k, (ids, obs) in enumerate(_split_turns(gen, i)):
      turn_text = TOK.decode([t for t in ids if t != TOK.eos_id])
      observation = f"<{EchoEnv.observe(turn_text)}>\n" if obs else ""
      if obs:
        cut = ids[-1] != TOK.eos_id
        assert obs == TOK.encode(("." if cut else "") + observation)
        seen.add(cut)
      text += turn_text + observation
    assert gen.texts[i] == text
  assert seen == {True, False}  # both kinds of turn were checked


@pytest.mark.parametrize("kv_continuation", [True, False])
@pytest.mark.slow
def test_sampler_logprobs_match_a_teacher_forced_forward(model, sampler, kv_continuation):
  _, _, gen = _run(model, sampler, budget=TurnBudget(max_turns=3, max_context=64,
                                                     max_tokens_per_turn=8), key=5,
                   kv_continuation=kv_continuation)
  # Every row's prompt + trajectory, right-padded into one batch: one plain forward.
  seqs = [gen.prompt_tokens[i, -int(gen.prompt_lengths[i]):].tolist()
          + gen.tokens[i, :int(gen.lengths[i])].tolist() for i in range(len(gen.problems))]
  width = max(map(len, seqs))
  batch = np.array([s + [TOK.pad_id] * (width - len(s)) for s in seqs], np.int32)
  valid = np.arange(width)[None, :] < np.array([len(s) for s in seqs])[:, None]
  logits = np.asarray(model.forward_logits(batch, valid), np.float64)  # [B, T, V]
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  checked = 0
  for i, seq in enumerate(seqs):
    p, n = int(gen.prompt_lengths[i]), int(gen.lengths[i])
    want = np.array([logp[i, p + j - 1, seq[p + j]] for j in range(n)])
    mask = gen.loss_mask[i, :n]
    # float32 sampler (prefill + cached decode; each turn continued from the cache or
    # re-prefilled) vs a float64
    # log-softmax of one forward over the whole sequence
    np.testing.assert_allclose(gen.logprobs[i, :n][mask], want[mask], atol=1e-5)
    assert np.all(gen.logprobs[i, :n][~mask] == 0)
    checked += int(mask.sum()) * (len(gen.infos[i]["turn_spans"]) > 1)
  assert checked > 0  # tokens of later turns (after an observation) were compared


@pytest.mark.slow
def test_kv_continuation_samples_what_re_prefilling_samples(model, sampler):
  budget = TurnBudget(max_turns=4, max_context=96, max_tokens_per_turn=8)
  runs = [_run(model, sampler, budget=budget, problems=3, key=7, kv_continuation=c)[2]
          for c in (True, False)]
  a, b = runs
  assert max(len(i["turn_spans"]) for i in a.infos) >= 3  # later turns were continued
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def _SubmitAt(k):  # submits after exactly k turns, never on '!'
  return EchoEnv(submit_at=k, submit_char=None)


class _Raising(EchoEnv):
  def step(self, text):
    if len(self.texts) == 1:
      raise RuntimeError("tool crashed")
    return super().step(text)

  def __init__(self):
    super().__init__(submit_char=None)


class _Sleeping(EchoEnv):
  def step(self, text):
    time.sleep(1.0)
    return super().step(text)


def _stops(gen):
  return [info["stop"] for info in gen.infos]


def test_each_stop_reason_fires_when_planted(model, sampler):
  base = dict(max_context=64, max_tokens_per_turn=8)
  # The env's own stop: submitted after exactly 2 turns.
  _, _, gen = _run(model, sampler, lambda p: _SubmitAt(2), TurnBudget(max_turns=5, **base))
  assert _stops(gen) == ["submitted"] * 4
  assert [i["turns"] for i in gen.infos] == [2] * 4 and not gen.truncated.any()
  # max_turns: the env never submits.
  _, _, gen = _run(model, sampler, lambda p: _SubmitAt(99), TurnBudget(max_turns=2, **base))
  assert _stops(gen) == ["max_turns"] * 4 and gen.truncated.all()
  assert [len(i["turn_spans"]) for i in gen.infos] == [2] * 4
  # max_context: a context of 30 leaves 22 tokens before a turn; prompts (<= 12 tokens)
  # fit once, then the first observation or the second turn no longer fits.
  _, _, gen = _run(model, sampler, lambda p: _SubmitAt(99),
                   TurnBudget(max_turns=9, max_context=30, max_tokens_per_turn=8))
  assert _stops(gen) == ["max_context"] * 4
  assert np.all(gen.prompt_lengths + gen.lengths <= 22)  # the context never exceeds it
  # max_context before any turn: the prompt itself leaves no room.
  _, _, gen = _run(model, sampler, lambda p: _SubmitAt(99),
                   TurnBudget(max_turns=9, max_context=9, max_tokens_per_turn=8))
  assert _stops(gen) == ["max_context"] * 4 and gen.lengths.tolist() == [0] * 4
  # max_tokens: at most 8 sampled tokens per turn, 9 per episode -> 2 turns at most.
  _, _, gen = _run(model, sampler, lambda p: _SubmitAt(99),
                   TurnBudget(max_turns=9, max_model_tokens=9, **base))
  assert set(_stops(gen)) == {"max_tokens"}
  assert all(9 <= i["model_tokens"] <= 16 for i in gen.infos)
  # tool_error: the env raises on its second turn; contained, the episode stops.
  _, _, gen = _run(model, sampler, lambda p: _Raising(), TurnBudget(max_turns=5, **base))
  assert _stops(gen) == ["tool_error"] * 4
  assert all("tool crashed" in i["error"] for i in gen.infos)
  assert not gen.truncated.any()  # not a budget stop
  # env_timeout: a 1 s step under a 0.2 s limit; all rows' steps run at once.
  t = time.time()
  _, _, gen = _run(model, sampler, lambda p: _Sleeping(),
                   TurnBudget(max_turns=5, tool_time_limit_s=0.2, **base))
  assert _stops(gen) == ["env_timeout"] * 4 and gen.truncated.all()
  assert time.time() - t < 5.0  # not 4 x 1 s in a row


def _mixed(p):  # per problem: submits after 2 turns, never, raises, times out
  return [lambda: _SubmitAt(2), lambda: _SubmitAt(99), _Raising,
          _Sleeping][int(p.id.split("/")[1]) % 4]()


@pytest.mark.slow
def test_overlap_waves_sample_what_lock_step_samples(model, sampler):
  budget = TurnBudget(max_turns=3, max_context=64, max_tokens_per_turn=8,
                      tool_time_limit_s=0.2)
  greedy = SamplingParams(greedy=True)
  # 4 problems x 2 rows: every stop kind, at different turns.
  runs = {w: _run(model, sampler, _mixed, budget, problems=4, group=2, key=3,
                  sampling=greedy, overlap_waves=w)[2] for w in (1, 2)}
  a = runs[1]
  assert set(_stops(a)) == {"submitted", "max_turns", "tool_error", "env_timeout"}
  assert len({i["turns"] for i in a.infos}) > 1  # waves ran different turn counts
  for w in (2,):
    b = runs[w]  # the same tokens, stops and scores; log-probs up to other padding
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert a.texts == b.texts and a.scores == b.scores
    assert [{**i, "turn_spans": None} for i in a.infos] == \
        [{**i, "turn_spans": None} for i in b.infos]
  # At temperature 1 a wave's keys do not depend on the tools' timing: same keys, same
  # Generation.
  c, d = (_run(model, sampler, _mixed, budget, problems=4, group=2, key=4,
               overlap_waves=2)[2] for _ in range(2))
  np.testing.assert_array_equal(c.tokens, d.tokens)
  np.testing.assert_array_equal(c.logprobs, d.logprobs)
  assert _stops(c) == _stops(d)


class _TimedSampler:
  """The sampler, recording the (start, end) of each call until its results are ready.
  A call lasts at least `min_s`: the tiny model samples a turn in ~3 ms, less than a
  loaded machine can take to start a tool's thread, which would then begin after the
  call it was submitted before."""

  def __init__(self, sampler, min_s=0.05):
    self.inner, self.config, self.mesh, self.calls = sampler, sampler.config, None, []
    self.min_s = min_s

  def __call__(self, *args, **kw):
    start = time.monotonic()
    out = jax.block_until_ready(self.inner(*args, **kw))
    time.sleep(max(0.0, start + self.min_s - time.monotonic()))
    self.calls.append((start, time.monotonic()))
    return out


def test_env_steps_run_while_the_sampler_samples_another_wave(model, sampler):
  budget = TurnBudget(max_turns=3, max_context=64, max_tokens_per_turn=8)
  for waves, problems in ((1, 2), (2, 4)):  # batches of 4 rows (compiled already)
    steps = []

    class Slow(EchoEnv):  # a tool of 0.3 s
      def step(self, text):
        start = time.monotonic()
        time.sleep(0.3)
        steps.append((start, time.monotonic()))
        return super().step(text)

    timed = _TimedSampler(sampler)
    _, _, gen = _run(model, timed, lambda p: Slow(submit_char=None), budget,
                     problems=problems, overlap_waves=waves)
    assert _stops(gen) == ["max_turns"] * 2 * problems and len(steps) == 6 * problems
    overlapped = [(s, c) for s in steps for c in timed.calls if c[0] < s[1] and s[0] < c[1]]
    # Lock-step: no sampler call while a tool runs. Two waves: every turn but the first
    # wave's first is sampled while the other wave's tools run.
    assert len({c for _, c in overlapped}) == (0 if waves == 1 else 5), (waves, overlapped)


def test_mask_budget_stops_zeroes_the_loss_mask(model, sampler):
  budget = TurnBudget(max_turns=2, max_context=64, max_tokens_per_turn=8,
                      mask_budget_stops=True)
  _, _, gen = _run(model, sampler, lambda p: _SubmitAt(2 if p.id.endswith("0") else 99),
                   budget)
  kinds = set(_stops(gen))
  assert kinds == {"submitted", "max_turns"}  # both kinds present
  for i, stop in enumerate(_stops(gen)):
    assert gen.loss_mask[i].any() == (stop not in BUDGET_STOPS)
  # The harness-side alternative cuts the same episodes.
  from evotrainer.harness.filters import StopReasonFilter
  eps = gen.episodes(EchoTask(), version="v0", step=1, split="train", group=2)
  keep = StopReasonFilter(stops=BUDGET_STOPS)(eps).keep
  assert keep.tolist() == [s not in BUDGET_STOPS for s in _stops(gen)]


@pytest.mark.slow
def test_compiled_programs_stay_bounded(model):
  sampler = Sampler(model, pad_id=TOK.pad_id)  # a fresh one: count its programs only
  budget = TurnBudget(max_turns=6, max_context=96, max_tokens_per_turn=8)
  # Rows finish at different turns: row r submits after 1 + r % 4 turns.
  ends = {}

  def factory(p):
    ends.setdefault(p.id, 1 + len(ends) % 4)
    return _SubmitAt(ends[p.id])

  _, rollout, gen = _run(model, sampler, factory, budget, problems=4, group=2,
                         pad_rows_to=12)
  assert sorted(set(i["turns"] for i in gen.infos)) == [1, 2, 3, 4]
  assert len(gen.problems) == 8
  # One program per context bucket below 96 - 8 = 88 at most: (16, 32, 64, 88); the
  # batch is always the 12 rows, whichever rows are still running.
  assert rollout.buckets == (16, 32, 64, 88)
  assert 2 <= sampler.compiled_programs() <= 4
  # A second run with other keys adds at most the buckets it had not reached.
  _run(model, sampler, factory, budget, problems=4, group=2, pad_rows_to=12, key=9)
  assert sampler.compiled_programs() <= 4


def test_waves_compile_one_program_per_bucket(model):
  sampler = Sampler(model, pad_id=TOK.pad_id)  # a fresh one: count its programs only
  budget = TurnBudget(max_turns=6, max_context=96, max_tokens_per_turn=8)
  # Rows finish at different turns (row r after 1 + r % 4); two waves of 6 rows each
  # sample one program per bucket at most, whichever rows of a wave are still running.
  _, rollout, gen = _run(model, sampler, lambda p: _SubmitAt(1 + int(p.id[-1]) % 4),
                         budget, problems=4, group=2, pad_rows_to=12, overlap_waves=2)
  assert sorted(set(i["turns"] for i in gen.infos)) == [1, 2, 3, 4]
  # The 8 rows spread over the waves, 2 filler slots in each.
  assert rollout._wave_slots(8, 12) == [[0, 1, 2, 3, None, None], [4, 5, 6, 7, None, None]]
  assert 2 <= sampler.compiled_programs() <= 4


def test_merge_and_store_round_trip(model, sampler, tmp_path):
  task, _, a = _run(model, sampler, lambda p: _SubmitAt(1), key=1)
  _, _, b = _run(model, sampler, lambda p: _SubmitAt(3), key=2)
  m = merge([a, b])
  assert m.tokens.shape[1] == max(a.tokens.shape[1], b.tokens.shape[1])
  assert m.loss_mask.sum() == a.loss_mask.sum() + b.loss_mask.sum()
  assert m.infos == a.infos + b.infos
  for g, rows in ((a, slice(0, 4)), (b, slice(4, 8))):
    w = g.tokens.shape[1]
    np.testing.assert_array_equal(m.tokens[rows, :w], g.tokens)
    np.testing.assert_array_equal(m.loss_mask[rows, :w], g.loss_mask)
    assert not m.loss_mask[rows, w:].any()
  eps = m.episodes(task, version="v0", step=3, split="train", group=2)
  back = table_to_episodes(episodes_to_table(eps))
  for x, y in zip(eps, back):
    assert y.info == x.info and y.info["turn_spans"] == x.info["turn_spans"]
    np.testing.assert_array_equal(y.completion_ids, x.completion_ids)
    np.testing.assert_array_equal(y.logprobs, x.logprobs)
    assert y.completion == x.completion and y.truncated == x.truncated


def test_rollout_for_picks_the_engine(sampler):
  from evotrainer.rollouts import SingleTurnEngine
  assert isinstance(rollout_for(EchoTask(), TOK, sampler), MultiTurnEngine)

  class Single:
    pass
  assert isinstance(rollout_for(Single(), TOK, sampler), SingleTurnEngine)
  with pytest.raises(TypeError, match="start_episode"):
    MultiTurnEngine(type("T", (), {"multi_turn": True})(), TOK, sampler)
  with pytest.raises(ValueError, match="max_tokens_per_turn"):
    TurnBudget(max_context=8, max_tokens_per_turn=8)


def test_the_env_turn_budget_must_equal_the_engine_s(sampler):
  task = EchoTask()
  task.max_turns = 4  # the environment's own budget, as SweDomain carries Budget's
  with pytest.raises(ValueError, match=r"max_turns=4 .*TurnBudget.max_turns=3"):
    MultiTurnEngine(task, TOK, sampler, budget=TurnBudget(max_turns=3))
  assert MultiTurnEngine(task, TOK, sampler, budget=TurnBudget(max_turns=4)).budget.max_turns == 4


@pytest.mark.slow
def test_train_two_steps_on_the_toy_task(tmp_path):
  from evotrainer.learner.step import Learner
  from evotrainer.train import EvalConfig, train
  seen = []

  class Task(EchoTask):
    # Reward: the share of 'a' in the episode's turns (varies within a group).
    def finish_episodes(self, problems, envs):
      out = []
      for env in envs:
        text = "".join(env.texts)
        out.append({"correct": text.count("a") / max(1, len(text)), "format": 0.0})
      return out

  class Spy(Learner):
    def step(self, state, batch, hp):
      seen.append(batch)
      return super().step(state, batch, hp)

  task = Task(lambda p: _SubmitAt(2))
  model = tiny_model(max_positions=128)
  # The budget as a run configures it: gin binds the engine's constructor.
  gin.bind_parameter("MultiTurnEngine.budget",
                     TurnBudget(max_turns=3, max_context=64, max_tokens_per_turn=8))
  try:
    out = train(str(tmp_path), task, model, TOK, seed=1, steps=2, prompts_per_step=2,
                group_size=2, eval_every=100, checkpoint_every=100, progress=False,
                store_rollouts=False,
                eval_config=EvalConfig(num_problems=2, k=2, batch_rows=4, max_new_tokens=8),
                learner_factory=lambda m, mesh, **kw: Spy(m, mesh, learning_rate=1e-3, **kw))
  finally:
    gin.clear_config()
  assert out["steps"] == 2 and len(seen) == 2
  for batch in seen:
    mask = np.asarray(batch.loss_mask)
    tokens = np.asarray(batch.completion_tokens)
    lengths = np.asarray(batch.completion_lengths)
    assert not mask[np.arange(mask.shape[1])[None, :] >= lengths[:, None]].any()
    for i in range(len(tokens)):
      # Two turns, so exactly one masked-out run inside the trajectory: the observation
      # between them, as format_observation wrote it; everything else is trained.
      m = mask[i, :lengths[i]]
      runs = np.flatnonzero(np.diff(np.concatenate([[1], m.astype(int), [1]])))
      assert len(runs) == 2, m
      observation = TOK.decode(tokens[i, runs[0]:runs[1]].tolist())
      assert re.fullmatch(r"<\d+:.{0,4}>\n", observation, re.S), observation
      assert m[:runs[0]].all() and m[runs[1]:].all() and runs[0] >= 1
  metrics = _metrics(tmp_path)
  assert len(metrics) == 2 and all(np.isfinite(m["learner/loss"]) for m in metrics)
  # The learner's teacher-forced log-probs over the whole trajectory (observations
  # included as context) agree with the sampler's at every trained token.
  assert all(m["learner/sampler_logprob_gap"] < 1e-3 for m in metrics), metrics
  assert np.isfinite(out["final"]["avg2"])


def _metrics(workdir):
  with open(workdir / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f) if "learner/loss" in r]


@pytest.mark.slow
@pytest.mark.parametrize("overlap_waves", [1, 2])
@pytest.mark.slow
def test_two_processes_get_identical_generations(tmp_path, overlap_waves):
  import sys

  from tests.sharding.spawn import format_logs, free_port, process_env, run_processes
  port = free_port()
  envs = [process_env(2, port=port, process_id=i, num_processes=2) for i in range(2)]
  codes, logs = run_processes([sys.executable, "-m", "tests.rollouts.multiturn_worker",
                               str(tmp_path), str(overlap_waves)], envs, tmp_path,
                              600)  # a hang guard, generous for 2 shared cores
  assert codes == [0, 0], format_logs(codes, logs)
  a, b = (json.loads((tmp_path / f"process{i}.json").read_text()) for i in range(2))
  # Environments stepped on process 0 only; process 1 got the same observations,
  # stops and scores by broadcast, and sampled the same tokens (rows gathered).
  assert a.pop("env_steps") > 0 and b.pop("env_steps") == 0
  assert a == b
  # Rows submit after 1 + k % 3 turns: the episodes really ended at different turns.
  assert len({info["turns"] for info in a["infos"]}) > 1
  rows = list(zip(a["loss_mask"], a["lengths"]))
  assert all(mask[0] for mask, n in rows if n)  # a trajectory opens with a model turn
  assert sum(n - sum(mask[:n]) for mask, n in rows) > 0  # observations inside, masked
