"""Comparison baselines (docs/method.md §5) that plug into the client and the evaluation: DP-SGD, PrivFairFL."""
