"""Pairing checks of the robustness grid: an attacked run differs from its clean reference only in the attack (and,
with clean_reference: shared, the f the defence is told), checked on the composed configs before any run and on the
saved configs of finished runs."""

from __future__ import annotations

from pathlib import Path

from resfl_lightning.analysis.robustness_grid import CLEAN, Cell, clean_of, clean_reference_mode, run_dir_for


def assumed_f_keys(grid: dict, defence: str) -> set[str]:
    """The config keys through which the defence is told f (its overrides with a {f} or {trim_beta} field): the one
    setting besides the attack in which an attacked run may differ from its clean run (none with clean_reference:
    same_f, where the clean run is told the same f)."""
    if clean_reference_mode(grid) == "same_f":
        return set()
    return {o.split("=", 1)[0] for o in grid["defences"][defence]["overrides"] if "{" in o}


def pair_mismatch(clean: dict, attacked: dict, assumed_f: set[str]) -> list[str]:
    """The settings other than the attack, the assumed f and where the run lives in which an attacked run's config
    differs from its clean reference's ('key: clean -> attacked'; [] when they pair)."""
    from resfl_lightning.analysis.run_settings import LOCATION_KEYS, TRANSFER_KEYS, legacy_aware_diff

    def allowed(key: str) -> bool:
        return (key == "attack" or key.startswith("attack.") or key in assumed_f or key in TRANSFER_KEYS
                or key.split(".", 1)[0] in LOCATION_KEYS)

    # A key added between the two runs' trainings pairs when the later run holds its legacy value (ADDED_KEYS).
    return [line for line in legacy_aware_diff(clean, attacked, both_ways=True) if not allowed(line.split(":", 1)[0])]


def unpaired_cells(grid: dict, cells: list[Cell], composed) -> list[str]:
    """Plan-time check: for each attacked cell, what its composed config (composed(cell) on the first seed) changes
    beyond the attack against its defence's clean cell."""
    out = []
    references: dict[Cell, dict] = {}  # each clean config, composed once
    for cell in cells:
        if cell.attack == CLEAN:
            continue
        clean = clean_of(grid, cell)
        if clean not in references:
            references[clean] = composed(clean)
        diff = pair_mismatch(references[clean], composed(cell), assumed_f_keys(grid, cell.defence))
        if diff:
            out.append(f"{cell.name}: " + "; ".join(diff[:4]))
    return out


def unpaired_runs(grid: dict, cells: list[Cell], seeds: list[int], out: Path) -> list[str]:
    """Read-time check: the finished attacked runs whose saved config (what they were trained with) differs from
    their clean run's beyond the attack; one line each."""
    import yaml

    def saved(cell: Cell, seed: int) -> dict | None:
        run_dir = run_dir_for(out, cell, seed)
        if not (run_dir / "summary.json").is_file() or not (run_dir / "config.yaml").is_file():
            return None  # unfinished, or saved no config to compare (as the stale-run check treats it)
        return yaml.load((run_dir / "config.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))

    lines = []
    for s in seeds:
        references: dict[Cell, dict | None] = {}
        for cell in cells:
            if cell.attack == CLEAN:
                continue
            reference = clean_of(grid, cell)
            if reference not in references:
                references[reference] = saved(reference, s)
            clean, mine = references[reference], saved(cell, s)
            if clean is None or mine is None:
                continue
            diff = pair_mismatch(clean, mine, assumed_f_keys(grid, cell.defence))
            if diff:
                lines.append(f"{run_dir_for(out, cell, s).name}: " + "; ".join(diff[:4]))
    return lines
