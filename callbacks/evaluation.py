"""Evaluate the global model on the test split: at round 0, every k rounds and at the last round; and, with
`eval.final_validation`, once at the last round on the union of the clients' validation splits (val/*: what `resfl
tune` selects on, so that no choice of a setting reads the test split).

The round's one pass over the test split is kept in `latest` (a EvaluationPass) for callbacks that need its
predictions; the final validation pass in `validation`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from resfl_lightning.evaluation.evaluation_pass import EvaluationPass, run_evaluation_pass


class GlobalEvaluation:
    def __init__(self, every: int = 5, final_validation: bool = False):
        if every < 1:
            raise ValueError(f"eval.every must be >= 1, got {every}")
        self.every = every
        self.final_validation = final_validation
        self.last: dict[str, float] = {}
        self.latest: EvaluationPass | None = None
        self.validation: EvaluationPass | None = None

    def due(self, round_idx: int, rounds: int) -> bool:
        return round_idx == 0 or (round_idx + 1) % self.every == 0 or round_idx == rounds - 1

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero or not self.due(round_idx, federation.settings.rounds):
            return
        self.latest = run_evaluation_pass(model, federation.data.test_loader(), round_idx)
        self.last = {f"test/{k}": v for k, v in self.latest.metrics.items()}
        metrics.update(self.last)
        loader = getattr(federation.data, "validation_loader", None)
        if self.final_validation and round_idx == federation.settings.rounds - 1 and loader is not None:
            # A loader draws its base seed from the torch RNG: the extra pass must leave the attacks that follow
            # (and so every earlier run's numbers) unchanged.
            with torch.random.fork_rng(devices=[]):
                self.validation = run_evaluation_pass(model, loader(), round_idx)
            metrics.update({f"val/{k}": v for k, v in self.validation.metrics.items()})

    def evaluation_pass(self, round_idx: int) -> EvaluationPass | None:
        """This round's test pass, or None when the evaluation did not run this round."""
        return self.latest if self.latest is not None and self.latest.round_idx == round_idx else None

    def validation_pass(self, round_idx: int) -> EvaluationPass | None:
        """This round's validation pass (the last round only), or None."""
        return self.validation if self.validation is not None and self.validation.round_idx == round_idx else None

    def attach_decision(self, round_idx: int, decision) -> None:
        """Mark this round's pass as evaluated under `decision` (PrivFairFL-Post), so EOD uses the same rule."""
        if self.latest is not None and self.latest.round_idx == round_idx:
            self.latest = replace(self.latest, decision=decision)
