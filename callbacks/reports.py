"""Per-client UFM, gate status, aggregation weight and mean losses every round."""

from __future__ import annotations


class ClientReportLogger:
    def on_round_end(self, reports, weights: dict[int, float], metrics: dict) -> None:
        for r in reports:
            metrics.update(r.as_log_dict(f"client/{r.client_id}"))
            metrics[f"client/{r.client_id}/weight"] = weights[r.client_id]
        n = max(len(reports), 1)
        metrics["clients/mean_u"] = sum(r.u for r in reports) / n
        metrics["clients/mean_ufm_raw"] = sum(r.ufm_raw for r in reports) / n
        metrics["clients/gated_fraction"] = sum(r.gated for r in reports) / n
        metrics["clients/mean_val_utility"] = sum(r.val_utility for r in reports) / n
        metrics["clients/max_weight"] = max(weights.values()) if weights else 0.0
        for key in sorted({k for r in reports for k in r.train_losses}):
            vals = [r.train_losses[key] for r in reports if key in r.train_losses]
            metrics[f"train/{key}"] = sum(vals) / len(vals)
