"""Tunix GRPO steps on the benchmark checkpoint (run in the Tunix virtual environment).

  python bench/peers/tunix_grpo.py --ckpt DIR --prompts prompts.npy --group_size 4 [--gated]

`GRPOLearner` (google-tunix 0.1.7) over an `RLCluster` with actor, reference and
rollout colocated on one single-device mesh and the vanilla rollout engine: KV cache of
exactly prompt + new tokens slots, temperature 1, top_p 1, no top_k, EOS = the
tokenizer's out-of-vocabulary </s> (so every row generates all new tokens); the tokenizer's
pad id is also out of the model's vocabulary, so no sampled token is masked as padding. One
optimizer update per batch (mini batch = the whole batch, no micro-batching), adamw with
clip-by-global-norm 1.0 as in ours, beta = KL coef, token-mean loss aggregation.

Phase split (measured by wrapping the cluster's methods, each blocked until its result
is ready): rollout = `RLCluster.generate`; reference = `RLCluster.get_ref_per_token_logps`;
update = `RLCluster.update_actor` (blocked on the new parameters); the rest of a step
(reward, advantages, host-side padding, metrics) is `other`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import protocol  # noqa: E402  (first: it redirects framework prints to stderr)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import transformers  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.models.qwen3 import model as qwen3_lib  # noqa: E402
from tunix.models.qwen3 import params as qwen3_params  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402


def main():
  args = protocol.parse_args(__doc__.split("\n\n")[0])
  if args.micro_batch:
    raise SystemExit("--micro_batch: this driver trains each group as one batch")
  prompts = np.load(args.prompts)  # [steps, G, P]
  steps, g, p = prompts.shape
  hf = __import__("json").load(open(os.path.join(args.ckpt, "config.json")))
  theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta"))
  config = qwen3_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"], rope_theta=int(theta),
      norm_eps=hf["rms_norm_eps"], use_tied_embedding=hf["tie_word_embeddings"])
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  actor = qwen3_params.create_model_from_safe_tensors(args.ckpt, config, mesh)
  reference = qwen3_params.create_model_from_safe_tensors(args.ckpt, config, mesh)
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.ckpt)
  # Tunix repeats the prompt list with numpy (np.str_ items), which this transformers
  # release refuses to encode: hand it plain str.
  encode = tokenizer.encode
  tokenizer.encode = lambda text, **kw: encode(str(text), **kw)

  optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(args.learning_rate, b1=0.9, b2=0.999, weight_decay=0.0))
  cluster_config = rl_cluster_lib.ClusterConfig(
      role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                    rl_cluster_lib.Role.ROLLOUT: mesh},
      rollout_engine="vanilla",
      offload_to_cpu=False,
      training_config=rl_cluster_lib.RLTrainingConfig(
          actor_optimizer=optimizer, eval_every_n_steps=10**9, max_steps=steps,
          mini_batch_size=g, train_micro_batch_size=g,
          checkpoint_root_directory=None, pbar_description=None),
      rollout_config=base_rollout.RolloutConfig(
          max_tokens_to_generate=args.new_tokens, max_prompt_length=p,
          kv_cache_size=p + args.new_tokens, temperature=1.0, top_p=1.0, top_k=None,
          eos_tokens=[tokenizer.eos_token_id]))
  cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference, tokenizer=tokenizer,
                                     cluster_config=cluster_config)

  clock = protocol.StepClock(args.gated, steps)
  block = lambda x: jax.block_until_ready(x)
  generate = cluster.generate

  def timed_generate(*a, **kw):
    out = clock.timed("rollout", generate, lambda o: None)(*a, **kw)
    lengths = [len(t) for t in out.tokens]
    clock.extra["completion_tokens"] = int(sum(lengths))
    clock.extra["prompt_tokens"] = int(np.sum(out.left_padded_prompt_tokens
                                              != tokenizer.pad_token_id))
    return out

  cluster.generate = timed_generate
  cluster.get_ref_per_token_logps = clock.timed(
      "reference", cluster.get_ref_per_token_logps, block)
  update_actor = cluster.update_actor

  def timed_update(*a, **kw):
    out = update_actor(*a, **kw)
    block(nnx.state(cluster.actor_trainer.model))
    return out

  cluster.update_actor = clock.timed("update", timed_update)

  def reward(prompts, completions, **kw):
    rewards = [protocol.even_share_of_text(c) for c in completions]
    clock.extra["reward_mean"] = float(np.mean(rewards))
    return rewards

  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster,
      algo_config=grpo_learner.GRPOConfig(
          num_generations=args.group_size, num_iterations=1, beta=args.kl_coef,
          epsilon=0.2, loss_agg_mode="token-mean"),
      reward_fns=[reward])

  def dataset():
    for i in range(steps):
      clock.gate()
      yield {"prompts": np.array(protocol.prompt_texts(prompts[i]))}

  learner.train(dataset())
  clock.close()
  protocol.emit(event="done")


if __name__ == "__main__":
  main()
