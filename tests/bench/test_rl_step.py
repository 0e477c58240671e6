"""Our side of bench/rl_step.py at a tiny size, in-process (no peer environments)."""

import numpy as np
import pytest

from bench import rl_step

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return rl_step.build_checkpoint(str(tmp_path_factory.mktemp("rl_step") / "qwen3"), **TINY)


def test_checkpoint_tokenizer_round_trips_ids(ckpt):
  import transformers
  tok = transformers.AutoTokenizer.from_pretrained(ckpt)
  ids = [0, 1, 7, 511, 64]
  assert tok(" ".join(map(str, ids)))["input_ids"] == ids
  # Pad and EOS lie past the model's vocabulary: the model can never sample them.
  assert tok.pad_token_id == 512 and tok.eos_token_id == 513


@pytest.mark.slow
def test_ours_grpo_step(ckpt):
  groups, group_size, prompt_len, new_tokens = 2, 4, 16, 64
  grpo = rl_step.OursGRPO(ckpt, groups, group_size, new_tokens=new_tokens, micro_batch_size=4)
  prompts = rl_step.make_prompts(2, groups, prompt_len=prompt_len, vocab=512)
  rows = groups * group_size
  for i in range(2):
    rec = grpo.step(prompts[i])
    completions = rec["completions"]
    # Exactly new_tokens per row: no stop ids, no early stop.
    assert completions.shape == (rows, new_tokens)
    assert rec["completion_tokens"] == rows * new_tokens
    assert rec["prompt_tokens"] == rows * prompt_len
    assert completions.min() >= 0 and completions.max() < 512
    # Reward: the share of even ids, computed independently.
    expected = np.array([np.mean([t % 2 == 0 for t in row]) for row in completions])
    np.testing.assert_allclose(rec["rewards"], expected, rtol=0, atol=1e-7)
    # GRPO advantages: zero mean within each group of samples of one prompt.
    adv = rec["advantages"].reshape(groups, group_size)
    np.testing.assert_allclose(adv.mean(-1), 0.0, atol=1e-5)
    assert set(rec["phase_s"]) == {"rollout", "reference", "update"}
    assert np.isfinite(rec["loss"]) and np.isfinite(rec["kl"])
  # One optimizer update per step; after the first the policy has left the reference.
  assert int(grpo.state.step) == 2
  assert rec["kl"] > 0
