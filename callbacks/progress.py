"""A rich progress display (rounds x clients) and a final table of the headline metrics, on rank 0."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

HEADLINE = ("test/map", "test/map_50", "test/accuracy", "test/delta_eop", "test/abs_one_minus_di", "test/eo_gap",
            "test/fairness_score", "test/ufm", "clients/mean_u", "attack/mia_success_rate", "attack/aia_top1",
            "score/privacy", "weather/adverse_mean/map")


class RichProgress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.progress: Progress | None = None
        self.latest: dict[str, float] = {}

    def on_fit_start(self, federation, state) -> None:
        if not (self.enabled and federation.fabric.is_global_zero):
            return
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True))
        s = federation.settings
        self.rounds = self.progress.add_task("rounds", total=s.rounds, completed=state.round_idx + 1)
        self.clients = self.progress.add_task("clients (this rank)", total=len(federation.own_clients()))
        self.progress.start()

    def on_round_start(self, round_idx: int) -> None:
        if self.progress:
            self.progress.reset(self.clients)
            self.progress.update(self.rounds, description=f"round {round_idx + 1}")

    def on_client_end(self) -> None:
        if self.progress:
            self.progress.advance(self.clients)

    def on_metrics(self, metrics: dict) -> None:
        self.latest.update({k: v for k, v in metrics.items() if k in HEADLINE})
        if self.progress:
            self.progress.advance(self.rounds)

    def on_fit_end(self, federation) -> None:
        if self.progress:
            self.progress.stop()
        if not federation.fabric.is_global_zero:
            return
        table = Table(title=f"resfl-lightning: {federation.settings.run_dir}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key in HEADLINE:
            if key in self.latest:
                table.add_row(key, f"{self.latest[key]:.4f}")
        Console().print(table)
