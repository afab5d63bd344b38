"""`resfl bench`: the benchmarks (resfl_lightning/benchmarks/), measured in one run: step-time ratios of the composite
losses and of DP-SGD, aggregation cost, a federated round of the train entry point against a plain loop, the
DEVICES=2 speed-up and the time to the first local step (round part), and per-step time and peak RSS for 4 / 1,000 /
10,000 virtual clients at 1 % participation (scale part). --quick runs every part at a tiny size (a femto detector at
64 px, 1 round; 4 and 20 virtual clients of 64 rows, 2 rounds): a smoke test of the machinery, not a measurement.

One part alone:
  resfl bench steps [--device cuda] [--precision bf16-mixed]       the train-step table on a device
  resfl bench round [--quick] [--rounds 2]                       the round part
  resfl bench scale [--rounds 3] [--fraction 0.01] [--counts ...]  the scale part
  resfl bench aggregation [--counts 10 100] [--device cpu]        each rule's aggregation time per round
  resfl bench csv [--rows 1000000] [--columns 50]                 dataset=csv load + partition time
  resfl bench curvature [--steps 40]                             the curvature estimators against lambda_max
"""

from __future__ import annotations

import argparse


def _console():
    from rich.console import Console

    return Console()


QUICK_STEP = {"scale": "femto", "image_size": 64, "batch": 2, "steps": 2}  # --quick's step-table size


def _step_arguments(p: argparse.ArgumentParser) -> None:
    """The detector and batch every step table is measured on (all parts and `resfl bench steps`)."""
    p.add_argument("--scale", default="n")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)


def all_parts(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="resfl bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _step_arguments(p)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--scale-rounds", type=int, default=3,
                   help="rounds per virtual-client run, the first a warm-up (0 skips that part)")
    p.add_argument("--round-rounds", type=int, default=2,
                   help="rounds of the entry-point runs (the last is measured; 0 skips the round part)")
    p.add_argument("--quick", action="store_true", help="every part at a tiny size (a smoke test, not a measurement)")
    args = p.parse_args(argv)
    import torch

    from resfl_lightning.benchmarks import dp_tabular
    from resfl_lightning.benchmarks import round as bench_round
    from resfl_lightning.benchmarks import scale as bench_scale
    from resfl_lightning.benchmarks.steps import (
        aggregation_table,
        dp_table,
        roi_mean_table,
        step_table,
        synthetic_batch,
    )

    scale_counts, scale_rows = bench_scale.COUNTS, bench_scale.ROWS_PER_CLIENT
    if args.quick:
        vars(args).update(QUICK_STEP, clients=2)
        args.scale_rounds, args.round_rounds = min(args.scale_rounds, 2), min(args.round_rounds, 1)
        scale_counts, scale_rows = (4, 20), 64
    torch.set_num_threads(1)
    batch = synthetic_batch(args.image_size, args.batch)
    console = _console()
    console.print(step_table(args.scale, args.image_size, batch, args.steps))
    console.print(roi_mean_table(2, ((64, 2, 4),)) if args.quick else roi_mean_table(10))
    console.print(dp_table(args.scale, args.image_size, batch, args.steps))
    console.print(dp_tabular.table(args.steps * 3, batch_size=32 if args.quick else dp_tabular.ADULT_BATCH))
    console.print(aggregation_table(args.scale, args.image_size, args.clients))
    if args.round_rounds > 0:
        console.print(bench_round.table(bench_round.measure(quick=args.quick, rounds=args.round_rounds)))
    if args.scale_rounds > 0:
        console.print(bench_scale.table(bench_scale.measure(scale_counts, fraction=bench_scale.FRACTION,
                                                            rounds=args.scale_rounds, rows_per_client=scale_rows)))
    return 0


def round_part(argv: list[str]) -> int:
    from resfl_lightning.benchmarks import round as bench_round

    p = argparse.ArgumentParser(prog="resfl bench round", description=bench_round.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a femto detector on 64 px scenes (a smoke test)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per run; the last one is measured")
    args = p.parse_args(argv)
    _console().print(bench_round.table(bench_round.measure(quick=args.quick, rounds=args.rounds)))
    return 0


def scale_part(argv: list[str]) -> int:
    from resfl_lightning.benchmarks import scale as bench_scale

    p = argparse.ArgumentParser(prog="resfl bench scale", description=bench_scale.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fraction", type=float, default=bench_scale.FRACTION, help="clients sampled per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds per run (>= 2; the first is a warm-up)")
    p.add_argument("--rows", type=int, default=bench_scale.ROWS_PER_CLIENT, help="Adult-shaped rows a client")
    p.add_argument("--counts", type=int, nargs="+", default=list(bench_scale.COUNTS),
                   help="numbers of virtual clients (the first is the baseline of the ratios)")
    args = p.parse_args(argv)
    _console().print(bench_scale.table(bench_scale.measure(tuple(args.counts), fraction=args.fraction,
                                                           rounds=args.rounds, rows_per_client=args.rows)))
    return 0


def steps_part(argv: list[str]) -> int:
    from resfl_lightning.benchmarks.steps import PRECISIONS

    p = argparse.ArgumentParser(prog="resfl bench steps",
                                description="The train-step table alone, on a chosen device and precision: median "
                                            "seconds a step of FedAvg's, RESFL's and RESFL + CurvFed's losses, the "
                                            "ratios to FedAvg's and, on CUDA, the host syncs a step makes.")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--precision", default="32-true", choices=sorted(PRECISIONS))
    _step_arguments(p)
    p.add_argument("--quick", action="store_true", help="a femto detector, 64 px, 2 images, 2 steps (a smoke test)")
    args = p.parse_args(argv)
    import torch

    from resfl_lightning.benchmarks.steps import step_table, synthetic_batch

    if args.quick:
        vars(args).update(QUICK_STEP)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"resfl bench steps: --device {args.device} but torch sees no CUDA device")
    torch.set_num_threads(1)
    batch = synthetic_batch(args.image_size, args.batch)
    _console().print(step_table(args.scale, args.image_size, batch, args.steps, args.device, args.precision))
    return 0


def curvature_part(argv: list[str]) -> int:
    from resfl_lightning.benchmarks import curvature_tracking

    p = argparse.ArgumentParser(prog="resfl bench curvature", description=curvature_tracking.__doc__)
    _step_arguments(p)
    p.set_defaults(steps=40)
    p.add_argument("--skip", type=int, default=4, help="steps left out of the summary (the estimators' cold starts)")
    p.add_argument("--quick", action="store_true", help="a femto detector, 64 px, 2 images, 3 steps (a smoke test)")
    args = p.parse_args(argv)
    import torch

    if args.quick:
        vars(args).update(QUICK_STEP, steps=3, skip=1)
    torch.set_num_threads(1)
    observed, _ = curvature_tracking.tracking(args.scale, args.image_size, args.batch, args.steps)
    _console().print(curvature_tracking.table(observed, args.skip))
    return 0


def csv_part(argv: list[str]) -> int:
    from resfl_lightning.benchmarks import csv_load

    p = argparse.ArgumentParser(prog="resfl bench csv", description=csv_load.__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--columns", type=int, default=50)
    args = p.parse_args(argv)
    _console().print(csv_load.table(csv_load.measure(args.rows, args.columns)))
    return 0


def aggregation_part(argv: list[str]) -> int:
    from resfl_lightning.benchmarks import aggregation_time
    from resfl_lightning.benchmarks.steps import aggregation_cost

    p = argparse.ArgumentParser(prog="resfl bench aggregation", description=aggregation_time.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", default="n", help="YOLOv8 scale whose parameter count sizes the updates")
    p.add_argument("--counts", type=int, nargs="+", default=[10, 100], help="numbers of clients per round")
    p.add_argument("--repeats", type=int, default=1, help="rounds timed per rule (the median is shown)")
    p.add_argument("--device", default="cpu", help="where the stacked updates live (cpu, cuda)")
    p.add_argument("--rules", nargs="+", default=None, help="only these rules (default: every one)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    numel = aggregation_cost(args.scale, 64, 1)[0]
    results = aggregation_time.measure(numel, tuple(args.counts), args.repeats, args.device,
                                       None if args.rules is None else tuple(args.rules))
    _console().print(aggregation_time.table(results, numel, args.device))
    return 0


PARTS = {"steps": steps_part, "round": round_part, "scale": scale_part, "csv": csv_part, "curvature": curvature_part,
         "aggregation": aggregation_part}


def main(argv: list[str] | None = None) -> int:
    argv = [] if argv is None else list(argv)
    if argv and argv[0] in PARTS:
        return PARTS[argv[0]](argv[1:])
    return all_parts(argv)

