"""The learner: pure advantage and loss math, and the jitted step that uses it.

`advantages` turns rewards into advantages (GRPO, Dr. GRPO, RLOO, GAE, whitening);
`losses` turns log-probs and advantages into a scalar loss plus metrics (PPO clipped
surrogate with clip-higher and dual clip, GSPO, KL to a reference, entropy, value loss).
Every hyper-parameter a controller may mutate enters these functions as an array, so
changing it never recompiles the train step. `step` wires them to the model: the
teacher-forced `completion_logprobs` and the `Learner` with its explicit `TrainState`.
"""

from evotrainer.learner.step import Learner, StepHParams, TrainState, completion_logprobs
