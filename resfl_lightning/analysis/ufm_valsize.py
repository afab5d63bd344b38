"""How many validation images per client UFM needs to rank clients by more than noise (`resfl ufm-valsize RUN_DIR`).

Eval only: the run's exported global model (RUN_DIR/export/global.pt) is evaluated on a larger validation split of
the same dataset and scenario (its config.yaml with dataset.num_images / val_fraction raised), and for each size n
the clients' bootstrap SE of UFM on n of their validation images is set against the spread (std, ddof=0, as in
`make table`'s mechanism section) of UFM across clients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from resfl_lightning.metrics.ufm import ufm_bootstrap_se, ufm_from_units

Units = Sequence[Mapping[int, float]]


def se_and_spread_by_size(units: Mapping[int, Units], sizes: Sequence[int], draws: int = 10, resamples: int = 100,
                          seed: int = 0, evidence_floor: float = 1e-3, eps: float = 1e-6) -> list[dict]:
    """Per size n (at most the smallest client's unit count): over `draws` random n-subsets of every client's units,
    the mean of the clients' median bootstrap SE of UFM and the mean spread (std across clients) of UFM."""
    rng = np.random.default_rng(seed)
    smallest = min((len(v) for v in units.values()), default=0)
    rows = []
    for n in sizes:
        if n > smallest:
            continue
        ses, spreads = [], []
        for d in range(draws):
            values, se = [], []
            for client_units in units.values():
                pick = [client_units[i] for i in rng.choice(len(client_units), n, replace=False)]
                values.append(ufm_from_units(pick, evidence_floor, eps).ufm)
                se.append(ufm_bootstrap_se(pick, resamples=resamples, seed=seed + d, evidence_floor=evidence_floor,
                                           eps=eps))
            ses.append(float(np.nanmedian(se)))
            spreads.append(float(np.std(values)))
        se_mean, spread_mean = float(np.mean(ses)), float(np.mean(spreads))
        rows.append({"n": int(n), "se": se_mean, "spread": spread_mean,
                     "se_over_spread": se_mean / spread_mean if spread_mean > 0 else math.nan})
    return rows


def client_units(run_dir: Path, images: int, val_fraction: float):
    """Per client: the per-image group evidence of the run's global model on an enlarged validation split."""
    from resfl_lightning.env import configure_environment

    configure_environment(1)
    import torch
    from omegaconf import OmegaConf

    from resfl_lightning.builders import build_client
    from resfl_lightning.data.federated import build_federated_data
    from resfl_lightning.models.export import load_evidential

    cfg = OmegaConf.load(run_dir / "config.yaml")
    if cfg.dataset.task != "detection":
        raise ValueError(f"{run_dir}/config.yaml: dataset {cfg.dataset.name} is not a detection dataset")
    cfg.dataset.num_images, cfg.dataset.val_fraction = images, val_fraction
    data = build_federated_data(cfg.dataset, seed=cfg.seed, printer=lambda *_: None)
    client = build_client(cfg, data)
    model, _ = load_evidential(run_dir / "export" / "global.pt")
    client.model.load_state_dict(model.state_dict())
    client.eval()
    out = {}
    with torch.no_grad():
        for c in range(data.num_clients):
            preds, gts, _ = client.collect(data.val_loader(c))
            out[c] = [u for u in (client.ufm_units(preds, gts) or []) if u]
    return out, client.ufm


def valsize_report(run_dir: Path, images: int, val_fraction: float, sizes: Sequence[int], draws: int) -> dict:
    """The run's clients' validation image counts, their UFM on all those images, and se_and_spread_by_size."""
    units, ufm = client_units(run_dir, images, val_fraction)
    full = {c: ufm_from_units(v, ufm.evidence_floor, ufm.eps).ufm if v else math.nan for c, v in units.items()}
    rows = se_and_spread_by_size(units, sizes, draws=draws, evidence_floor=ufm.evidence_floor, eps=ufm.eps)
    return {"run": str(run_dir), "val_images": {c: len(v) for c, v in units.items()}, "ufm_all_images": full,
            "by_size": rows}
