"""Rules that tie keys of several sections of the run together, one named function each, run on the whole RunConfig
(run_config/schema.py); rules within one section are that section's `checks` (config/rules.py). Each raises
ConfigError "<the key to change>: <why>"."""

from __future__ import annotations

from typing import Any

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.federation.faults import FaultPlan
from resfl_lightning.federation.participation import sample_size


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"{key}: {message}", key)


def processes_within_clients(run: Any) -> None:
    """Every process must own at least one client."""
    devices = run.fabric.devices
    if isinstance(devices, int) and not isinstance(devices, bool):
        world = devices * run.fabric.num_nodes
        if world > run.dataset.num_clients:
            _fail("fabric.devices", f"{world} processes (devices x num_nodes) but only {run.dataset.num_clients} "
                  "clients; every process must own at least one client")


def quorum_within_sample(run: Any) -> None:
    try:
        k = sample_size(run.federation.clients_per_round, run.dataset.num_clients)
    except ValueError as err:
        raise ConfigError(str(err), "federation.clients_per_round") from err
    if run.federation.min_clients > k:
        _fail("federation.min_clients", f"must lie in 1..{k} (the clients sampled per round), "
              f"got {run.federation.min_clients}")


def fault_specs(run: Any) -> None:
    try:
        plan = FaultPlan.parse(run.debug.fail_clients)
    except ValueError as err:
        raise ConfigError(str(err), "debug.fail_clients") from err
    for client_id, _ in plan.entries:
        if client_id >= run.dataset.num_clients:
            _fail("debug.fail_clients", f"client {client_id} does not exist ({run.dataset.num_clients} clients)")


def proxy_cohorts_need_detection(run: Any) -> None:
    # Raised inside a client it would look like a client failure, not a config error.
    if run.ufm.cohorts == "proxy" and run.dataset.task == "classification":
        _fail("ufm.cohorts", "'proxy' needs a proxy column, which tabular data does not provide; use groups, "
              "cluster or slices")


def per_sample_clipping_excludes_sam(run: Any) -> None:
    if run.algorithm.per_sample_clipping and run.algorithm.sam_rho > 0:
        _fail("algorithm.sam_rho", "SAM's second gradient pass is not part of DP-SGD; set 0 with algorithm.dp")


def per_sample_clipping_excludes_curvature(run: Any) -> None:
    if run.algorithm.per_sample_clipping and run.algorithm.lambda_curv > 0:
        _fail("algorithm.lambda_curv", "the curvature term's extra backward passes would be taken as per-sample "
              "gradients; set 0 with algorithm.dp")


def per_sample_clipping_excludes_fp16(run: Any) -> None:
    precision = str(run.fabric.precision)
    if run.algorithm.per_sample_clipping and precision in ("16-mixed", "16"):
        _fail("fabric.precision", f"{precision}: the AMP loss scale would enter the per-sample clipping; use "
              "32-true or bf16-mixed with algorithm.dp")


def weather_needs_detection(run: Any) -> None:
    if run.eval.weather and run.dataset.task != "detection":
        _fail("eval.weather", f"weather corruptions apply to image detection datasets; dataset "
              f"{run.dataset.name!r} is a {run.dataset.task} task")


def quality_skew_needs_detection(run: Any) -> None:
    if run.dataset.quality_skew is not None and run.dataset.task != "detection":
        _fail("dataset.quality_skew", f"scenario=quality_skew dims persons in images; dataset {run.dataset.name!r} "
              f"is a {run.dataset.task} task")


def local_reweighting_needs_classification(run: Any) -> None:
    if run.algorithm.local_reweighting and run.dataset.task != "classification":
        _fail("algorithm.local_reweighting", f"Kamiran-Calders weights P(a)P(y)/P(a,y) need a label y per sample; "
              f"dataset {run.dataset.name!r} is a {run.dataset.task} task, where every unit is a positive person")


def adaptive_attack_needs_resfl_robust(run: Any) -> None:
    # Checked here, before the data are built; ByzantineRound repeats it for rules given in code. Reads the raw attack
    # nodes: their typed settings are the attack registry's (build_run), after group names become indices.
    from collections.abc import Mapping

    from hydra.utils import get_class

    from resfl_lightning.aggregation.resfl_robust import RobustResfl
    from resfl_lightning.attacks.byzantine_round import RULE_NEEDS

    aggregation = run.aggregation.get("_target_") if run.aggregation is not None else None
    if run.attack is None or (aggregation is not None and issubclass(get_class(str(aggregation)), RobustResfl)):
        return
    enabled = run.attack.get("enabled")
    for name, node in run.attack.items():
        if not (isinstance(node, Mapping) and "_target_" in node) or (enabled is not None and name not in enabled):
            continue
        kind = node.get("kind")
        if kind in RULE_NEEDS:
            _fail(f"attack.{name}.kind", f"{kind} attacks resfl_robust's {', '.join(RULE_NEEDS[kind])}, but the run "
                  f"aggregates with {aggregation}; use algorithm=resfl_robust")


def swa_export_needs_swa(run: Any) -> None:
    exported = run.export.enabled and run.dataset.task == "detection"
    if exported and run.export.weights == "swa" and run.algorithm.swa_start is None:
        _fail("export.weights", "swa exports the SWA average, but algorithm.swa_start is null (no SWA)")


RUN_RULES = (processes_within_clients, quorum_within_sample, fault_specs, proxy_cohorts_need_detection,
             per_sample_clipping_excludes_sam, per_sample_clipping_excludes_curvature,
             per_sample_clipping_excludes_fp16, weather_needs_detection, quality_skew_needs_detection,
             local_reweighting_needs_classification, adaptive_attack_needs_resfl_robust, swa_export_needs_swa)
