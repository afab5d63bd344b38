"""Rules that tie several config keys together, one named function each. Section rules take the section they are
listed on (`checks` of a Section); run rules take the whole RunConfig (config/schema.py). Each raises ConfigError
"<the key to change>: <why>"."""

from __future__ import annotations

from typing import Any

from resfl_lightning.config.errors import ConfigError


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"{key}: {message}", key)


# --- section rules ---------------------------------------------------------------------------------------------


def ufm_clip_order(u: Any) -> None:
    if u.clip_low > u.clip_high:
        _fail("ufm.clip_low", f"must be <= ufm.clip_high, got [{u.clip_low}, {u.clip_high}]")


def ufm_gate_off_needs_absolute_mode(u: Any) -> None:
    """A relative gate ignores ufm.gate, so gate=null there would silently keep gating."""
    if u.gate is None and u.gate_mode == "relative":
        _fail("ufm.gate", "null turns the gate off only with ufm.gate_mode=absolute; the relative gate ignores "
              "ufm.gate (set ufm.gate_mode=absolute ufm.gate=null to switch gating off)")


def loader_workers(loader: Any) -> None:
    if loader.num_workers == 0 and loader.persistent_workers:
        _fail("dataset.loader.persistent_workers", "needs dataset.loader.num_workers > 0")
    if loader.num_workers == 0 and loader.prefetch_factor is not None:
        _fail("dataset.loader.prefetch_factor", "needs dataset.loader.num_workers > 0 (or null)")


def fabric_devices(fabric: Any) -> None:
    d = fabric.devices
    ok = (isinstance(d, int) and not isinstance(d, bool) and d >= 1) or (isinstance(d, str) and d.strip() != "") or (
        isinstance(d, (list, tuple)) and len(d) > 0 and all(isinstance(i, int) and not isinstance(i, bool) for i in d))
    if not ok:
        _fail("fabric.devices", f"must be an integer >= 1, 'auto' or a list of device ids, got {d!r}")


def swa_start_value(a: Any) -> None:
    s = a.swa_start
    if s is not None and not ((isinstance(s, int) and s >= 0) or (isinstance(s, float) and 0 < s < 1)):
        _fail("algorithm.swa_start", f"must be a round (integer >= 0), a fraction of the rounds in (0, 1) or null, "
              f"got {s!r}")


def swa_lr_pair(a: Any) -> None:
    if (a.swa_lr_high is None) != (a.swa_lr_low is None):
        _fail("algorithm.swa_lr_low", "algorithm.swa_lr_high and algorithm.swa_lr_low must both be set or both be null")
    if a.swa_lr_high is not None and not a.swa_lr_low <= a.swa_lr_high:
        _fail("algorithm.swa_lr_low", f"must be <= algorithm.swa_lr_high, got {a.swa_lr_low} > {a.swa_lr_high}")


def dp_budget(dp: Any) -> None:
    if (dp.target_epsilon is None) == (dp.noise_multiplier is None):
        _fail("algorithm.dp", "set exactly one of target_epsilon and noise_multiplier "
              f"(got {dp.target_epsilon} and {dp.noise_multiplier})")


def dp_epsilon_split(dp: Any) -> None:
    """PUFFLE's epsilon_SGD + epsilon_stat + epsilon_lambda (privacy/budget.py): shares of target_epsilon."""
    s = dp.epsilon_split
    if s is None:
        return
    if dp.target_epsilon is None:
        _fail("algorithm.dp.epsilon_split", "needs algorithm.dp.target_epsilon (a fixed noise_multiplier has no "
              "epsilon to split)")
    if len(s) != 3 or s[0] <= 0 or abs(sum(s) - 1.0) > 1e-9:
        _fail("algorithm.dp.epsilon_split", f"must be three shares [sgd, stat, lambda] >= 0 summing to 1 with "
              f"sgd > 0, got {list(s)}")


def tunable_lambda_budget(a: Any) -> None:
    """PUFFLE: under DP the tunable lambda's batch gap is released every step; it needs its own epsilon share."""
    split = a.dp.epsilon_split
    if a.lambda_mode == "tunable" and a.dp.enabled and (split is None or not split[2] > 0):
        _fail("algorithm.dp.epsilon_split", "lambda_mode=tunable under DP needs an epsilon_lambda share > 0 (the "
              f"paper's 4 + 0.5 + 0.5: [0.8, 0.1, 0.1]), got {None if split is None else list(split)}")


def parity_fallback_budget(a: Any) -> None:
    """PUFFLE: under DP the shared counts are paid from epsilon_stat; the key only asks for exact counts without DP."""
    split = a.dp.epsilon_split
    if a.parity_global_fallback and a.dp.enabled and (split is None or not split[1] > 0):
        _fail("algorithm.parity_global_fallback", "under DP the fallback's counts need an epsilon_stat share > 0 "
              f"(algorithm.dp.epsilon_split, e.g. [0.8, 0.1, 0.1]), got {None if split is None else list(split)}")


def temperature_grid_nonempty(section: Any) -> None:
    if len(section.temperatures) == 0:
        _fail(f"{section.section}.temperatures", "must list at least one temperature")


def dim_range_interval(ds: Any) -> None:
    if len(ds.dim_range) != 2 or not 0 < ds.dim_range[0] <= ds.dim_range[1]:
        _fail("dataset.dim_range", f"must be [low, high] with 0 < low <= high, got {list(ds.dim_range)}")


# --- run rules -------------------------------------------------------------------------------------------------


def processes_within_clients(run: Any) -> None:
    """Every process must own at least one client."""
    devices = run.fabric.devices
    if isinstance(devices, int) and not isinstance(devices, bool):
        world = devices * run.fabric.num_nodes
        if world > run.dataset.num_clients:
            _fail("fabric.devices", f"{world} processes (devices x num_nodes) but only {run.dataset.num_clients} "
                  "clients; every process must own at least one client")


def quorum_within_sample(run: Any) -> None:
    from resfl_lightning.federation.participation import sample_size

    try:
        k = sample_size(run.federation.clients_per_round, run.dataset.num_clients)
    except ValueError as err:
        raise ConfigError(str(err), "federation.clients_per_round") from err
    if run.federation.min_clients > k:
        _fail("federation.min_clients", f"must lie in 1..{k} (the clients sampled per round), "
              f"got {run.federation.min_clients}")


def fault_specs(run: Any) -> None:
    from resfl_lightning.federation.faults import FaultPlan

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


def swa_export_needs_swa(run: Any) -> None:
    exported = run.export.enabled and run.dataset.task == "detection"
    if exported and run.export.weights == "swa" and run.algorithm.swa_start is None:
        _fail("export.weights", "swa exports the SWA average, but algorithm.swa_start is null (no SWA)")


RUN_RULES = (processes_within_clients, quorum_within_sample, fault_specs, proxy_cohorts_need_detection,
             per_sample_clipping_excludes_sam, per_sample_clipping_excludes_curvature,
             per_sample_clipping_excludes_fp16, weather_needs_detection, quality_skew_needs_detection,
             local_reweighting_needs_classification, swa_export_needs_swa)
