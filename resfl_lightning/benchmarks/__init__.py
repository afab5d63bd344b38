"""What `resfl bench` measures: step times (steps.py), a federated round against a plain loop (round.py), virtual
client scale (scale.py)."""
