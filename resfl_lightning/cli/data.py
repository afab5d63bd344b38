"""`resfl data KEY=VALUE ...`: what the federation will see, before it trains. The same overrides as `resfl train`
compose the same config; the dataset is read, split and partitioned over the clients as a run would do it (same
seed), and no model is built. Prints rows (images and persons for detection) per split and client, group sizes,
the positive rate per group (classification) and the groups small in the test split; `--json` gives the same facts
for scripts (resfl_lightning/data/facts.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

CLIENTS_SHOWN = 20  # client rows of the printed table; --json lists every client


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="resfl data", description=__doc__)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides, as `resfl train` takes them "
                        "(e.g. dataset=csv dataset.path=loans.csv dataset.target=approved 'dataset.positive=[yes]' "
                        "dataset.sensitive=race)")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON instead of tables")
    return parser.parse_args(argv)


def composed(overrides: list[str]):
    """The config `resfl train <overrides>` runs with; a bad override is a ConfigError (one line, exit status 2)."""
    from resfl_lightning.analysis.run_settings import composed_config
    from resfl_lightning.cli.input_errors import composition_errors

    with composition_errors():
        return composed_config(list(overrides))


def gather(overrides: list[str]) -> dict[str, Any]:
    """The facts (data/facts.py) of the data `resfl train <overrides>` would train on, plus the dataset's name, the
    seed and the protected group."""
    from resfl_lightning.attacks.targets import minority_group
    from resfl_lightning.data.facts import data_facts
    from resfl_lightning.data.federated import build_federated_data, instantiate_dataset
    from resfl_lightning.run_config.group_names import with_group_indices
    from resfl_lightning.run_config.load import load_config

    cfg = load_config(with_group_indices(composed(overrides)))
    dataset = instantiate_dataset(cfg.dataset)
    dataset.preflight()
    data = build_federated_data(dataset, seed=cfg.seed, printer=lambda *args, **kwargs: None)
    names = dataset.group_names(cfg.seed) or tuple(str(g) for g in range(data.num_groups))
    facts = {"dataset": dataset.name, "seed": cfg.seed, **data_facts(data, names)}
    declared = cfg.dataset.protected_group
    group = minority_group(data) if declared is None else int(declared)
    facts["protected_group"] = {"index": group, "name": names[group] if group < len(names) else None,
                                "from": "dataset.protected_group" if declared is not None else "the smallest group"}
    return facts


def _count(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _shown(rows: list[dict]) -> tuple[list[dict], int]:
    """The rows printed: every total, and the train / val rows of the first CLIENTS_SHOWN clients."""
    per_client = [r for r in rows if r["client"] is not None]
    totals = [r for r in rows if r["client"] is None]
    return per_client[:2 * CLIENTS_SHOWN] + totals, (len(per_client) - 2 * CLIENTS_SHOWN) // 2


def render(facts: dict[str, Any], console) -> None:
    """The facts as rich tables: items and group sizes per split, then the positive rates (classification)."""
    from rich.table import Table

    names, detection = facts["group_names"], facts["unit"] == "images"
    rows, hidden = _shown(facts["splits"])
    unknown = any(r["unknown_group"] for r in facts["splits"])
    what = "persons" if detection else "rows"
    per = "images per split, persons per group" if detection else "rows per split and group"
    sizes = Table(title=f"dataset {facts['dataset']}, seed {facts['seed']}, {facts['num_clients']} clients "
                        f"({facts['partition']}, H_TV {facts['h_tv']:.3f}): {per}", title_justify="left")
    for header in ["split", "client", facts["unit"]] + (["persons"] if detection else []) + names + \
            (["no group"] if unknown else []):
        sizes.add_column(header, justify="left" if header in ("split", "client") else "right")
    last_client = sum(r["client"] is not None for r in rows) - 1  # a rule between the clients and the totals
    for i, r in enumerate(rows):
        cells = [r["split"], r["client"] if r["client"] is not None else "all", _count(r["items"])]
        cells += [_count(r["persons"])] if detection else []
        cells += [_count(r["groups"][n]) for n in names] + ([_count(r["unknown_group"])] if unknown else [])
        sizes.add_row(*cells, end_section=i == last_client)
    console.print(sizes)
    if hidden > 0:
        console.print(f"... and {hidden} more clients (--json lists every client)")
    if "positive_rate" in rows[0]:
        rates = Table(title="positive rate per group", title_justify="left")
        for header in ["split", "client", "all", *names]:
            rates.add_column(header, justify="left" if header in ("split", "client") else "right")
        for i, r in enumerate(rows):
            rates.add_row(r["split"], r["client"] if r["client"] is not None else "all", _rate(r["positive_rate_all"]),
                          *[_rate(r["positive_rate"][n]) for n in names], end_section=i == last_client)
        console.print(rates)
    small = facts["small_groups"]
    threshold = facts["small_group_threshold"]
    if small:
        listed = ", ".join(f"{n} ({c})" for n, c in small.items())
        console.print(f"small groups (fewer than SMALL_GROUP_TEST_ITEMS={threshold} {what} in the test split; a "
                      f"display hint, not a check: their rates and gaps are noisy): {listed}")
    else:
        console.print(f"every group has at least SMALL_GROUP_TEST_ITEMS={threshold} {what} in the test split "
                      "(a display hint, not a check)")
    p = facts["protected_group"]
    console.print(f"protected group (the fairness attacks' default): {p['index']}={p['name']}, {p['from']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    facts = gather(args.overrides)
    if args.json:
        print(json.dumps(facts, indent=1))
        return 0
    from rich.console import Console

    render(facts, Console(file=sys.stdout))
    return 0
