"""CPU time of the processes that serve a benchmark's calls, read from ``/proc`` (Linux).

``CpuMeter.sample()`` reads the user + system time of each watched process (the server process,
moto, this client process) and of every ``postgres`` process, grouped: the backends connected to
the benchmark's own databases (``postgres_backends``: named in their command line, ``postgres:
15/main: USER DATABASE HOST(PORT) STATE``), and PostgreSQL's processes that serve no one database
(``postgres_auxiliary``: the postmaster, WAL writer, checkpointer, background writer, autovacuum;
they also work for other databases' commits). Backends of other databases (other programs' tests
on a shared server) are left out. ``CpuMeter.since(before)`` is the CPU seconds per group between
two samples: a process that started in between counts from zero, one that ended in between is
lost from its group, but a backend that ended is counted in ``postgres_ended`` (the CPU time of
the postmaster's reaped children after ``before``: every database's backends that ended, other
programs' short-lived ones too; a pool that opens and closes connections under load shows here).
``postgres_other_databases`` is the other databases' running backends: the shared server's
other load. ``machine`` is the whole
machine's busy time from ``/proc/stat`` (every process, other users' included).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")
TICK_S: Final = 1.0 / os.sysconf("SC_CLK_TCK")
MACHINE: Final = "machine"
BACKENDS: Final = "postgres_backends"
AUXILIARY: Final = "postgres_auxiliary"
ENDED: Final = "postgres_ended"
OTHERS: Final = "postgres_other_databases"


def process_cpu_s(pid: int, *, reaped: bool = False) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), or with ``reaped`` of
    its children that ended and were waited for; None once it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    first = 13 if reaped else 11  # utime, stime: fields 14 and 15; cutime, cstime: 16 and 17
    return (int(fields[first]) + int(fields[first + 1])) * TICK_S


def machine_busy_s() -> float:
    """The machine's busy CPU seconds since boot, all CPUs: ``/proc/stat`` less idle and iowait."""
    ticks = [int(t) for t in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) * TICK_S


def postmaster_pid(postgres: Mapping[int, str]) -> int | None:
    """The PostgreSQL server's first process among ``postgres`` (the one whose parent is not a
    ``postgres`` process), whose reaped children are the backends that ended."""
    for pid in postgres:
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) not in postgres:
            return pid
    return None


def postgres_processes(databases: Collection[str]) -> dict[int, str]:
    """``{pid: group}`` of the running ``postgres`` processes: backends that serve
    ``databases`` (``BACKENDS``) or other databases (``OTHERS``), and those that serve no one
    database (``AUXILIARY``)."""
    found: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().split()
        except OSError:
            continue  # ended meanwhile
        client = command[4] if len(command) >= 5 and command[0] == "postgres:" else ""
        if "(" in client or client == "[local]":  # postgres: CLUSTER USER DATABASE HOST(PORT)
            found[int(entry.name)] = BACKENDS if command[3] in databases else OTHERS
        else:
            found[int(entry.name)] = AUXILIARY
    return found


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds since start of each process, by group, and the machine's busy seconds."""

    processes: Mapping[tuple[str, int], float]
    machine_s: float


@dataclass
class CpuMeter:
    """Samples the CPU time of ``watched`` (``{group: pid}``) and of the PostgreSQL processes
    that serve ``databases``."""

    watched: dict[str, int] = field(default_factory=dict)
    databases: Collection[str] = ()

    def sample(self) -> CpuSample:
        """Each process's CPU seconds so far, and the machine's."""
        pids = {pid: group for group, pid in self.watched.items()}
        processes = {}
        if self.databases:
            postgres = postgres_processes(self.databases)
            pids |= postgres
            postmaster = postmaster_pid(postgres)
            ended = None if postmaster is None else process_cpu_s(postmaster, reaped=True)
            if postmaster is not None and ended is not None:
                processes[(ENDED, postmaster)] = ended
        for pid, group in pids.items():
            used = process_cpu_s(pid)
            if used is not None:
                processes[(group, pid)] = used
        return CpuSample(processes, machine_busy_s())

    def since(self, before: CpuSample) -> dict[str, float]:
        """CPU seconds by group from ``before`` to now, with ``MACHINE``'s. ``ENDED`` is the
        postmaster's reaped children's time less what the processes that ended had already
        spent at ``before`` (so a long-lived backend of another database that ends adds only
        its last stretch)."""
        after = self.sample()
        spent = {group: 0.0 for group in self.watched}
        if self.databases:
            spent |= {BACKENDS: 0.0, AUXILIARY: 0.0, ENDED: 0.0, OTHERS: 0.0}
        for (group, pid), used in after.processes.items():
            spent[group] += used - before.processes.get((group, pid), 0.0)
        for (group, pid), used in before.processes.items():
            if group in (BACKENDS, AUXILIARY, OTHERS) and (group, pid) not in after.processes:
                spent[ENDED] -= used  # counted in the reaped time from its start
        spent[MACHINE] = after.machine_s - before.machine_s
        return spent
