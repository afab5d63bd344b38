"""`resfl bench`, step part: step-time ratios of the composite losses and of DP-SGD, and the aggregation cost, each
returned as a rich Table (the round and scale parts are round.py and scale.py; resfl_lightning/cli/bench.py runs all).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings

import torch
from rich.table import Table

import resfl_lightning.env  # noqa: F401
from resfl_lightning.aggregation.streaming import StreamingWeightedSum
from resfl_lightning.benchmarks.goals import goal_verdict
from resfl_lightning.clients.base import AdversarySettings, LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.detection import DetectionClient
from resfl_lightning.data.detection import detection_collate
from resfl_lightning.data.synthetic import SyntheticSceneConfig, generate_scenes
from resfl_lightning.federation.state import FlatLayout

VARIANTS = {
    "fedavg (task only)": LossWeights(lambda_priv=0.0, lambda_fair=0.0),
    "resfl (task+adv+unc)": LossWeights(),
    "resfl + curvfed (lambda_curv=0.1)": LossWeights(lambda_curv=0.1),  # Fisher over every image: every_image_correct
}
# RESFL with phi's box features from one roi_align bin of 2 x 2 samples instead of 7 x 7 adaptive bins (opt-in:
# algorithm.adversary_roi_impl=roi_align adversary_roi_bins=1 adversary_roi_samples=2; docs/performance.md)
CHEAP_ROI = ("resfl, cheap roi_align pooling (roi_bins=1, roi_samples=2)",
             AdversarySettings(roi_impl="roi_align", roi_bins=1, roi_samples=2))
# the same box mean as the default (separable matrix products) through torchvision's roi_align, the default before
# 2026-11-29 (algorithm.adversary_roi_impl=roi_align)
ROI_ALIGN = AdversarySettings(roi_impl="roi_align")
ROI_ALIGN_ROWS = {"resfl (task+adv+unc)": "resfl, roi_align box mean (adversary_roi_impl=roi_align)",
                  "resfl + curvfed (lambda_curv=0.1)": "resfl + curvfed, roi_align box mean"}
# The curvature term on one step in REFRESH on average, weighted REFRESH (algorithm.curv_refresh; the same loss in
# expectation): its cost is a mean over steps, read over REFRESH x as many steps
REFRESH = 4
REFRESH_ROW = (f"resfl + curvfed, curv_refresh={REFRESH} (mean s/step)",
               LossWeights(lambda_curv=0.1, curv_refresh=REFRESH))
# The term along the last step's vector, moved one power step (algorithm.curv_direction=held: one J v a step), alone
# and refreshed as above
HELD_ROWS = (("resfl + curvfed, curv_direction=held", LossWeights(lambda_curv=0.1, curv_direction="held")),
             (f"resfl + curvfed, held, curv_refresh={REFRESH} (mean s/step)",
              LossWeights(lambda_curv=0.1, curv_direction="held", curv_refresh=REFRESH)))
# docs/performance.md's goals for a step's ratio to FedAvg's: the RESFL paper's < 8 % overhead for RESFL, 1.5x with
# the curvature term
STEP_GOALS = {"resfl (task+adv+unc)": 1.08, "resfl + curvfed (lambda_curv=0.1)": 1.5, REFRESH_ROW[0]: 1.5,
              **{name: 1.5 for name, _ in HELD_ROWS}}


def synthetic_batch(image_size: int, batch: int) -> dict:
    return synthetic_batches(image_size, batch, 1)[0]


def synthetic_batches(image_size: int, batch: int, count: int) -> list[dict]:
    """`count` batches of `batch` built-in scenes each (seed 123; the first batch is the same for any count)."""
    scenes = generate_scenes(SyntheticSceneConfig(image_size=image_size, grouping="mst3"), batch * count, seed=123)
    ann = scenes.annotations
    items = []
    for i in range(batch * count):
        rows = ann.rows_of(i)
        items.append({"img": torch.from_numpy(scenes.load_image(i).transpose(2, 0, 1).copy()),
                      "cls": torch.from_numpy(ann.cls[rows].astype("float32")).reshape(-1, 1),
                      "bboxes": torch.from_numpy(ann.boxes[rows]), "groups": torch.from_numpy(ann.groups[rows]),
                      "proxy": torch.from_numpy(ann.proxy[rows]), "image_id": i})
    return [detection_collate(items[k * batch:(k + 1) * batch]) for k in range(count)]


def step_times(weights: LossWeights, scale: str, image_size: int, batch: dict, steps: int,
               adversary: AdversarySettings | None = None, device: str = "cpu",
               precision: str = "32-true") -> tuple[list[float], int]:
    """Seconds of each timed step on `device` under `precision` (32-true or bf16-mixed autocast), and the host
    syncs CUDA's sync debug mode reported over the timed steps (0 off CUDA, where nothing is counted)."""
    torch.manual_seed(0)
    client = DetectionClient(detector_spec(scale, image_size), 3, weights, UfmSettings(), OptimSettings(lr=0.01),
                             adversary=adversary).to(device)
    if weights.lambda_curv > 0:
        every_image_correct(client)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return timed_steps(client, client.configure_optimizers(), batch, steps, precision=precision)


def every_image_correct(client: DetectionClient) -> None:
    """The curvature term over every image of the batch, as on a detector that finds every person: a randomly
    initialised one finds nobody, and CurvFed's Fisher (correct images only) would then cost nothing. The check
    itself still runs, so its cost is in the step."""
    check = client.correct_images

    def all_correct(out: dict, batch: dict) -> torch.Tensor:
        return torch.ones_like(check(out, batch))

    client.correct_images = all_correct


PRECISIONS = {"32-true": None, "bf16-mixed": torch.bfloat16}  # the autocast dtype of each bench precision


def timed_steps(client, opt, batch: dict, steps: int, precision: str = "32-true") -> tuple[list[float], int]:
    """Seconds of each of `steps` training steps (forward, backward, optimizer step) after two warm-up steps, and the
    number of host syncs CUDA reported during the timed steps (CUDA only; 0 elsewhere)."""
    if precision not in PRECISIONS:
        raise ValueError(f"bench precision {precision!r}: choose one of {sorted(PRECISIONS)}")
    device = next(client.parameters()).device
    cuda = device.type == "cuda"
    dtype = PRECISIONS[precision]
    times, syncs = [], 0
    for i in range(steps + 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda and i >= 2:
                torch.cuda.synchronize(device)
                torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
                loss = client.training_step(batch, i)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        if i >= 2:
            syncs += sum("synchronizing" in str(w.message).lower() for w in caught)
    return times[2:], syncs


def dp_step_times(scale: str, image_size: int, batch: dict, steps: int, dp: str | None) -> list[float]:
    """FedAvg-DP's detector step (GroupNorm model): dp None (no DP-SGD), "before" (opacus' DPOptimizer and the
    image-by-image loss loop) or "client" (ClientDPOptimizer and the batched per-image loss the simulator uses)."""
    from unittest import mock

    from opacus.optimizers import DPOptimizer

    from resfl_lightning.losses.per_image import per_image_loss_loop
    from resfl_lightning.privacy.dp import ClientDP, DPSettings, prepare_model

    torch.manual_seed(0)
    client = DetectionClient(detector_spec(scale, image_size), 3, VARIANTS["fedavg (task only)"], UfmSettings(),
                             OptimSettings(lr=0.01))
    client.model = prepare_model(client.model)
    client.criterion = type(client.criterion)(client.model)
    if dp is not None:
        client_dp = ClientDP(DPSettings(target_epsilon=None, noise_multiplier=1.0), client.model)
        client_dp.q = 0.1  # the accountant's sample rate (its bookkeeping only)
        client.add_plugin(client_dp)
    client.train()
    opt = client.configure_optimizers()
    if dp is not None:
        opt.noise_multiplier, opt.expected_batch_size = 1.0, len(batch["img"])
        if dp == "before":
            opt.__class__ = DPOptimizer  # same object and state; only scale_grad differs
    with mock.patch("resfl_lightning.clients.detection.per_image_detection_loss", per_image_loss_loop) \
            if dp == "before" else contextlib.nullcontext():
        return timed_steps(client, opt, batch, steps)[0]


def detector_spec(scale: str, image_size: int):
    from resfl_lightning.models.yolo import YoloSpec

    return YoloSpec(num_classes=1, scale=scale, image_size=image_size)


def aggregation_cost(scale: str, image_size: int, clients: int) -> tuple[int, float, float]:
    """Streaming weighted sum over `clients` deltas: seconds per client and peak extra memory in |theta| units."""
    model = DetectionClient(detector_spec(scale, image_size), 3, LossWeights(), UfmSettings(), OptimSettings())
    layout = FlatLayout.of(model)
    theta = layout.flatten(model)
    t0 = time.perf_counter()
    acc = StreamingWeightedSum(layout.numel)
    for i in range(clients):
        acc.add(-0.1 * i, theta * 1e-3 * (i + 1))  # stand-in delta, same size as a real one
    elapsed = (time.perf_counter() - t0) / clients
    peak_bytes = acc.acc.numel() * acc.acc.element_size()
    return layout.numel, elapsed, peak_bytes / (layout.numel * 4)


def step_table(scale: str, image_size: int, batch: dict, steps: int, device: str = "cpu",
               precision: str = "32-true") -> Table:
    """Median seconds per training step of each loss variant, its ratio to FedAvg's and the goal it has; on CUDA also
    the host syncs a step makes (CUDA's sync debug mode, counted over the timed steps)."""
    where = "1 thread" if device == "cpu" else device
    table = Table(title=f"train step, YOLOv8-{scale} at {image_size}px, batch {len(batch['img'])}, {where}, "
                        f"{precision}")
    cuda = torch.device(device).type == "cuda"
    for col in ("variant", "median s/step", "ratio vs fedavg", "goal", *(["host syncs / step"] if cuda else [])):
        table.add_column(col, justify="right" if col != "variant" else "left")
    base = None
    rows = []
    for name, weights in VARIANTS.items():
        rows.append((name, weights, None, STEP_GOALS.get(name)))
        if name in ROI_ALIGN_ROWS:
            rows.append((ROI_ALIGN_ROWS[name], weights, ROI_ALIGN, STEP_GOALS.get(name)))
    rows.append((CHEAP_ROI[0], VARIANTS["resfl (task+adv+unc)"], CHEAP_ROI[1], None))
    rows.append((REFRESH_ROW[0], REFRESH_ROW[1], None, STEP_GOALS[REFRESH_ROW[0]]))
    rows.extend((name, weights, None, STEP_GOALS[name]) for name, weights in HELD_ROWS)
    for name, weights, adversary, goal in rows:
        refreshed = weights.curv_refresh > 1  # a mean: most of its steps skip the term
        n = steps * weights.curv_refresh if refreshed else steps
        times, syncs = step_times(weights, scale, image_size, batch, n, adversary, device, precision)
        med = statistics.fmean(times) if refreshed else statistics.median(times)
        base = base or med
        ratio = med / base
        table.add_row(name, f"{med:.3f}", f"{ratio:.2f}x", "-" if goal is None else goal_verdict(ratio, goal),
                      *([f"{syncs / n:.1f}"] if cuda else []))
    return table


def roi_mean_times(image_size: int, batch: int, boxes: int, repeats: int) -> dict[str, float]:
    """Median seconds of phi's box features alone (roi_pool_features over YOLOv8n's three neck levels, forward and
    backward), per algorithm.adversary_roi_impl, the two alternated so that both see the same load."""
    from resfl_lightning.losses.adversary import roi_pool_features
    from resfl_lightning.losses.roi_mean import ROI_IMPLS

    g = torch.Generator().manual_seed(0)
    strides, channels = (8, 16, 32), (64, 128, 256)
    maps = [torch.randn(batch, c, image_size // s, image_size // s, generator=g).requires_grad_()
            for c, s in zip(channels, strides)]
    corner = torch.rand(boxes, 2, generator=g) * image_size * 0.7
    xyxy = torch.cat([corner, corner + 8 + torch.rand(boxes, 2, generator=g) * image_size * 0.3], 1)
    image = torch.randint(0, batch, (boxes,), generator=g)
    times = {impl: [] for impl in ROI_IMPLS}
    for _ in range(repeats + 1):  # the first of each: warm-up
        for impl in ROI_IMPLS:
            t0 = time.perf_counter()
            roi_pool_features(maps, strides, xyxy, image, impl=impl).sum().backward()
            times[impl].append(time.perf_counter() - t0)
    return {impl: statistics.median(t[1:]) for impl, t in times.items()}


ROI_SIZES = ((128, 16, 80), (320, 16, 100), (640, 8, 60))  # (px, images, person boxes) of the pooling table


def roi_mean_table(repeats: int, sizes: tuple = ROI_SIZES) -> Table:
    """phi's box features: roi_align then the mean (the default before 2026-11-29) vs the separable box mean (now),
    and their ratio."""
    table = Table(title="phi's box features alone (3 levels, forward + backward, 1 thread)")
    for col in ("input", "roi_align s", "separable s", "ratio"):
        table.add_column(col, justify="right" if col != "input" else "left")
    for px, batch, boxes in sizes:
        t = roi_mean_times(px, batch, boxes, repeats)
        table.add_row(f"{px}px, {batch} images, {boxes} boxes", f"{t['roi_align']:.4f}", f"{t['separable']:.4f}",
                      f"{t['separable'] / t['roi_align']:.2f}x")
    return table


def dp_table(scale: str, image_size: int, batch: dict, steps: int) -> Table:
    """FedAvg-DP's step without DP-SGD, with the image-by-image loss and opacus' optimizer, and as simulated now."""
    table = Table(title="DP-SGD step (FedAvg-DP: GroupNorm detector, per-example clipping and noise)")
    for col in ("variant", "median s/step", "ratio vs no DP", "ratio vs before"):
        table.add_column(col, justify="right" if col != "variant" else "left")
    med = {dp: statistics.median(dp_step_times(scale, image_size, batch, steps, dp))
           for dp in (None, "before", "client")}
    for dp, name in ((None, "no DP-SGD"), ("before", "DP-SGD before: loss image by image, opacus optimizer"),
                     ("client", "DP-SGD now: batched per-image loss, ClientDPOptimizer")):
        table.add_row(name, f"{med[dp]:.3f}", f"{med[dp] / med[None]:.2f}x", f"{med[dp] / med['before']:.2f}x")
    return table


def aggregation_table(scale: str, image_size: int, clients: int) -> Table:
    numel, per_client, mem_units = aggregation_cost(scale, image_size, clients)
    table = Table(title=f"aggregation over {clients} clients (|theta| = {numel:,} floats)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("seconds per folded client delta", f"{per_client:.4f}")
    table.add_row("accumulator size / |theta| (fp32)", f"{mem_units:.1f}x (independent of client count)")
    table.add_row("throughput (client deltas folded per second)", f"{1 / per_client:,.0f}")
    return table
