"""attack.mia.method = lira | rmia (docs/method.md §7): per-example membership scores of the global model against
reference models (attacks/references.py), scored on the target's members and held-back non-members.

Confidence of a model on an example: exp(-its per-example loss), the loss the MIA's shadow features use (detection:
the image's full task loss under the detector's criterion; classification: the row's Dirichlet NLL, so exp(-loss) is
the probability of the true label). LiRA (offline): Phi((phi - mu_out) / sigma_out) with one sigma over every
example and reference (few references). RMIA: the share of population samples z (the pool) that x dominates, with
each z's p(z) taken over the references that did not train on it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from resfl_lightning.attacks.client_audit import member_clients, per_client_metrics, worst_client
from resfl_lightning.attacks.membership_scores import lira_offline, reference_metrics, rmia_scores
from resfl_lightning.attacks.outputs import example_confidences
from resfl_lightning.attacks.references import out_references

CLIENT_KEYS = ("auc", "tpr_at_fpr_0.1", "tpr_at_fpr_1")  # attack/mia_worst_client_<key>


def membership_scores(method: str, target: np.ndarray, reference: np.ndarray, population_target: np.ndarray | None,
                      population_reference: np.ndarray | None, gamma: float = 1.0,
                      offline_a: float = 1.0) -> np.ndarray:
    """Per-candidate scores (higher: more likely a member) from OUT reference confidences (K_out, n)."""
    if method == "lira":
        return lira_offline(target, reference, global_std=True)
    if method == "rmia":
        return rmia_scores(target, reference, population_target, population_reference, gamma=gamma,
                           offline_a=offline_a)
    raise ValueError(f"reference membership scores: method must be lira or rmia, got {method!r}")


def client_leakage(plan: Any, federation: Any, member_scores: np.ndarray,
                   nonmember_scores: np.ndarray) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
    """attack.mia.per_client: each client's members (plan.members grouped by owner) against every non-member, and
    the worst client's attack/mia_worst_client* metrics."""
    from resfl_lightning.data.federated import base_data

    train = [c.train for c in base_data(federation.data).splits.clients]
    clients = per_client_metrics(member_scores, member_clients(plan.members, train), nonmember_scores, len(train))
    worst = worst_client(clients)
    if worst is None:
        return clients, {}
    return clients, {"attack/mia_worst_client": float(worst[0]),
                     **{f"attack/mia_worst_client_{k}": float(worst[1][k]) for k in CLIENT_KEYS}}


def reference_membership_inference(plan: Any, federation: Any, model: Any, round_idx: int, loader_for: Any,
                                   method: str) -> tuple[dict[str, float], dict[str, Any]]:
    """attack/mia_* metrics of the global model after round `round_idx` under `method` (lira / rmia), and the attack
    file's details."""
    t0 = time.perf_counter()
    mia, refs, fabric = plan.mia, plan.references, federation.fabric
    models = refs.advance(round_idx + 1)

    def confidences(items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(target's confidences (n,), OUT references' (K_out, n)) on items."""
        def conf(client: Any) -> np.ndarray:
            return example_confidences(client, loader_for(items), fabric, mia.score_threshold)
        return conf(model), out_references(np.stack([conf(m) for m in models]), refs.trained_mask(items))

    candidates = np.concatenate([plan.members, plan.split.target_nonmembers])
    target, reference = confidences(candidates)
    pop_target, pop_reference = confidences(refs.pool) if method == "rmia" else (None, None)
    scores = membership_scores(method, target, reference, pop_target, pop_reference, mia.rmia_gamma,
                               mia.rmia_offline_a)
    n = len(plan.members)
    members, nonmembers = scores[:n], scores[n:]
    result = reference_metrics(members, nonmembers)
    clients, worst = client_leakage(plan, federation, members, nonmembers) if mia.per_client else (None, {})
    details = {
        "method": method, "target": result, "references": len(models), "reference_rounds": refs.rounds_done,
        "reference_train_sizes": [len(t) for t in refs.trained_on], "pool_size": len(refs.pool),
        "out_references_per_candidate": int(reference.shape[0]),
        "score_means": {"target_members": float(members.mean()), "target_nonmembers": float(nonmembers.mean())},
        "split_sizes": {"target_members": n, "target_nonmembers": len(plan.split.target_nonmembers)},
        # every candidate's score: the ROC `resfl report` draws on log-log axes (analysis/report.py::plot_mia_roc)
        "scores": {"members": members.tolist(), "nonmembers": nonmembers.tolist()},
    }
    metrics = {f"attack/mia_{k}": float(v) for k, v in result.items()}
    if clients is not None:
        details["clients"] = {str(k): v for k, v in clients.items()}
        metrics.update(worst)
    metrics["attack/mia_references"] = float(len(models))
    metrics["attack/mia_time"] = time.perf_counter() - t0
    return metrics, details
