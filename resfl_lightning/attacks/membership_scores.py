"""Per-example membership scores from reference models: LiRA (Carlini et al., "Membership Inference Attacks From
First Principles", S&P 2022) and RMIA (Zarifzadeh et al., ICML 2024). Pure functions of the target model's and the
reference models' per-example confidences, and the metrics read off the scores (reference_metrics); which models
are trained, and on what, is the attack's business.

Confidence of a model on an example: the probability p it gives the example's true label (classification), or
exp(-loss) of an image under the detector's own criterion (detection). LiRA works on its logit-scaled form
phi = log(p / (1 - p)), which is close to Gaussian across models; RMIA on p itself.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from resfl_lightning.attacks.mia import tpr_at_fpr

REFERENCE_FPRS = (0.001, 0.01)  # the low-FPR regime LiRA / RMIA are judged in: attack/mia_tpr_at_fpr_{0.1,1}
EPS = 1e-12  # keeps log and division finite at p = 0 or 1
MIN_STD = 1e-6  # a reference spread of 0 (one reference, or identical ones) would make the likelihood degenerate


def logit_confidence(p: np.ndarray) -> np.ndarray:
    """phi = log(p / (1 - p)) of the true-label probabilities p, clipped away from 0 and 1."""
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def _gaussian(reference: np.ndarray, global_std: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-example mean and std over the reference models (axis 0: models, axis 1: examples); with global_std one
    std for every example (the paper's choice with few reference models)."""
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[0] < 1:
        raise ValueError(f"reference confidences: expected (models, examples), got shape {ref.shape}")
    mu = ref.mean(axis=0)
    if global_std:
        std = np.full(ref.shape[1], ref.std(ddof=1) if ref.size > 1 else 0.0)
    else:
        std = ref.std(axis=0, ddof=1) if ref.shape[0] > 1 else np.zeros(ref.shape[1])
    return mu, np.maximum(std, MIN_STD)


def lira_offline(target: np.ndarray, out_reference: np.ndarray, global_std: bool = False) -> np.ndarray:
    """Offline LiRA: the one-sided likelihood that the target's phi is above what models trained without the example
    give it, Phi((phi - mu_out) / sigma_out). Higher: more likely a member."""
    mu, std = _gaussian(logit_confidence(out_reference), global_std)
    return norm.cdf((logit_confidence(target) - mu) / std)


def lira_online(target: np.ndarray, in_reference: np.ndarray, out_reference: np.ndarray,
                global_std: bool = False) -> np.ndarray:
    """Online LiRA: the log likelihood ratio log N(phi; mu_in, sigma_in) - log N(phi; mu_out, sigma_out) of the
    target's phi under models trained with and without the example."""
    phi = logit_confidence(target)
    mu_in, std_in = _gaussian(logit_confidence(in_reference), global_std)
    mu_out, std_out = _gaussian(logit_confidence(out_reference), global_std)
    return norm.logpdf(phi, mu_in, std_in) - norm.logpdf(phi, mu_out, std_out)


def rmia_scores(target: np.ndarray, reference: np.ndarray, population_target: np.ndarray,
                population_reference: np.ndarray, gamma: float = 1.0, offline_a: float | None = None) -> np.ndarray:
    """RMIA: for each candidate x, the share of population samples z with LR(x, z) >= gamma, where
    LR(x, z) = (p(x|theta) / p(x)) / (p(z|theta) / p(z)) and p(.) is the mean probability over the reference models.
    `reference` and `population_reference` hold the reference models' probabilities (models, examples). Offline
    (references never trained on x), p(x) is the paper's linear correction ((1 + a) mean + (1 - a)) / 2 with
    `offline_a`; online (about half of the references trained on x), the plain mean."""
    def prior(ref: np.ndarray) -> np.ndarray:
        mean = np.asarray(ref, dtype=np.float64).mean(axis=0)
        return mean if offline_a is None else ((1.0 + offline_a) * mean + (1.0 - offline_a)) / 2.0

    ratio_x = np.asarray(target, dtype=np.float64) / np.maximum(prior(reference), EPS)
    ratio_z = np.asarray(population_target, dtype=np.float64) / np.maximum(prior(population_reference), EPS)
    if ratio_z.size == 0:
        raise ValueError("RMIA needs at least one population sample z")
    # LR(x, z) >= gamma  <=>  ratio_x >= gamma * ratio_z, for every pair at once
    return (ratio_x[:, None] >= gamma * ratio_z[None, :]).mean(axis=1)


def reference_metrics(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> dict[str, float]:
    """AUC and TPR at FPR 0.1 / 1 % read on the target's own ROC (no threshold is chosen elsewhere)."""
    ms, ns = np.asarray(member_scores, np.float64), np.asarray(nonmember_scores, np.float64)
    labels = np.concatenate([np.ones(ms.size), np.zeros(ns.size)])
    scores = np.concatenate([ms, ns])
    out = {"auc": float(roc_auc_score(labels, scores))}
    out.update({f"tpr_at_fpr_{t * 100:g}": tpr_at_fpr(labels, scores, t) for t in REFERENCE_FPRS})
    out.update({"n_members": float(ms.size), "n_nonmembers": float(ns.size)})
    return out
