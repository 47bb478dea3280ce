"""Rows become Tasks: one adapter per SWE dataset family (swebench.py, smith.py, r2e.py) behind
`taskdata.load.load_tasks`, the row checks they share (rows.py), swesmith's per-repository test
commands (smith_profiles.py), math datasets (math.py) and the built-in SWE suite (builtin/).
`python -m taskdata --dataset NAME|FILE --check` checks a dataset before training on it."""
