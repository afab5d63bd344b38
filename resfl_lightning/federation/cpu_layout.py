"""`fabric.devices=cores` (`make train`'s default): on the CPU as many processes as the machine has usable cores, up to
the clients of a node (a process owns at least one client), and the remaining cores as threads of each process; on
an accelerator Fabric's 'auto' (every visible device). A pure function of the config and the core count, so the
launcher's re-run of the command in each process resolves the same layout."""

from __future__ import annotations

import os

CORES = "cores"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or taskset's limit), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_layout(devices, threads_per_process: int, num_clients: int, num_nodes: int, accelerator: str = "cpu",
               cores: int | None = None) -> tuple[object, int]:
    """(devices, threads per process) for Fabric: unchanged unless devices is 'cores', which becomes
    min(cores, clients per node) processes with cores // processes threads each on the CPU, 'auto' elsewhere."""
    if devices != CORES:
        return devices, threads_per_process
    if accelerator != "cpu":
        return "auto", threads_per_process
    cores = usable_cores() if cores is None else cores
    processes = max(1, min(cores, num_clients // max(num_nodes, 1)))
    return processes, max(1, cores // processes)
