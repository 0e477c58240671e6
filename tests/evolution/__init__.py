"""Evolution controller tests: host-side only, hand-computed expectations, no JAX compute."""
