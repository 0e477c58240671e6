"""TRL GRPO steps on the benchmark checkpoint (run in the TRL virtual environment).

  python bench/peers/trl_grpo.py --ckpt DIR --prompts prompts.npy --group_size 4 [--gated]
  python bench/peers/trl_grpo.py --ckpt DIR --gguf_file F.gguf --prompts texts.json \
      --group_size 8 --kl_coef 0 --exact_new_tokens      # bench/perf_real.py

`GRPOTrainer` (trl 1.16.0 for bench/rl_step.py, 1.13.0 for bench/perf_real.py; torch
CPU, no vLLM): the policy is loaded from the checkpoint directory (or the GGUF file in
it) in float32 and the reference is a second copy (beta = KL coef; none at 0). One
generation per optimizer step (per-device batch = all rows, one gradient-accumulation
step, steps_per_generation 1, num_iterations 1; with `--micro_batch M`, per-device batch
M, rows / M accumulation steps and as many steps per generation: one generation of all
rows, then rows / M micro-batches summed into the one update), prompts in dataset order
(no shuffle), temperature 1, top_p 1, top_k off, max_completion_length new tokens; the
tokenizer's EOS is out of the model's vocabulary, so every row generates all of them
(with a real tokenizer, `--exact_new_tokens` suppresses EOS until then).
Loss "dapo" (token mean over the batch, as ours), adamw_torch, constant lr, no weight
decay, clip-by-global-norm 1.0.

Phase split (measured by wrapping the trainer's methods): rollout = `_generate`
(tokenization + `generate` + decoding); reference = `_get_per_token_logps_and_entropies`
called with the reference model; update = from the end of `_prepare_inputs` (generation,
scoring and reference done) to the end of the optimizer step (with micro-batches, from
the end of each call to the next one's start, and from the last one's end to the end of
the optimizer step): the policy's forward, backward and the adamw update. The rest of
`_prepare_inputs` (reward, advantages, metrics) is `other`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import protocol  # noqa: E402  (first: it redirects framework prints to stderr)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def main():
  args = protocol.parse_args(__doc__.split("\n\n")[0])
  per_step = protocol.load_prompt_texts(args.prompts)  # [steps][G]
  steps, rows = len(per_step), len(per_step[0]) * args.group_size
  micro = args.micro_batch or rows
  if micro < 1 or rows % micro:
    raise SystemExit(f"--micro_batch {args.micro_batch}: must divide the {rows} rows a step")
  torch.manual_seed(0)
  dataset = Dataset.from_dict({"prompt": [t for texts in per_step for t in texts]})
  gguf = {"gguf_file": args.gguf_file} if args.gguf_file else {}
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.ckpt, **gguf)
  model = args.ckpt if not gguf else transformers.AutoModelForCausalLM.from_pretrained(
      args.ckpt, dtype=torch.float32, local_files_only=True, **gguf)
  if gguf:
    # transformers dequantizes the file into float32 tensors but still marks the model
    # quantized, and the Trainer refuses to train a quantized model.
    if getattr(model, "hf_quantizer", None) is not None:
      model.hf_quantizer.remove_quantization_config(model)
    model.is_quantized = False
    assert all(p.dtype == torch.float32 for p in model.parameters())
  exact = {"min_new_tokens": args.new_tokens} if args.exact_new_tokens else None
  workdir = args.workdir or tempfile.mkdtemp(prefix="trl_grpo_")
  config = GRPOConfig(
      output_dir=workdir, per_device_train_batch_size=micro,
      gradient_accumulation_steps=rows // micro, num_generations=args.group_size,
      steps_per_generation=rows // micro, num_iterations=1,
      max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
      beta=args.kl_coef, epsilon=0.2, epsilon_high=args.epsilon_high, loss_type="dapo",
      learning_rate=args.learning_rate,
      lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
      optim="adamw_torch", max_steps=steps, logging_steps=1, report_to="none",
      save_strategy="no", use_cpu=True, bf16=False, fp16=False, shuffle_dataset=False,
      seed=0, dataloader_num_workers=0, log_completions=False, disable_tqdm=True,
      generation_kwargs=exact,
      model_init_kwargs=None if gguf else {"dtype": torch.float32})

  clock = protocol.StepClock(args.gated, steps)
  prepare_end = [None]  # the end of the step's last `_prepare_inputs` call

  def reward(prompts, completions, completion_ids, **kw):
    ids = [np.asarray(c) for c in completion_ids]
    clock.extra["completion_tokens"] = int(sum(len(c) for c in ids))
    rewards = [float(np.mean(c % 2 == 0)) for c in ids]
    clock.extra["reward_mean"] = float(np.mean(rewards))
    return rewards

  class Gate(transformers.TrainerCallback):

    def on_step_begin(self, args_, state, control, **kw):
      clock.gate()
      prepare_end[0] = None

    def on_step_end(self, args_, state, control, **kw):
      clock.add("update", time.perf_counter() - prepare_end[0])

  trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                        train_dataset=dataset, processing_class=tokenizer, callbacks=[Gate()])
  trainer._generate = clock.timed("rollout", trainer._generate)
  logps = trainer._get_per_token_logps_and_entropies

  def timed_logps(model, *a, **kw):
    if model is trainer.ref_model:
      return clock.timed("reference", logps)(model, *a, **kw)
    return logps(model, *a, **kw)

  trainer._get_per_token_logps_and_entropies = timed_logps
  prepare = trainer._prepare_inputs

  def timed_prepare(*a, **kw):
    # One call per micro-batch: the time since the previous call's end was training.
    if prepare_end[0] is not None:
      clock.add("update", time.perf_counter() - prepare_end[0])
    out = prepare(*a, **kw)
    prepare_end[0] = time.perf_counter()
    clock.extra["prompt_tokens"] = (clock.extra.get("prompt_tokens", 0)
                                    + int(out["prompt_mask"].sum()))
    return out

  trainer._prepare_inputs = timed_prepare
  trainer.train()
  clock.close()
  protocol.emit(event="done")


if __name__ == "__main__":
  main()
