"""Evaluation protocols that run a trained model over prepared data (e.g. the 13-condition weather sweep)."""
