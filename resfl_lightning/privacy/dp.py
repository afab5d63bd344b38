"""Per-example DP-SGD for one client (docs/method.md §5 FedAvg-DP; PUFFLE and PFU-FL reuse it), built on opacus.

opacus supplies every privacy-critical piece: per-sample gradients (GradSampleModule hooks), per-sample clipping and
Gaussian noise (DPOptimizer), Poisson sampling (UniformWithReplacementSampler) and the accountant (PRV by default).
This module only wires them into the simulator: the rank's ONE live client module is replayed for many clients, so
the accountant's history is client-local state (exported / imported with the client's other state) and the noise
multiplier is derived per client from its own sample rate and the run's planned number of steps.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import opacus
import torch
from opacus import GradSampleModule
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from opacus.validators import ModuleValidator
from torch import nn

from resfl_lightning.clients.plugin import ClientPlugin
from resfl_lightning.config import rules
from resfl_lightning.config.fields import Section, setting
from resfl_lightning.memo import disk_memo
from resfl_lightning.privacy import bookkeeping, gaussian, grad_sample_store
from resfl_lightning.privacy.budget import budget_parts
from resfl_lightning.privacy.groupnorm import GROUPNORM_RULES, replace_batchnorm
from resfl_lightning.privacy.report import EPSILON_KEY, STATISTICS_KEY
from resfl_lightning.privacy.signal import median_noise_to_signal

ACCOUNTANTS = ("prv", "rdp", "gdp")
CLIPPINGS = ("bookkeeping", "per_sample")
grad_sample_store.install()  # opacus' per-sample gradients without its zero-filled copy; bitwise the same
# opacus' full backward hooks on the first layer (whose input needs no grad) make torch warn once; it is expected.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect")
HISTORY_KEY = "dp.history"  # client-local state: the accountant's (noise multiplier, sample rate, steps) rows
SIGNAL_KEY = "dp.signal"  # client-local state: ||g_c|| of every DP-SGD step so far (the NSR's signal)
CLIPPING_KEY = "dp.clipping"  # client-local state: (median ||g_i||, share of clipped examples) of every step so far
LAMBDA_HISTORY_KEY = "dp.lambda_history"  # client-local state: the epsilon_lambda accountant's rows (PUFFLE)
STAT_HISTORY_KEY = "dp.stat_history"  # client-local state: (noise multiplier, releases) of PUFFLE's shared counts


@dataclass(kw_only=True, frozen=True)
class DPConfig(Section):
    """`algorithm.dp`: per-example clipping at max_grad_norm, noise from a run-level (epsilon, delta) target.

    Exactly one of target_epsilon (noise multiplier from the accountant) and noise_multiplier (fixed sigma; 0 means
    clipping only, as PFU-FL) is set."""

    section = "algorithm.dp"
    checks = (rules.dp_budget, rules.dp_epsilon_split)

    max_grad_norm: float = setting(1.0, "per-example clip C", gt=0)
    target_epsilon: float | None = setting(1.0, "run-level epsilon per client (null: noise_multiplier given)", gt=0)
    target_delta: float = setting(1e-6, "run-level delta per client", gt=0, lt=1)
    noise_multiplier: float | None = setting(None, "fixed z instead of a target epsilon (0: clipping only)", ge=0)
    accountant: str = setting("prv", "opacus accountant", choices=ACCOUNTANTS)
    epsilon_split: list[float] | None = setting(None, "PUFFLE: shares [sgd, stat, lambda] of target_epsilon, each "
                                                "part with target_delta / 3 (null: all to DP-SGD)", ge=0)
    groupnorm_groups: str = setting("min32_c4", "groups of the GroupNorm replacing a BatchNorm2d: min32_c4 = the "
                                    "largest divisor of C <= min(32, C // 4); opacus = gcd(32, C)",
                                    choices=GROUPNORM_RULES)
    clipping: str = setting("bookkeeping", "how per-example norms and clipped sums are computed: bookkeeping = a "
                            "Linear layer's from its input and output gradient (privacy/bookkeeping.py), per_sample = "
                            "opacus' materialised per-sample gradients; equal up to rounding", choices=CLIPPINGS)
    enabled: bool = setting(True, "false: the GroupNorm model only, trained without clipping, noise or accounting "
                            "(the layout's ablation)")


@dataclass(kw_only=True, frozen=True)
class DPSettings(DPConfig):
    """DPConfig with the run's plan (rounds x local_epochs), over which a client's budget is spent."""

    rounds: int = setting(1, "federation.rounds", ge=1)
    local_epochs: int = setting(1, "federation.local_epochs", ge=1)


def sample_rate(num_samples: int, batch_size: int) -> float:
    """Poisson sampling probability q = B / n (a client smaller than one batch samples every row: q = 1)."""
    if num_samples < 1 or batch_size < 1:
        raise ValueError(f"DP sampling needs num_samples >= 1 and batch_size >= 1, got {num_samples}, {batch_size}")
    return min(1.0, batch_size / num_samples)


def steps_per_epoch(q: float) -> int:
    """Batches per epoch, as opacus' UniformWithReplacementSampler counts them (int(1 / q))."""
    return int(1 / q)


def planned_steps(settings: DPSettings, q: float) -> int:
    """All of a client's DP-SGD steps over the run: rounds x local epochs x steps per epoch."""
    return settings.rounds * settings.local_epochs * steps_per_epoch(q)


@lru_cache(maxsize=256)
def _sigma_for(target_epsilon: float, target_delta: float, q: float, steps: int, accountant: str) -> float:
    """opacus' sigma search (~5 s with PRV), memoised on disk: every run of a table asks for the same few values."""
    key = dict(opacus=opacus.__version__, target_epsilon=repr(target_epsilon), target_delta=repr(target_delta),
               q=repr(q), steps=steps, accountant=accountant)
    return disk_memo("dp_sigma", key, lambda: float(get_noise_multiplier(
        target_epsilon=target_epsilon, target_delta=target_delta, sample_rate=q, steps=steps, accountant=accountant)))


@lru_cache(maxsize=1024)
def _spent_epsilon(accountant: str, history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """The accountant's epsilon for a history (PRV: ~0.3 s); clients with the same sample rate share histories."""
    acc = create_accountant(accountant)
    acc.history = list(history)
    return float(acc.get_epsilon(delta=delta))


def noise_multiplier_for(settings: DPSettings, q: float) -> float:
    """sigma reaching the run-level (target_epsilon, target_delta) after every planned step (opacus' search); with
    an epsilon split, DP-SGD's part (epsilon_SGD, delta / 3) only."""
    if settings.noise_multiplier is not None:
        return float(settings.noise_multiplier)
    sgd = budget_parts(settings.target_epsilon, settings.target_delta, settings.epsilon_split)["sgd"]
    return _sigma_for(sgd.epsilon, sgd.delta, q, planned_steps(settings, q), settings.accountant)


def lambda_noise_for(settings: DPSettings, q: float) -> float | None:
    """sigma_lambda of PUFFLE's noisy batch gap: (epsilon_lambda, delta / 3) over one release per planned DP-SGD step
    at the same sample rate, as the paper's code accounts it; None without an epsilon_lambda share."""
    part = budget_parts(settings.target_epsilon, settings.target_delta, settings.epsilon_split).get("lambda")
    if part is None or not part.epsilon:
        return None
    return _sigma_for(part.epsilon, part.delta, q, planned_steps(settings, q), settings.accountant)


def stat_noise_for(settings: DPSettings) -> float | None:
    """z of PUFFLE's shared counts (clients/parity_rates.py): (epsilon_stat, delta / 3) over one release per planned
    round at sample rate 1 (the whole training split), by the Gaussian mechanism's exact curve (privacy/gaussian.py);
    None without an epsilon_stat share."""
    part = budget_parts(settings.target_epsilon, settings.target_delta, settings.epsilon_split).get("stat")
    if part is None or not part.epsilon:
        return None
    return gaussian.noise_multiplier(part.epsilon, part.delta, settings.rounds)


def history_epsilon(accountant: str, history, delta: float) -> float:
    """Spent epsilon of an accountant history at delta: 0 before any step, inf when steps ran without noise."""
    if not history:
        return 0.0
    if any(s == 0 for s, _, _ in history):
        return math.inf
    return _spent_epsilon(accountant, tuple((float(s), float(q), int(n)) for s, q, n in history), delta)


def prepare_model(model: nn.Module, groupnorm_groups: str = "min32_c4") -> nn.Module:
    """BatchNorm -> GroupNorm (opacus' ModuleValidator.fix, then the group count of privacy/groupnorm.py's rule) and
    no in-place activations (they break the hooks).

    Called when the client is built, before any gradient exists, so every client and the global model share the
    same GroupNorm layout. Raises if opacus' validator still finds a problem."""
    quiet = logging.getLogger("opacus.validators")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # fix() logs one line per replaced BatchNorm
    try:
        fixed = ModuleValidator.fix(model)
    finally:
        quiet.setLevel(level)
    replace_batchnorm(model, fixed, groupnorm_groups)
    for module in fixed.modules():
        if getattr(module, "inplace", False):
            module.inplace = False
    errors = ModuleValidator.validate(fixed, strict=False)
    if errors:
        raise ValueError(f"algorithm.dp: the model is not DP-compatible after opacus' fix: {errors}")
    return fixed


class EmptyBatch:
    """A Poisson draw that picked no sample: DP-SGD still takes its (noise-only) step."""

    def __repr__(self) -> str:
        return "EmptyBatch()"


class PoissonBatches:
    """Batches of a training loader's dataset drawn by opacus' UniformWithReplacementSampler (Poisson sampling)."""

    def __init__(self, dataset, collate_fn, q: float, seed: int):
        self.dataset, self.collate_fn = dataset, collate_fn
        gen = torch.Generator().manual_seed(seed)
        self.sampler = UniformWithReplacementSampler(num_samples=len(dataset), sample_rate=q, generator=gen,
                                                     steps=steps_per_epoch(q))

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        for indices in self.sampler:
            if len(indices) == 0:
                yield EmptyBatch()
            elif hasattr(self.dataset, "__getitems__"):
                yield self.collate_fn(self.dataset.__getitems__(list(indices)))
            else:
                yield self.collate_fn([self.dataset[i] for i in indices])


class ClientDPOptimizer(DPOptimizer):
    """opacus' DPOptimizer with the mean reduction's divisor computed once per step, and the NSR's signal measured.

    opacus' `scale_grad` re-reads `accumulated_iterations` (a pass over every parameter) for each parameter: O(P^2)
    per step, ~2 % of a detector's DP-SGD step (make bench). Same divisor, same division: identical gradients.

    `signal_norms` (None: not measured) receives ||g_c|| of each step, g_c = (1/B) sum_i clip_C(g_i) with B the
    expected batch size (opacus' divisor): opacus' clipped sum `summed_grad`, read before the noise is added. Only
    read (no RNG, no write), so the step is the same with or without it; kept on the device (no host read).
    `clipping` receives, under the same switch, each step's median per-example norm ||g_i|| before clipping and the
    share of examples with ||g_i|| > C: how far below the gradients C sits (all clipped: the step is lr C times a
    mean of unit vectors, so lr and C act only through their product)."""

    signal_norms: list[torch.Tensor] | None = None
    clipping: list[torch.Tensor] | None = None

    def _record_clipping(self, norms: torch.Tensor) -> None:
        if self.signal_norms is not None and self.clipping is not None and norms.numel():
            self.clipping.append(torch.stack([norms.median(), (norms > self.max_grad_norm).double().mean()
                                              .to(norms.dtype)]).detach())

    def add_noise(self) -> None:
        if self.signal_norms is not None:
            summed = [p.summed_grad for p in self.params]
            norm = torch.nn.utils.get_total_norm(summed, norm_type=2.0) if summed else torch.zeros(())
            self.signal_norms.append(norm.detach() / self.expected_batch_size)
        super().add_noise()

    def clip_and_accumulate(self) -> None:
        """opacus' clipping; with book-keeping placeholders (privacy/bookkeeping.py) the norms and the clipped sums of
        those parameters come from their factors, the same formulas otherwise (opacus' own code when there are none)."""
        if not any(bookkeeping.holds_factors(p.grad_sample) for p in self.params):
            if self.grad_samples and len(self.grad_samples[0]):  # opacus' own norms, recomputed only to be recorded
                self._record_clipping(torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in self.grad_samples],
                                                  dim=1).norm(2, dim=1))
            return super().clip_and_accumulate()
        samples = [bookkeeping.flat(p.grad_sample) for p in self.params]
        norms = torch.stack([bookkeeping.per_sample_norms(s) for s in samples], dim=1).norm(2, dim=1)
        self._record_clipping(norms)
        clip = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        for p, sample in zip(self.params, samples, strict=True):
            _check_processed_flag(p.grad_sample)
            grad = bookkeeping.clipped_sum(sample, clip, p.dtype)
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
            _mark_as_processed(p.grad_sample)

    def scale_grad(self) -> None:
        if self.loss_reduction == "mean":
            divisor = self.expected_batch_size * self.accumulated_iterations
            for p in self.params:
                p.grad /= divisor


class ClientDP(ClientPlugin):
    """DP-SGD machinery attached to one live client module as its plug-in (clients/plugin.py); the accountant is
    swapped in per client (export_state / import_state).

    The GradSampleModule is kept off the module tree (a plain attribute of this object), so the client's
    state-dict keys and flat layout do not change; its hooks live on the model's submodules and run only while the
    client is in train mode (`set_training`)."""

    per_example_loss = True  # per-example clipping: each example's loss must stand alone

    def __init__(self, settings: DPSettings, model: nn.Module):
        self.settings = settings
        self.model = model
        wrapper = bookkeeping.BookkeepingGradSampleModule if settings.clipping == "bookkeeping" else GradSampleModule
        self.grad_sample = wrapper(model, loss_reduction="mean")  # strict: fails on BatchNorm
        self.accountant = create_accountant(settings.accountant)
        self.optimizer: ClientDPOptimizer | None = None
        self.q: float | None = None
        self.sigma: float | None = None
        self.signal: list[float] = []  # ||g_c|| of the client's earlier rounds' steps (client-local state)
        self.clip_rows: list[list[float]] = []  # (median ||g_i||, clipped share) of those steps (client-local state)
        self.parts = budget_parts(settings.target_epsilon, settings.target_delta, settings.epsilon_split)
        self.lambda_accountant = create_accountant(settings.accountant)  # PUFFLE's noisy lambda updates
        self.lambda_sigma: float | None = None
        self.stat_sigma = stat_noise_for(settings)
        self.stat_history: list[tuple[float, int]] = []  # (z, releases) of the shared counts

    # --- client-local state ------------------------------------------------------------------------
    def export_state(self) -> dict[str, torch.Tensor]:
        rows = [list(map(float, row)) for row in self.accountant.history]
        state = {HISTORY_KEY: torch.tensor(rows, dtype=torch.float64).reshape(-1, 3),
                 SIGNAL_KEY: torch.tensor(self.signal_history(), dtype=torch.float64),
                 CLIPPING_KEY: torch.tensor(self.clipping_history(), dtype=torch.float64).reshape(-1, 2)}
        if self.lambda_accountant.history:
            rows = [list(map(float, row)) for row in self.lambda_accountant.history]
            state[LAMBDA_HISTORY_KEY] = torch.tensor(rows, dtype=torch.float64).reshape(-1, 3)
        if self.stat_history:
            state[STAT_HISTORY_KEY] = torch.tensor(self.stat_history, dtype=torch.float64).reshape(-1, 2)
        return state

    def import_state(self, state: dict[str, torch.Tensor] | None) -> None:
        """A client's own accountant history and signal norms (None: a client that has not trained yet)."""
        self.accountant = create_accountant(self.settings.accountant)
        self.lambda_accountant = create_accountant(self.settings.accountant)
        self.signal, self.sigma, self.q, self.lambda_sigma, self.stat_history = [], None, None, None, []
        self.clip_rows = []
        if self.optimizer is not None:
            self.optimizer.signal_norms, self.optimizer.clipping = [], []
        if state is not None and HISTORY_KEY in state:
            self.accountant.history = [(float(s), float(q), int(n)) for s, q, n in state[HISTORY_KEY].tolist()]
        if state is not None and SIGNAL_KEY in state:
            self.signal = [float(v) for v in state[SIGNAL_KEY].tolist()]
        if state is not None and CLIPPING_KEY in state:  # absent in checkpoints written before it was recorded
            self.clip_rows = state[CLIPPING_KEY].tolist()
        if state is not None and LAMBDA_HISTORY_KEY in state:
            self.lambda_accountant.history = [(float(s), float(q), int(n))
                                              for s, q, n in state[LAMBDA_HISTORY_KEY].tolist()]
        if state is not None and STAT_HISTORY_KEY in state:
            self.stat_history = [(float(z), int(n)) for z, n in state[STAT_HISTORY_KEY].tolist()]

    def signal_history(self) -> list[float]:
        """||g_c|| of every DP-SGD step this client took over the run (noise-only steps of empty draws excluded)."""
        fresh = self.optimizer.signal_norms if self.optimizer is not None else None
        if fresh:
            self.signal += torch.stack(fresh).tolist()  # the round's one host read
            fresh.clear()
        return list(self.signal)

    def clipping_history(self) -> list[list[float]]:
        """[median ||g_i||, share of examples clipped] of every DP-SGD step this client took over the run."""
        fresh = self.optimizer.clipping if self.optimizer is not None else None
        if fresh:
            self.clip_rows += torch.stack(fresh).tolist()
            fresh.clear()
        return [list(row) for row in self.clip_rows]

    def statistics(self) -> dict[str, float]:
        """The client's accounting numbers: z, q, steps taken so far, B, C, target epsilon (NaN: a fixed z), delta,
        the NSR z C / (B ||g_c||), the median over all its steps, and the per-example norms against C: the median
        over steps of each step's median ||g_i|| and the mean share of clipped examples ({} before its first step)."""
        if self.sigma is None or self.q is None:
            return {}
        s, b = self.settings, self.optimizer.expected_batch_size
        target = s.target_epsilon if s.noise_multiplier is None else None
        out = {"noise_multiplier": self.sigma, "sample_rate": self.q,
               "steps": float(sum(int(n) for _, _, n in self.accountant.history)), "expected_batch_size": float(b),
               "max_grad_norm": s.max_grad_norm, "target_epsilon": math.nan if target is None else float(target),
               "delta": s.target_delta,
               "nsr": median_noise_to_signal(self.sigma, s.max_grad_norm, b, self.signal_history())}
        rows = np.asarray(self.clipping_history(), dtype=np.float64).reshape(-1, 2)
        out["grad_norm_median"] = float(np.median(rows[:, 0])) if len(rows) else math.nan
        out["clipped_share"] = float(rows[:, 1].mean()) if len(rows) else math.nan
        if s.epsilon_split is not None:  # PUFFLE's three parts: targets and what each has spent
            spent = self.part_epsilons()
            for name, part in self.parts.items():
                out[f"epsilon_{name}"] = spent[name]
                out[f"target_epsilon_{name}"] = float(part.epsilon)
            out["noise_multiplier_lambda"] = math.nan if self.lambda_sigma is None else self.lambda_sigma
            out["lambda_updates"] = float(sum(int(n) for _, _, n in self.lambda_accountant.history))
            out["noise_multiplier_stat"] = math.nan if self.stat_sigma is None else self.stat_sigma
            out["stat_releases"] = float(sum(n for _, n in self.stat_history))
        return out

    def part_epsilons(self) -> dict[str, float]:
        """Spent epsilon per budget part, each at its own delta; the shared counts' by the Gaussian mechanism's exact
        curve (privacy/gaussian.py), the other two by the run's opacus accountant."""
        acc = self.settings.accountant
        return {"sgd": history_epsilon(acc, self.accountant.history, self.parts["sgd"].delta),
                "stat": gaussian.spent_epsilon(self.stat_history, self.parts["stat"].delta),
                "lambda": history_epsilon(acc, self.lambda_accountant.history, self.parts["lambda"].delta)}

    def epsilon(self) -> float:
        """Spent epsilon: DP-SGD's at target_delta (0 before any step, inf when steps ran without noise), or with an
        epsilon split the sum of the parts (each at delta / 3)."""
        if self.settings.epsilon_split is not None:
            return sum(self.part_epsilons().values())
        return history_epsilon(self.settings.accountant, self.accountant.history, self.settings.target_delta)

    # --- the local loop's hooks ------------------------------------------------------------------------
    def set_training(self, mode: bool) -> None:
        if mode:
            self.grad_sample.enable_hooks()
        else:
            self.grad_sample.disable_hooks()

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> ClientDPOptimizer:
        """The client's SGD behind ClientDPOptimizer (opacus'); sigma and the expected batch are set per loader."""
        for p in self.model.parameters():
            p.grad_sample = None
        if self.optimizer is not None:
            self.signal_history()  # keep the steps of an earlier optimizer of this client-round
            self.clipping_history()
        self.optimizer = ClientDPOptimizer(optimizer, noise_multiplier=0.0, max_grad_norm=self.settings.max_grad_norm,
                                           expected_batch_size=1, loss_reduction="mean")
        self.optimizer.signal_norms, self.optimizer.clipping = [], []
        self.optimizer.attach_step_hook(self._account)
        return self.optimizer

    def loader(self, base) -> PoissonBatches:
        """Poisson batches over `base`'s dataset (a client's training DataLoader), seeded from `base`'s seed."""
        if self.optimizer is None:
            raise RuntimeError("ClientDP.loader: wrap_optimizer must run first (the loop builds the optimizer)")
        n = len(base.dataset)
        self.q = sample_rate(n, int(base.batch_size))
        self.sigma = noise_multiplier_for(self.settings, self.q)
        self.lambda_sigma = lambda_noise_for(self.settings, self.q)
        self.optimizer.noise_multiplier = self.sigma
        self.optimizer.expected_batch_size = max(1, round(self.q * n))
        for module in self.model.modules():  # drop activations of a pass that never reached backward
            if hasattr(module, "activations"):
                module.activations = []
        for p in self.model.parameters():
            if hasattr(p, "_forward_counter"):
                p._forward_counter = 0
        gen = getattr(base, "generator", None)
        seed = gen.initial_seed() if gen is not None else int(torch.randint(2**62, (1,)))
        return PoissonBatches(base.dataset, base.collate_fn, self.q, seed=seed + 1)

    def is_empty(self, batch) -> bool:
        return isinstance(batch, EmptyBatch)

    def step_without_loss(self, batch, optimizer) -> torch.Tensor | None:
        """An empty Poisson draw steps on noise alone (`noise_only_step`); any other batch takes the loss's step."""
        return self.noise_only_step(optimizer) if self.is_empty(batch) else None

    def report(self, client, val_loader) -> dict:
        """The spent epsilon and the accounting numbers (privacy/report.py reduces them over the run)."""
        return {EPSILON_KEY: self.epsilon(), STATISTICS_KEY: self.statistics()}

    def noise_only_step(self, optimizer) -> torch.Tensor:
        """An empty Poisson batch: zero per-sample gradients, so the step is Gaussian noise alone (and is counted).

        Returns NaN as the step's gradient norm, a tensor like the loop's other norms."""
        params = self.optimizer.params
        for p in params:
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        measured, self.optimizer.signal_norms = self.optimizer.signal_norms, None  # no signal: not an NSR step
        try:
            optimizer.step()
        finally:
            self.optimizer.signal_norms = measured
        optimizer.zero_grad(set_to_none=True)
        return torch.tensor(math.nan, device=params[0].device if params else "cpu")

    def _account(self, optimizer: ClientDPOptimizer) -> None:
        self.accountant.step(noise_multiplier=optimizer.noise_multiplier, sample_rate=self.q)

    def account_stat(self) -> None:
        """One release of PUFFLE's noisy (k, z) counts (noise multiplier stat_sigma, the whole training split)."""
        if self.stat_history and self.stat_history[-1][0] == self.stat_sigma:
            self.stat_history[-1] = (self.stat_sigma, self.stat_history[-1][1] + 1)
        else:
            self.stat_history.append((self.stat_sigma, 1))

    def account_lambda(self) -> None:
        """One noisy batch-gap release of PUFFLE's lambda update (sigma_lambda at the DP-SGD sample rate)."""
        self.lambda_accountant.step(noise_multiplier=self.lambda_sigma, sample_rate=self.q)
