"""Offline plots of one or more runs from their run directories (no W&B needed; `resfl report RUN_DIR ...`).

Reads each run's metrics.jsonl (and summary.json / config.yaml when present) and writes PNGs plus report.md that
embeds them with the summary table (default DIR: RUN_DIR/report for one run, ./report for several):

    utility_fairness.png     test utility (mAP@50 and mAP@50-95, or accuracy) and delta-EOP per round, a line per run
    group_tpr.png            per-group TPR at the last evaluated round, bars grouped by group, one colour per run
    clients_<run>.png        per-client aggregation weight and reported u per round (heat maps), raw UFM per client
    mia_roc.png              the membership audit's ROC on log-log axes (runs with attack.mia.method=lira | rmia)
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from resfl_lightning.analysis import run_data
from resfl_lightning.analysis.run_data import RunData
from resfl_lightning.values import finite

SUMMARY_PREFIXES = ("test/", "score/", "attack/")
SUMMARY_SKIP = re.compile(r"^test/(mean_evidence|selection_rate|fpr|tpr)/|^attack/byzantine/client_")


def load_rounds(run_dir: Path | str) -> RunData:
    """The run with its per-round rows, which every report figure reads (errors name the file)."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{metrics} not found: is {run_dir} a run directory (runs/<run_name>)?")
    run = run_data.load_run(run_dir)
    if not run.rows:
        raise ValueError(f"{metrics} holds no round")
    return run


def round_series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, values) of the rows that hold a finite `key` (test metrics exist only on evaluation rounds)."""
    pts = [(r["round"], r[key]) for r in rows if finite(r.get(key)) is not None]
    return np.array([p[0] for p in pts], dtype=int), np.array([p[1] for p in pts], dtype=float)


def final_group_tpr(rows: list[dict]) -> dict[int, float]:
    """{group: TPR} of the last row that has any test/tpr/<g> (groups without a defined TPR are absent)."""
    for r in reversed(rows):
        tpr = {int(k.rsplit("/", 1)[1]): v for k, v in r.items()
               if re.fullmatch(r"test/tpr/\d+", k) and finite(v) is not None}
        if tpr:
            return dict(sorted(tpr.items()))
    return {}


def client_matrix(rows: list[dict], name: str) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(rounds, client ids, values[client, round]) of client/<i>/<name>; NaN where a round lacks the value."""
    pattern = re.compile(rf"client/(\d+)/{re.escape(name)}")
    clients = sorted({int(m.group(1)) for r in rows for k in r if (m := pattern.fullmatch(k))})
    rounds = np.array([r["round"] for r in rows], dtype=int)
    values = np.full((len(clients), len(rows)), np.nan)
    for j, r in enumerate(rows):
        for i, c in enumerate(clients):
            v = r.get(f"client/{c}/{name}")
            values[i, j] = v if finite(v) is not None else np.nan
    return rounds, clients, values


def group_labels(config: dict, groups: list[int]) -> list[str]:
    """Axis labels of the groups: Adult's sensitive attribute values, the MST bins of `grouping`, else "group g"
    (also for a run that saved no config)."""
    ds = config["dataset"] if "dataset" in config else {}
    if ds.get("name") == "adult":
        from resfl_lightning.data.adult import SENSITIVE_GROUPS

        names = SENSITIVE_GROUPS[ds["sensitive"]]
        return [names[g] if g < len(names) else f"group {g}" for g in groups]
    if ds.get("grouping") == "mst3":
        names = ("light\nMST 1-3", "medium\nMST 4-7", "dark\nMST 8-10")
        return [names[g] if g < 3 else f"group {g}" for g in groups]
    if ds.get("grouping") == "mst10":
        return [f"MST {g + 1}" for g in groups]
    return [f"group {g}" for g in groups]


def utility_keys(runs: list[RunData]) -> list[tuple[str, str]]:
    """(key, label) of the utility panels: detection mAP@50 and mAP@50-95, or classification accuracy."""
    keys = {k for run in runs for r in run.rows for k in r}
    out = [(k, lab) for k, lab in (("test/map_50", "test mAP@50"), ("test/map", "test mAP@50-95"),
                                   ("test/accuracy", "test accuracy")) if k in keys]
    return out or [("test/map_50", "test mAP@50")]


# --- figures -----------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_utility_fairness(runs: list[RunData], path: Path) -> Path:
    plt = _plt()
    panels = [*utility_keys(runs), ("test/delta_eop", "test ΔEOP (max - min group TPR)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        for run in runs:
            x, y = round_series(run.rows, key)
            ax.plot(x + 1, y, marker="o", ms=3, label=run.name)
        ax.set_title(label)
        _rounds_axis(ax)
        top = ax.get_ylim()[1]
        ax.set_ylim(0, top if top > 0 else 1)  # rates and mAP are >= 0
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def plot_group_tpr(runs: list[RunData], path: Path) -> Path:
    plt = _plt()
    tprs = [final_group_tpr(run.rows) for run in runs]
    groups = sorted({g for t in tprs for g in t})
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 + 0.9 * len(groups) * max(1, len(runs)) ** 0.5), 3.8))
    width = 0.8 / max(len(runs), 1)
    for k, (run, tpr) in enumerate(zip(runs, tprs)):
        xs = [i + (k - (len(runs) - 1) / 2) * width for i, g in enumerate(groups) if g in tpr]
        ys = [tpr[g] for g in groups if g in tpr]
        bars = ax.bar(xs, ys, width=width * 0.95, label=run.name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)), group_labels(runs[0].config, groups) if runs else [])
    ax.set_ylim(0, 1.3)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_ylabel("TPR (last evaluated round)")
    ax.set_title("per-group true-positive rate")
    ax.legend(fontsize=7, loc="upper center", ncol=min(len(runs), 2), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_clients(run: RunData, path: Path) -> Path:
    """Heat maps of the aggregation weight and reported u (client x round) and raw UFM lines per client."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for ax, (name, title, cmap) in zip(axes[:2], (("weight", "aggregation weight ω", "viridis"),
                                                   ("u", "reported u (after EMA, clip, gate)", "magma_r"))):
        rounds, clients, values = client_matrix(run.rows, name)
        if not clients:
            ax.set_axis_off()
            ax.set_title(f"{title}: not logged")
            continue
        im = ax.imshow(values, aspect="auto", cmap=cmap, interpolation="nearest",
                       extent=(rounds[0] + 0.5, rounds[-1] + 1.5, len(clients) - 0.5, -0.5))
        ax.set_yticks(range(len(clients)), [f"client {c}" for c in clients])
        if len(rounds) <= 10 and len(clients) <= 12:  # room for the values: dark text on light cells
            for (i, j), v in np.ndenumerate(values):
                if np.isfinite(v):
                    r, g, b, _ = im.cmap(im.norm(v))
                    ax.text(rounds[j] + 1, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="black" if 0.3 * r + 0.59 * g + 0.11 * b > 0.5 else "white")
        _rounds_axis(ax)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    rounds, clients, ufm = client_matrix(run.rows, "ufm_raw")
    for i, c in enumerate(clients):
        axes[2].plot(rounds + 1, ufm[i], marker="o", ms=3, label=f"client {c}")
    axes[2].set_title("raw UFM per client (validation split)")
    _rounds_axis(axes[2])
    axes[2].grid(alpha=0.3)
    if clients:
        axes[2].legend(fontsize=7, loc="best")
    fig.suptitle(run.name, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def final_mia_scores(run: RunData) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(method, member scores, non-member scores) of the run's last reference-model MIA (attacks/privacy_round_*.json
    written by attack.mia.method=lira | rmia, or by attack.mia.audit beside the shadow attack), or None."""
    import json

    for path in sorted((run.path / "attacks").glob("privacy_round_*.json"), reverse=True):
        payload = json.loads(path.read_text())
        for mia in (payload.get("mia", {}), payload.get("mia_audit", {})):
            if "scores" in mia:
                return mia["method"], np.asarray(mia["scores"]["members"]), np.asarray(mia["scores"]["nonmembers"])
    return None


def plot_mia_roc(runs: list[RunData], path: Path) -> Path | None:
    """The membership audit's ROC of every run that has one, on log-log axes (the low-FPR regime an audit is read
    in; Carlini et al. 2022), the chance diagonal and FPR 0.1 % and 1 % marked; None when no run has one."""
    from sklearn.metrics import roc_curve

    scored = [(run, found) for run in runs if (found := final_mia_scores(run)) is not None]
    if not scored:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    floor = 1.0 / max(len(f[2]) for _, f in scored)  # the smallest FPR the non-members resolve
    for run, (method, members, nonmembers) in scored:
        fpr, tpr, _ = roc_curve(np.r_[np.ones(members.size), np.zeros(nonmembers.size)], np.r_[members, nonmembers])
        ax.plot(np.maximum(fpr, floor), np.maximum(tpr, floor), label=f"{run.name} ({method})")
    ax.plot([floor, 1], [floor, 1], color="grey", ls="--", lw=1, label="chance")
    for x in (0.001, 0.01):
        if x >= floor:
            ax.axvline(x, color="grey", lw=0.6, ls=":")
    ax.set(xscale="log", yscale="log", xlim=(floor, 1), ylim=(floor, 1), xlabel="false positive rate",
           ylabel="true positive rate", title="membership audit ROC (log-log)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def _rounds_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "run"


def write_figures(runs: list[RunData], out: Path) -> list[Path]:
    """Every figure of the report for these runs, written under `out`; returns the paths."""
    out = Path(out)
    paths = [plot_utility_fairness(runs, out / "utility_fairness.png"), plot_group_tpr(runs, out / "group_tpr.png")]
    seen: Counter[str] = Counter()
    for run in runs:
        slug = _slug(run.name)
        seen[slug] += 1
        suffix = "" if seen[slug] == 1 else f"_{seen[slug]}"
        paths.append(plot_clients(run, out / f"clients_{slug}{suffix}.png"))
    roc = plot_mia_roc(runs, out / "mia_roc.png")
    return paths + ([roc] if roc is not None else [])


# --- report.md -----------------------------------------------------------------------------------------------------
def summary_table(runs: list[RunData]) -> str:
    """Markdown table: one row per final metric (summary.json, else the last row's test metrics), a column per run."""
    finals = [run.summary or {k: v for r in run.rows for k, v in r.items() if k.startswith(SUMMARY_PREFIXES)}
              for run in runs]
    keys = sorted({k for f in finals for k, v in f.items()
                   if k.startswith(SUMMARY_PREFIXES) and not SUMMARY_SKIP.match(k) and finite(v) is not None})
    keys += [k for k in ("rounds_completed", "mean_time/train") if any(k in f for f in finals)]
    head = "| metric | " + " | ".join(run.name for run in runs) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in runs) + " |"
    lines = [head, rule]
    for k in keys:
        cells = [f"{f[k]:.4g}" if finite(f.get(k)) is not None else "–" for f in finals]
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(run_dirs: list[Path | str], out: Path | str | None = None) -> Path:
    """Figures + report.md for the given run directories; returns the path of report.md."""
    runs = [load_rounds(d) for d in run_dirs]
    if not runs:
        raise ValueError("no run directory given")
    out = Path(out) if out is not None else (runs[0].path / "report" if len(runs) == 1 else Path("report"))
    figures = write_figures(runs, out)
    lines = ["# resfl-lightning report", "", "Runs:", ""]
    lines += [f"- `{run.name}`: `{run.path}` ({len(run.rows)} rounds logged)" for run in runs]
    lines += ["", "## Final metrics", "", summary_table(runs), "", "## Figures", ""]
    lines += [f"![{p.stem}]({p.name})\n" for p in figures]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def log_report_figures(run_dir: Path | str, loggers: list) -> list[Path]:
    """Write the figures of one run to RUN_DIR/report and log each as an image (key report/<figure>) to every logger
    with `log_image` (Lightning's WandbLogger)."""
    run = load_rounds(run_dir)
    paths = write_figures([run], run.path / "report")
    step = int(run.rows[-1]["round"])
    for logger in loggers:
        for p in paths:
            logger.log_image(key=f"report/{p.stem}", images=[str(p)], step=step)
    return paths
