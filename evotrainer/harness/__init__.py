"""The harness: reward parts and composer, filters, diagnostics, validators (gin components)."""
