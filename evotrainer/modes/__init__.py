"""The run modes (`run.mode`), one module each; evotrainer/run.py dispatches to them."""
