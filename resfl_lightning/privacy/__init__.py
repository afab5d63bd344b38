"""Differential privacy for client training (opacus)."""
