"""`resfl bench curvature`: how closely each curvature estimator (algorithm.curv_direction, curv_refresh) follows the
top eigenvalue of each step's Fisher, along one training trajectory of the detector under CurvFed's loss weights.

The trajectory is driven by the default estimator (converged); at each step every estimator is also evaluated on the
same per-image losses, each keeping its own vector, and compared with a reference power iteration (warm-started from
its own last vector, run to a residual of `reference_tol`). What is read: the term each estimator optimises, v^T F v
along its vector, as a share of the reference eigenvalue (1 = the top eigenvalue). Batches cycle, so the Fisher moves
with the images as well as with the parameters."""

from __future__ import annotations

import statistics

import torch
from rich.table import Table

from resfl_lightning.benchmarks.steps import REFRESH, detector_spec, every_image_correct, synthetic_batches
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.detection import DetectionClient
from resfl_lightning.losses.curvature import FisherCurvature, fisher_power_iteration

CURVFED_WEIGHTS = LossWeights(lambda_priv=0.0, lambda_fair=0.0, lambda_task=0.08, lambda_curv=0.92)  # conf/algorithm
ESTIMATORS = {  # name -> (FisherCurvature keywords, J v products a step that computes the term)
    "converged (curv_iters=3, the default)": ({"iters": 3}, "4"),
    "converged, curv_iters=1": ({"iters": 1}, "2"),
    "held (curv_direction=held)": ({"iters": 3, "direction": "held"}, "1"),
    f"held, curv_refresh={REFRESH}": ({"iters": 3, "direction": "held", "refresh": REFRESH},
                                      f"1 on 1 step in {REFRESH}"),
}


class _Observed:
    """The client's curvature term, with every estimator and the reference evaluated beside it on each call."""

    def __init__(self, driver: FisherCurvature, reference_iters: int, reference_tol: float) -> None:
        self.driver = driver
        self.observers = {name: FisherCurvature(seed=1, **kw) for name, (kw, _) in ESTIMATORS.items()}
        self.reference_iters, self.reference_tol = reference_iters, reference_tol
        self.reference_v: list[torch.Tensor] | None = None
        self._draws = torch.Generator().manual_seed(2)  # the reference's start: the global RNG is the trajectory's
        self.shares: dict[str, list[tuple[int, float]]] = {name: [] for name in self.observers}  # (step, share)
        self.references: list[float] = []

    def due(self) -> bool:
        return self.driver.due()

    def __call__(self, per_sample: torch.Tensor, params) -> tuple[torch.Tensor, float]:
        reference, self.reference_v, _ = fisher_power_iteration(
            per_sample, params, self.reference_v, self.reference_iters, self.reference_tol, generator=self._draws)
        self.references.append(reference)
        for name, observer in self.observers.items():
            if not observer.due():
                observer(per_sample, params)  # takes the skip decision drawn above
                continue
            term, _ = observer(per_sample, params)
            if reference > 0:
                self.shares[name].append((len(self.references) - 1, term.item() / observer.refresh / reference))
        return self.driver(per_sample, params)


def tracking(scale: str, image_size: int, batch: int, steps: int, batches: int = 4, reference_iters: int = 50,
             reference_tol: float = 1e-4, observe: bool = True) -> tuple[_Observed | None, DetectionClient]:
    """Train `steps` steps (SGD, lr 0.01) cycling `batches` batches of built-in scenes; returns the observations
    (None with observe=False: the same trajectory, unobserved) and the trained client."""
    torch.manual_seed(0)
    data = synthetic_batches(image_size, batch, batches)
    client = DetectionClient(detector_spec(scale, image_size), 3, CURVFED_WEIGHTS, UfmSettings(),
                             OptimSettings(lr=0.01))
    every_image_correct(client)
    observed = _Observed(client.curvature, reference_iters, reference_tol) if observe else None
    if observed is not None:
        client.curvature = observed
    opt = client.configure_optimizers()
    for i in range(steps):
        loss = client.training_step(data[i % batches], i)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return observed, client


def table(observed: _Observed, skip: int) -> Table:
    """Per estimator: the term along its vector as a share of the reference eigenvalue, over the steps after the
    first `skip` (cold starts), with the J v products it needs."""
    refs = observed.references
    title = (f"curvature estimators along one trajectory ({len(refs)} steps, reference eigenvalue "
             f"{min(refs):.3g} to {max(refs):.3g}); v^T F v / lambda_max after step {skip}")
    out = Table(title=title)
    for col in ("estimator", "J v a step", "steps read", "mean", "median", "min"):
        out.add_column(col, justify="right" if col != "estimator" else "left")
    for name, shares in observed.shares.items():
        kept = [share for step, share in shares if step >= skip]
        cells = (f"{statistics.fmean(kept):.3f}", f"{statistics.median(kept):.3f}", f"{min(kept):.3f}") if kept \
            else ("-", "-", "-")
        out.add_row(name, ESTIMATORS[name][1], str(len(kept)), *cells)
    return out
