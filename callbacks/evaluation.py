"""Evaluate the global model on the test split: at round 0, every k rounds and at the last round; and, with
`eval.final_validation`, once at the last round on the union of the clients' validation splits (val/*: what `resfl
tune` selects on, so that no choice of a setting reads the test split).

The round's one pass over the test split is kept in `latest` (a EvaluationPass) for callbacks that need its
predictions; the final validation pass in `validation`. With `metrics.min_group_size` > 1 a group with fewer units on
the evaluated split is left out of that split's group metrics: said once when first seen, and named in the summary
(`groups_excluded`, callbacks/run_files.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from resfl_lightning.clients.identity import as_server
from resfl_lightning.data.federated import base_data
from resfl_lightning.evaluation.evaluation_pass import EvaluationPass, run_evaluation_pass


def group_names(data) -> tuple[str, ...]:
    """The data's group names in id order ((): it numbers its groups only)."""
    return tuple(getattr(base_data(data), "group_names", ()) or ())


def name_of(group: int, names: tuple[str, ...]) -> str:
    return names[group] if group < len(names) else str(group)


def excluded_text(excluded: dict[int, int], names: tuple[str, ...]) -> str:
    return ", ".join(f"{name_of(g, names)} ({n})" for g, n in sorted(excluded.items()))


class GlobalEvaluation:
    def __init__(self, every: int = 5, final_validation: bool = False, min_group_size: int = 1):
        if every < 1:
            raise ValueError(f"eval.every must be >= 1, got {every}")
        self.every = every
        self.final_validation = final_validation
        self.min_group_size = int(min_group_size)
        self.announced: set[str] = set()
        self.last: dict[str, float] = {}
        self.latest: EvaluationPass | None = None
        self.validation: EvaluationPass | None = None

    def due(self, round_idx: int, rounds: int) -> bool:
        return round_idx == 0 or (round_idx + 1) % self.every == 0 or round_idx == rounds - 1

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero or not self.due(round_idx, federation.settings.rounds):
            return
        with as_server(model, round_idx):  # the global model: not the client this rank trained last
            self.latest = run_evaluation_pass(model, federation.data.test_loader(), round_idx, self.min_group_size)
        self._announce(federation, "test", self.latest)
        self.last = {f"test/{k}": v for k, v in self.latest.metrics.items()}
        metrics.update(self.last)
        loader = getattr(federation.data, "validation_loader", None)
        if self.final_validation and round_idx == federation.settings.rounds - 1 and loader is not None:
            # A loader draws its base seed from the torch RNG: the extra pass must leave the attacks that follow
            # (and so every earlier run's numbers) unchanged.
            with torch.random.fork_rng(devices=[]), as_server(model, round_idx):
                self.validation = run_evaluation_pass(model, loader(), round_idx, self.min_group_size)
            self._announce(federation, "val", self.validation)
            metrics.update({f"val/{k}": v for k, v in self.validation.metrics.items()})

    def _announce(self, federation, split: str, evaluation: EvaluationPass) -> None:
        if evaluation.groups_excluded and split not in self.announced:
            self.announced.add(split)
            print(f"metrics.min_group_size={self.min_group_size}: left out of the {split} group metrics: "
                  f"{excluded_text(evaluation.groups_excluded, group_names(federation.data))}", flush=True)

    def groups_excluded(self, names: tuple[str, ...]) -> dict[str, dict[str, int]]:
        """{"test/groups_excluded": {group name: its units}, "val/..." when validated} of the latest passes; {} when
        metrics.min_group_size keeps every group (the summary then says nothing of it, as before the key existed)."""
        if self.min_group_size <= 1:
            return {}
        passes = (("test", self.latest), ("val", self.validation))
        return {f"{split}/groups_excluded": {name_of(g, names): n for g, n in sorted(p.groups_excluded.items())}
                for split, p in passes if p is not None}

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
