"""Evaluate the global model on the test split: at round 0, every k rounds and at the last round.

The round's one pass over the test split is kept in `latest` (a EvaluationPass) for callbacks that need its predictions.
"""

from __future__ import annotations

from dataclasses import replace

from resfl_lightning.evaluation.evaluation_pass import EvaluationPass, run_evaluation_pass


class GlobalEvaluation:
    def __init__(self, every: int = 5):
        if every < 1:
            raise ValueError(f"eval.every must be >= 1, got {every}")
        self.every = every
        self.last: dict[str, float] = {}
        self.latest: EvaluationPass | None = None

    def due(self, round_idx: int, rounds: int) -> bool:
        return round_idx == 0 or (round_idx + 1) % self.every == 0 or round_idx == rounds - 1

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero or not self.due(round_idx, federation.settings.rounds):
            return
        self.latest = run_evaluation_pass(model, federation.data.test_loader(), round_idx)
        self.last = {f"test/{k}": v for k, v in self.latest.metrics.items()}
        metrics.update(self.last)

    def evaluation_pass(self, round_idx: int) -> EvaluationPass | None:
        """This round's test pass, or None when the evaluation did not run this round."""
        return self.latest if self.latest is not None and self.latest.round_idx == round_idx else None

    def attach_decision(self, round_idx: int, decision) -> None:
        """Mark this round's pass as evaluated under `decision` (PrivFairFL-Post), so EOD uses the same rule."""
        if self.latest is not None and self.latest.round_idx == round_idx:
            self.latest = replace(self.latest, decision=decision)
