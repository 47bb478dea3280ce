"""Where a run's parts live: `local.py` (this process; more learner ranks under torchrun) and
`ray.py` (engines, learner ranks and rollout workers as actors on a Ray cluster), side by side
behind `base.Runtime`. The training loop (training/lifecycle.py) does not know which one runs."""
