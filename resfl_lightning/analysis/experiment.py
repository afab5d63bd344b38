"""What every experiment command does around its own plan and report: refuse finished runs trained with other
settings than the plan gives them now, train the missing runs, refuse to publish from a tree with uncommitted
changes, and raise after writing when a run failed. One error type for all of it, so the commands fail alike."""

from __future__ import annotations

from pathlib import Path


class ExperimentError(RuntimeError):
    """An experiment cannot run or finish as asked; the message says why (the CLI prints it and exits non-zero)."""


def refuse_stale(jobs: list[tuple[Path, list[str]]], where: Path) -> None:
    """Raise when a finished run of `jobs` ((run_dir, overrides)) saved another config than its overrides compose to
    now: skipping it would mix runs of other settings into the results."""
    from resfl_lightning.analysis.run_settings import stale_runs

    stale = stale_runs(jobs)
    if stale:
        raise ExperimentError(f"{len(stale)} finished runs in {where} were trained with other settings than this "
                              "command gives them (an older preset, tuned file or other ARGS); results mixing them "
                              "would compare unlike runs. Move them away or pass --out DIR:\n" + "\n".join(stale))


def refuse_dirty_publish(results: Path | None) -> None:
    """A results file is published from committed code only: its header names one commit for what produced it."""
    from resfl_lightning.analysis.checkout import git_commit

    if results is not None and "uncommitted" in (commit := git_commit()):
        raise ExperimentError(f"--results {results}: the checkout has uncommitted changes ({commit}); commit them "
                              "first (or leave out --results: the command's own folder still gets its files)")


def raise_failures(failures: list[str], runs: int, where: Path) -> None:
    """After the command wrote what it could: a failed run fails the command (the same command retries it)."""
    if failures:
        raise ExperimentError(f"{len(failures)} of {runs} runs failed (the files in {where} show them as missing; "
                              "re-run the same command to retry them):\n" + "\n".join(failures))
