"""Supervised warm start: the loss, training, the cache, and accuracy vs steps (printed)."""

import dataclasses
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer import checkpoint
from evotrainer.learner import warmstart
from evotrainer.model import ModelConfig, Transformer
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sharding.mesh import create_model, make_mesh
from evotrainer.sharding.rules import LEARNER_RULES
from evotrainer.tasks.math.task import MathTask
from evotrainer.tokenizers import SentencePieceTokenizer

# gin/model/tiny.gin
TINY = ModelConfig(architecture="qwen3", vocab_size=512, hidden_size=64, intermediate_size=192,
                   num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True,
                   tie_embeddings=True, max_position_embeddings=512)


@pytest.fixture(scope="module")
def task():
  t = MathTask(sources=["tiny_arithmetic"], prompt_template="{question}")
  yield t
  t.close()


@pytest.fixture(scope="module")
def tok(task, tmp_path_factory):
  # As `run` trains it: the task's prompts and solutions.
  texts = [task.format_prompt(p) + " " + p.solution for p in task.train_problems(500, 0)]
  return SentencePieceTokenizer.train(texts, 512, str(tmp_path_factory.mktemp("spm")))


@pytest.fixture
def counted_train(monkeypatch):
  """Records every call into the training loop (and the losses it returned)."""
  calls = []
  real = warmstart._train

  def train(*args, **kwargs):
    losses = real(*args, **kwargs)
    calls.append(losses)
    return losses

  monkeypatch.setattr(warmstart, "_train", train)
  return calls


def params_of(model):
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_solution_batch_layout(tok):
  batch = warmstart.solution_batch(tok, ["1+2=", "10+20="], ["<answer>3</answer>",
                                                           "<answer>30</answer>"])
  p0, p1 = tok.encode("1+2="), tok.encode("10+20=")
  c0, c1 = tok.encode("<answer>3</answer>"), tok.encode("<answer>30</answer>")
  assert len(p1) > len(p0) and len(c1) > len(c0)
  width, n = len(p1) + 1, len(c1) + 1
  assert batch.prompt_tokens.tolist() == [
      [tok.pad_id] * (width - len(p0) - 1) + [tok.bos_id] + p0, [tok.bos_id] + p1]
  assert batch.prompt_lengths.tolist() == [len(p0) + 1, len(p1) + 1]
  assert batch.completion_tokens.tolist() == [
      c0 + [tok.eos_id] + [tok.pad_id] * (n - len(c0) - 1), c1 + [tok.eos_id]]
  assert batch.completion_lengths.tolist() == [len(c0) + 1, len(c1) + 1]
  assert batch.loss_mask.tolist() == [[True] * (len(c0) + 1) + [False] * (n - len(c0) - 1),
                                      [True] * n]


def test_solution_batch_segments_mask_observations(tok):
  # A multi-turn episode: model turns end with eos and are trained; observations not.
  segments = [("<answer>", True), ("12", False), ("</answer>", True)]
  batch = warmstart.solution_batch(tok, ["1+2=", "3+4="], [segments, "<answer>7</answer>"])
  a, o, b = tok.encode("<answer>"), tok.encode("12"), tok.encode("</answer>")
  row0 = a + [tok.eos_id] + o + b + [tok.eos_id]
  row1 = tok.encode("<answer>7</answer>") + [tok.eos_id]
  n = max(len(row0), len(row1))
  assert batch.completion_tokens[0].tolist() == row0 + [tok.pad_id] * (n - len(row0))
  assert batch.completion_lengths.tolist() == [len(row0), len(row1)]
  assert batch.loss_mask[0].tolist() == ([True] * (len(a) + 1) + [False] * len(o) +
                                         [True] * (len(b) + 1) + [False] * (n - len(row0)))
  assert batch.loss_mask[1].tolist() == [True] * len(row1) + [False] * (n - len(row1))


def test_supervised_loss_is_token_mean_nll():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.9], [0.125, 1.0, 1.0]]))
  mask = jnp.array([[True, True, False], [True, False, False]])
  loss, metrics = warmstart.supervised_loss(logp, mask)
  expected = (np.log(2) + np.log(4) + np.log(8)) / 3  # 3 trained tokens; 0.9 is padding
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  assert float(metrics["tokens"]) == 3


@pytest.mark.slow
def test_loss_covers_completion_only(tok):
  """The loss equals cross-entropy read off one plain forward pass over bos + prompt +
  completion at the completion positions: the prompt and padding are not trained on."""
  model = Transformer(TINY, rngs=nnx.Rngs(0))
  prompts, sols = ["12+7=", "3+45="], ["<answer>19</answer>", "<answer>48</answer>"]
  batch = warmstart.solution_batch(tok, prompts, sols)
  logp, _ = warmstart.completion_logprobs(model, jax.tree.map(jnp.asarray, batch),
                                          vocab_limit=tok.vocab_size)
  loss, _ = warmstart.supervised_loss(logp, jnp.asarray(batch.loss_mask))
  nll = []
  for prompt, sol in zip(prompts, sols):
    ctx = [tok.bos_id] + tok.encode(prompt)
    target = tok.encode(sol) + [tok.eos_id]
    seq = jnp.asarray([ctx + target])
    logits = model.forward_logits(seq)[0, :, :tok.vocab_size]  # same vocabulary limit
    lp = jax.nn.log_softmax(logits, axis=-1)
    for j, t in enumerate(target):
      nll.append(-float(lp[len(ctx) - 1 + j, t]))
  np.testing.assert_allclose(float(loss), np.mean(nll), rtol=1e-5)


@pytest.mark.slow
def test_pack_prompts_keeps_every_trained_logprob(tok):
  """Packed rows (prompt moved into the completion, masked) give the same log-probs of
  the trained tokens and the same loss as the rollout layout, with less padding."""
  model = Transformer(TINY, rngs=nnx.Rngs(0))
  prompts = ["12+7=", "3+45+100+2000+7=", "1="]
  sols = [[("<answer>", True), ("19", False), ("</answer>", True)],
          "<answer>2155</answer>", "<answer>1</answer>"]
  batch = warmstart.solution_batch(tok, prompts, sols)
  packed = warmstart.pack_prompts(batch, tok.pad_id)
  lp, lc = batch.prompt_lengths, batch.completion_lengths
  assert packed.prompt_tokens.tolist() == [[tok.bos_id]] * 3
  assert packed.completion_lengths.tolist() == (lp - 1 + lc).tolist()
  assert packed.completion_tokens.shape[1] == max(lp - 1 + lc) < (
      batch.prompt_tokens.shape[1] + batch.completion_tokens.shape[1])
  assert packed.loss_mask.sum() == batch.loss_mask.sum()
  for i in range(3):
    row = packed.completion_tokens[i, :packed.completion_lengths[i]].tolist()
    assert row == tok.encode(prompts[i]) + batch.completion_tokens[i, :lc[i]].tolist()
    assert not packed.loss_mask[i, :lp[i] - 1].any()
  logp, _ = warmstart.completion_logprobs(model, jax.tree.map(jnp.asarray, batch),
                                          vocab_limit=tok.vocab_size)
  logq, _ = warmstart.completion_logprobs(model, jax.tree.map(jnp.asarray, packed),
                                          vocab_limit=tok.vocab_size)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(logq)[i][packed.loss_mask[i]],
                               np.asarray(logp)[i][batch.loss_mask[i]], rtol=1e-5, atol=1e-5)
  a, _ = warmstart.supervised_loss(logp, jnp.asarray(batch.loss_mask))
  b, _ = warmstart.supervised_loss(logq, jnp.asarray(packed.loss_mask))
  np.testing.assert_allclose(float(a), float(b), rtol=1e-5)
  # max_tokens cuts every row to a prefix (prompt included): the trained tokens kept
  # keep their log-probs, the ones past the cut are not trained.
  cut = int(lp[1]) + 2  # row 1: its prompt and 2 solution tokens
  short = warmstart.pack_prompts(batch, tok.pad_id, max_tokens=cut)
  assert short.completion_tokens.shape[1] == cut - 1
  assert short.completion_lengths.tolist() == np.minimum(lp - 1 + lc, cut - 1).tolist()
  assert short.loss_mask[1].sum() == 2
  logs, _ = warmstart.completion_logprobs(model, jax.tree.map(jnp.asarray, short),
                                          vocab_limit=tok.vocab_size)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(logs)[i][short.loss_mask[i]],
                               np.asarray(logq)[i, :cut - 1][short.loss_mask[i]],
                               rtol=1e-5, atol=1e-5)


def test_length_buckets_fill_batches():
  lengths = np.array([100, 250, 260, 300, 600, 620, 700, 900, 40, 250])
  buckets = warmstart.length_buckets(lengths, 256, batch_size=2)
  # 256: rows 0, 1, 8, 9; 512: rows 2, 3; 768: rows 4-6; 1024: row 7 alone joins 768.
  assert [(w, sorted(r.tolist())) for w, r in buckets] == [
      (256, [0, 1, 8, 9]), (512, [2, 3]), (1024, [4, 5, 6, 7])]
  assert all(lengths[r].max() <= w for w, r in buckets)
  # A bucket short of a batch joins the next wider one (512 into 768, 1024 into that).
  assert [(w, sorted(r.tolist())) for w, r in warmstart.length_buckets(
      lengths, 256, batch_size=3)] == [(256, [0, 1, 8, 9]), (1024, [2, 3, 4, 5, 6, 7])]
  epoch = warmstart._bucket_epoch(buckets, 2, np.random.default_rng(0))
  assert sorted(len(r) for _, r in epoch) == [2] * 5
  assert all(set(r.tolist()) <= set(dict(
      (w, rr.tolist()) for w, rr in buckets)[w]) for w, r in epoch)


def test_bucketed_warm_start_learns(tok, task, tmp_path, counted_train):
  kw = dict(steps=30, batch_size=16, learning_rate=3e-3, seed=0, cache_dir=str(tmp_path))
  warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, task, bucket_width=4, **kw)
  losses = counted_train[-1]
  assert len(losses) == 30 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
  (entry,) = list(tmp_path.iterdir())
  assert checkpoint.read_model_metadata(entry)["settings"]["bucket_width"] == 4


def test_top_layers_warm_start_trains_only_the_top_blocks(tok, task, tmp_path, counted_train):
  # An untied head, so that the head is trained beside the top block.
  config = dataclasses.replace(TINY, tie_embeddings=False)
  model = Transformer(config, rngs=nnx.Rngs(0))
  before = {path: np.asarray(v) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  kw = dict(steps=20, batch_size=16, learning_rate=3e-3, seed=0, cache_dir=str(tmp_path))
  warmstart.warm_start(model, tok, task, top_layers=1, **kw)
  after = {path: np.asarray(v) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  moved = {path for path in before if not np.array_equal(before[path], after[path])}
  top = {p for p in before if p[0] == "layers" and p[1] == config.num_layers - 1}
  head = {p for p in before if p[0] in ("final_norm", "lm_head")}
  # Every parameter of the top block and the head moved; nothing else did.
  assert top and head and moved == top | head, sorted(moved ^ (top | head))
  losses = counted_train[-1]
  assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
  (entry,) = list(tmp_path.iterdir())
  assert checkpoint.read_model_metadata(entry)["settings"]["top_layers"] == 1
  with pytest.raises(ValueError, match="warm_start.top_layers=5"):
    warmstart.warm_start(Transformer(config, rngs=nnx.Rngs(0)), tok, task, top_layers=5, **kw)


@pytest.mark.slow
def test_warm_start_trains_then_hits_cache(tok, task, tmp_path, counted_train, caplog):
  kw = dict(steps=40, batch_size=32, learning_rate=3e-3, seed=0, cache_dir=str(tmp_path))
  first = warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, task, **kw)
  assert len(counted_train) == 1
  losses = counted_train[0]
  assert len(losses) == 40 and all(np.isfinite(losses))
  assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
  (entry,) = list(tmp_path.iterdir())
  meta = checkpoint.read_model_metadata(entry)
  assert meta["settings"]["steps"] == 40 and len(meta["losses"]) == 40

  with caplog.at_level(logging.INFO, logger="evotrainer.learner.warmstart"):
    again = warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, task, **kw)
  assert len(counted_train) == 1, "the cached warm start was trained again"
  assert f"warm start: cache hit {entry}" in caplog.text
  for a, b in zip(params_of(first), params_of(again)):
    np.testing.assert_array_equal(a, b)

  # Any input that changes the result is a miss: the step count, the initial params.
  warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, task, **{**kw, "steps": 41})
  assert len(counted_train) == 2
  other_init = warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(1)), tok, task, **kw)
  assert len(counted_train) == 3
  assert not np.array_equal(params_of(other_init)[0], params_of(first)[0])
  assert len(list(tmp_path.iterdir())) == 3
  # steps=0 leaves the model alone.
  fresh = Transformer(TINY, rngs=nnx.Rngs(0))
  before = params_of(fresh)
  warmstart.warm_start(fresh, tok, task, **{**kw, "steps": 0})
  assert len(counted_train) == 3
  for a, b in zip(before, params_of(fresh)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_sharded_warm_start_matches_unsharded(tok, task, tmp_path, devices):
  kw = dict(steps=3, batch_size=8, learning_rate=3e-3, seed=0)
  ref = warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, task,
                             cache_dir=str(tmp_path / "a"), **kw)
  mesh = make_mesh(2, 2, 2)
  model = create_model(TINY, mesh, LEARNER_RULES, seed=0)
  spec = model.layers[0].mlp.gate[...].sharding.spec
  out = warmstart.warm_start(model, tok, task, cache_dir=str(tmp_path / "b"), mesh=mesh, **kw)
  assert out.layers[0].mlp.gate[...].sharding.spec == spec
  for a, b in zip(params_of(ref), params_of(out)):
    np.testing.assert_allclose(a, b, atol=2e-5)


def accuracy(model, tok, task, problems, *, greedy: bool, samples: int = 1) -> float:
  sampler = Sampler(model, pad_id=tok.pad_id, vocab_limit=tok.vocab_size)
  prompts = [tok.encode(task.format_prompt(p), add_bos=True) for p in problems]
  rows = [ids for ids in prompts for _ in range(samples)]
  out = sampler(nnx.state(model), left_pad(rows, tok.pad_id), jax.random.key(0),
                stop_ids=tok.stop_ids,
                sampling=SamplingParams(max_new_tokens=24, temperature=1.0, greedy=greedy))
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  texts = [tok.decode(tokens[i, :lengths[i]].tolist()) for i in range(len(rows))]
  scores = task.score_many([p for p in problems for _ in range(samples)], texts)
  return float(np.mean([s["correct"] for s in scores]))


@pytest.mark.slow
def test_accuracy_vs_steps(tok, task, tmp_path, counted_train):
  """Held-out accuracy after 50 and 300 steps (printed): the loss falls and the greedy
  accuracy rises above the untrained model's."""
  heldout = task.heldout_problems(50)
  untrained = Transformer(TINY, rngs=nnx.Rngs(0))
  base = accuracy(untrained, tok, task, heldout, greedy=True)
  rows = [f"untrained: greedy {base:.2f}"]
  greedies = []
  for steps in (50, 300):
    start = time.time()
    model = warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, task, steps=steps,
                                 batch_size=64, learning_rate=3e-3, seed=0,
                                 cache_dir=str(tmp_path))
    seconds = time.time() - start
    losses = counted_train[-1]
    greedy = accuracy(model, tok, task, heldout, greedy=True)
    sampled = accuracy(model, tok, task, heldout, greedy=False, samples=8)
    greedies.append(greedy)
    rows.append(f"steps {steps}: {seconds:.1f}s ({1000 * seconds / steps:.0f} ms/step incl. "
                f"compile), loss {losses[0]:.2f} -> {np.mean(losses[-10:]):.3f}, held-out "
                f"greedy {greedy:.2f}, temperature 1.0 {sampled:.3f}")
  print("\nwarm start on tiny_arithmetic, batch 64, lr 3e-3, vocab "
        f"{tok.vocab_size}:\n  " + "\n  ".join(rows))
  assert np.mean(counted_train[-1][-10:]) < np.mean(counted_train[0][-10:])
  assert greedies[-1] > base


class _TaggedTurns:
  """A stand-in multi-turn task over tiny_arithmetic: one model turn (the tagged
  answer); a turn "parses as a call" when it is a complete <answer> tag."""

  multi_turn = True

  def __init__(self, task):
    self.task = task

  def train_problems(self, n, seed):
    return self.task.train_problems(n, seed)

  def format_prompt(self, p):
    return self.task.format_prompt(p)

  def solution_segments(self, p):
    return [(p.solution, True)]

  def call_parses(self, turn):
    turn = turn.strip()
    return turn.startswith("<answer>") and turn.endswith("</answer>")


@pytest.mark.slow
def test_target_validity_stops_on_sampled_first_turns(tok, task, tmp_path, counted_train):
  kw = dict(steps=300, batch_size=32, learning_rate=3e-3, seed=0, cache_dir=str(tmp_path),
            check_every=10, check_problems=32)
  fake = _TaggedTurns(task)
  warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, fake,
                       target_validity=0.8, **kw)
  ran = len(counted_train[-1])
  (entry,) = list(tmp_path.iterdir())
  checks = checkpoint.read_model_metadata(entry)["checks"]
  assert 0 < ran < 300 and ran == 10 * len(checks), (ran, checks)
  assert checks[-1]["validity"] >= 0.8 > max(c["validity"] for c in checks[:-1])
  # Refused: a task without call_parses, both targets at once.
  with pytest.raises(ValueError, match="call_parses"):
    warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, task,
                         target_validity=0.5, **kw)
  with pytest.raises(ValueError, match="not both"):
    warmstart.warm_start(Transformer(TINY, rngs=nnx.Rngs(0)), tok, fake,
                         target_validity=0.5, target_accuracy=0.5, **kw)
