"""The evolution controller's host side (DESIGN.md section 7): no JAX here.

  ledger.py        the version ledger (SQLite, WAL): versions, attempts, findings,
                   decisions, harness versions, skills used; crash- and resume-safe
  search_space.py  the action boundary: typed knobs over gin bindings, single-factor
                   Interventions that render as `--gin_bindings`
  skills.py        trigger -> intervention skills, one JSON file each, with evidence per
                   domain; seed skills in seed_skills/
"""
