"""The scores that combine the attacks' metrics and the global evaluation's (docs/method.md §6): the Privacy Score and
the Fairness Score of every round that computed their inputs. The attack registry (registry.py) installs the callback
after every attack."""

from __future__ import annotations

import math

from resfl_lightning.metrics.fairness import fairness_score, privacy_score
from resfl_lightning.values import finite


class AttackScores:
    """score/privacy = (MIA SR + AIA SR)/2 and score/fairness = (|1-DI| + Delta-EOP)/2 in every round that computed
    their inputs: NaN when an input is undefined there (a final |1-DI| of n/a gives a final Fairness Score of n/a).

    Both SRs are balanced accuracies (RESFL A.4.1). AIA SR is the representation AIA's, or the update-aware AIA's
    when only that one ran (and applies: under IID shards it is NaN, and there is no score).
    """

    def on_round_end(self, federation, metrics: dict) -> None:
        if not federation.fabric.is_global_zero:
            return
        mia = metrics.get("attack/mia_success_rate")
        # the representation AIA's SR, else the update-aware AIA's
        aia = next((metrics[k] for k in ("attack/aia_success_rate", "attack/update_aia_success_rate") if k in metrics),
                   None)
        # Written (NaN when undefined) whenever their inputs were computed this round, so the run's summary never
        # keeps the score of an earlier round for a final model whose score is undefined (callbacks/run_files.py).
        if mia is not None or aia is not None:
            usable = finite(mia) is not None and finite(aia) is not None
            metrics["score/privacy"] = privacy_score(mia, aia) if usable else math.nan
        di, eop = metrics.get("test/abs_one_minus_di"), metrics.get("test/delta_eop")
        if di is not None or eop is not None:
            usable = finite(di) is not None and finite(eop) is not None
            metrics["score/fairness"] = (fairness_score(1.0 - float(di), float(eop)) if usable
                                         else math.nan)
