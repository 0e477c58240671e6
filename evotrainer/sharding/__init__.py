"""Logical axis names → mesh axes (rules.py) and mesh / multi-host set-up (mesh.py)."""
