"""The evolution controller's host side (docs/design.md#the-evolution-controller): no JAX here.

  ledger/               the version ledger (SQLite, WAL): versions, attempts, findings,
                        decisions, harness versions, skills used; crash- and resume-safe
                        (core.py); its SQL schema and typed records (records.py), its
                        lineage as a text table (table.py), a workdir's ledger, local or
                        gs:// (mirror.py)
  search_space.py       the action boundary: the knobs the controller may turn
  knobs.py              typed knobs over gin bindings (float, int, choice, list, dict)
  intervention.py       single-factor Interventions that render as `--gin_bindings`
  skills.py             trigger -> intervention skills, one JSON file each, with evidence
                        per domain; seed skills in seed_skills/
  controller.py         the loop over versions (plan, train, verify, learn), composed of
                        the parts below, each with its knobs in a gin-configurable config
  results.py            its ledger I/O of trained versions (results, values, evidence)
  proposal.py           its plan step: diagnose, propose, backtest, rank
  promotion.py          its verify step: verdicts and promotion
  learning.py           its learn step: learned skills
  escalation.py         its escalation after repeated rejections
  harness_evolution.py  its active diagnostics / validators, and how they evolve
  gates.py              its human gates
  backtest.py           replays of harness-side changes on cached rollouts
"""
