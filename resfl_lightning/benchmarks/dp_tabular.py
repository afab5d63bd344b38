"""`resfl bench`, tabular DP part: FedAvg-DP's local step on Adult's MLP (TabularNet 105-256-128-64-2 with GroupNorm,
batch 256, the dataset recipe's), without DP-SGD, with opacus' own per-sample gradient storage, with the storage that
skips its zero-filled copy (privacy/grad_sample_store.py), and with book-keeping clipping (privacy/bookkeeping.py, the
default). DP-SGD runs were three quarters of an Adult tune's CPU time.
"""

from __future__ import annotations

import statistics

import torch
from rich.table import Table

import resfl_lightning.env  # noqa: F401
from resfl_lightning.benchmarks.steps import timed_steps
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.privacy import grad_sample_store
from resfl_lightning.privacy.dp import ClientDP, DPSettings, prepare_model  # installs the storage before any variant

ROWS = {"none": "MLP, no DP-SGD", "opacus": "MLP DP-SGD, opacus' per-sample gradient storage",
        "per_sample": "MLP DP-SGD, per-sample gradients, zero-filled copy skipped",
        "bookkeeping": "MLP DP-SGD, book-keeping clipping (the default)"}
ADULT_FEATURES, ADULT_GROUPS, ADULT_BATCH = 105, 5, 256  # Adult's one-hot width, race groups, conf/dataset/adult.yaml


def _client(dp: bool, clipping: str = "bookkeeping") -> TabularClient:
    torch.manual_seed(0)
    client = TabularClient(ADULT_FEATURES, ADULT_GROUPS, LossWeights(lambda_priv=0.0, lambda_fair=0.0),
                           UfmSettings(gate=None), OptimSettings(lr=0.01))
    client.model = prepare_model(client.model)
    if dp:
        client_dp = ClientDP(DPSettings(target_epsilon=None, noise_multiplier=1.0, clipping=clipping), client.model)
        client_dp.q = 0.04  # the accountant's sample rate (its bookkeeping only)
        client.add_plugin(client_dp)
    client.train()
    return client


def step_times(variant: str, steps: int, batch_size: int = ADULT_BATCH) -> list[float]:
    """Seconds per local step (forward, backward, optimizer step) after two warm-up steps; variant "none" (the GroupNorm
    model without DP-SGD), "opacus" (opacus' storage), "per_sample" or "bookkeeping"."""
    gen = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(batch_size, ADULT_FEATURES, generator=gen),
             "y": torch.randint(0, 2, (batch_size,), generator=gen),
             "groups": torch.randint(0, ADULT_GROUPS, (batch_size,), generator=gen)}
    if variant == "opacus":
        grad_sample_store.uninstall()
    try:
        client = _client(dp=variant != "none", clipping="bookkeeping" if variant == "bookkeeping" else "per_sample")
        opt = client.configure_optimizers()
        if variant != "none":
            opt.noise_multiplier, opt.expected_batch_size = 1.0, batch_size
        return timed_steps(client, opt, batch, steps)[0]
    finally:
        grad_sample_store.install()


def table(steps: int, batch_size: int = ADULT_BATCH) -> Table:
    """Median seconds per step of each variant, against no DP-SGD and against opacus' storage (measured in one run)."""
    out = Table(title=f"DP-SGD step, Adult MLP (TabularNet, GroupNorm), batch {batch_size}, 1 thread")
    for col in ("variant", "median s/step", "ratio vs no DP", "ratio vs opacus storage"):
        out.add_column(col, justify="right" if col != "variant" else "left")
    med = {v: statistics.median(step_times(v, steps, batch_size)) for v in ROWS}
    for v, name in ROWS.items():
        out.add_row(name, f"{med[v]:.4f}", f"{med[v] / med['none']:.1f}x", f"{med[v] / med['opacus']:.2f}x")
    return out
