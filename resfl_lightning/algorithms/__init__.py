"""Federated methods as config classes: conf/algorithm/<method>.yaml names one of them in `_target_` (base.py)."""
