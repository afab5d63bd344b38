"""Evaluate the global model on the test split: at round 0, every k rounds and at the last round."""

from __future__ import annotations


class GlobalEvaluation:
    def __init__(self, every: int = 5):
        if every < 1:
            raise ValueError(f"eval.every must be >= 1, got {every}")
        self.every = every
        self.last: dict[str, float] = {}

    def due(self, round_idx: int, rounds: int) -> bool:
        return round_idx == 0 or (round_idx + 1) % self.every == 0 or round_idx == rounds - 1

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero or not self.due(round_idx, federation.settings.rounds):
            return
        results = model.test_metrics(federation.data.test_loader())
        self.last = {f"test/{k}": v for k, v in results.items()}
        metrics.update(self.last)
