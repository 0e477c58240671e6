"""In-graph sampling: prefill + `lax.while_loop` decode over a KV cache."""

from evotrainer.sampling.sampler import Sampler, SamplingParams, bucket_length, left_pad, sample
