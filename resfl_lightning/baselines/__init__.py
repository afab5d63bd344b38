"""Comparison baselines (SPEC §5) that plug into the client and the evaluation: DP-SGD, PrivFairFL-Pre/Post."""
