"""How many CPU threads torch uses when `--threads` is not given, chosen from the cores that are free now.

torch's own choice is one thread per core, whatever else runs: on a busy machine every parallel region then waits for
a thread whose core is taken, and a small model's step gets several times slower than at one thread (`goldfish
train` on 2 cores under 2 busy processes: 3.8x). So the command counts the cores that are idle while it sleeps for a
tenth of a second (/proc/stat; the 1-minute load average where there is none) and uses that many threads, at least
one. OpenMP's passive wait policy (threads sleep at once when idle instead of spinning, `wait_policy_environment`)
limits the damage when the load only starts after the choice. `bench/threads.py` measures both.

Nothing here runs at import: the entry point sets the environment, the commands call `apply_threads` once their
settings are checked (a refusal stays one line).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Mapping, MutableMapping

# A core counts as free when at least this share of it is idle: a thread on a core that is half taken makes every
# parallel region wait for it, which costs more than running on one thread fewer.
FREE_CORE_IDLE_SHARE = 0.75
SAMPLE_SECONDS = 0.1  # long enough for ten scheduler ticks (USER_HZ 100) per core; short beside any run
WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
THREADS_VARIABLE = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """threads: torch CPU threads to set (None: leave torch's choice, e.g. OMP_NUM_THREADS decided it);
    shown: the count to print; reason: why, in a few words."""

    threads: int | None
    shown: int
    reason: str

    def line(self) -> str:
        """The one line the commands print on stderr, e.g. `threads: 1 (0.1 of 2 cores free; --threads N to set)`."""
        return f"threads: {self.shown} ({self.reason})"


def wait_policy_environment(environ: MutableMapping[str, str], *, busy: bool = True) -> None:
    """Ask OpenMP for its passive wait policy when the machine is `busy` and the user chose no policy: idle threads
    sleep at once instead of spinning on cores other processes need (on 2 busy cores a step is 9x faster). On a quiet
    machine spinning is faster (bench/threads.py: 157 ms against 190 ms a step at 2 threads), so it is kept. It must
    be in the environment before torch loads OpenMP (the entry point's first lines, the --nproc workers'
    environment); later it has no effect."""
    if busy:
        environ.setdefault(WAIT_POLICY_VARIABLE, "PASSIVE")


def machine_is_busy(sample_seconds: float = SAMPLE_SECONDS) -> bool:
    """Whether some of this process's cores are taken now (fewer free than usable by more than a quarter core; True
    when it cannot be told): what `wait_policy_environment` needs to know before torch loads."""
    free = free_cores(sample_seconds)
    return free is None or free < usable_cores() - (1.0 - FREE_CORE_IDLE_SHARE)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(idle, total) jiffies summed over `cpus` from /proc/stat; None without it. Idle counts idle and iowait."""
    try:
        lines = open("/proc/stat").read().splitlines()
    except OSError:
        return None
    idle = total = 0.0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [float(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle += values[3] + values[4]
            total += sum(values)
    return (idle, total) if total else None


def free_cores(sample_seconds: float = SAMPLE_SECONDS) -> float | None:
    """How many of this process's cores were idle over the next `sample_seconds` (it sleeps meanwhile, so its own
    work does not count); from /proc/stat, else `usable_cores() - 1-minute load average`; None where neither
    exists."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        cpus = None
    before = _cpu_times(cpus) if cpus else None
    if before is not None:
        time.sleep(sample_seconds)
        after = _cpu_times(cpus)
        if after is not None and after[1] > before[1]:
            return len(cpus) * (after[0] - before[0]) / (after[1] - before[1])
    try:
        return max(0.0, usable_cores() - os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def choose_threads(usable: int, free: float) -> int:
    """Threads for `free` idle cores out of `usable`: the cores at least FREE_CORE_IDLE_SHARE idle, rounding
    `free` down unless it is that close to the next whole core; at least 1, at most `usable`."""
    return max(1, min(usable, int(free + 1.0 - FREE_CORE_IDLE_SHARE)))


def decide_threads(
    requested: int | None, environ: Mapping[str, str], *, usable: int, free: float | None
) -> ThreadChoice:
    """The thread count of a run: `--threads` when given, else OMP_NUM_THREADS when set (torch already follows it),
    else `choose_threads` over the free cores (all usable cores when they cannot be counted)."""
    if requested is not None:
        return ThreadChoice(requested, requested, "--threads")
    if environ.get(THREADS_VARIABLE, "").strip().isdigit():
        count = int(environ[THREADS_VARIABLE])
        return ThreadChoice(None, count, f"{THREADS_VARIABLE}={count}")
    hint = "--threads N to set"
    if usable == 1:
        return ThreadChoice(1, 1, f"1 usable core; {hint}")
    if free is None:
        return ThreadChoice(usable, usable, f"{usable} usable cores, load unknown; {hint}")
    chosen = choose_threads(usable, free)
    return ThreadChoice(chosen, chosen, f"{free:.1f} of {usable} cores free; {hint}")


def apply_threads(requested: int | None, *, report: bool = True) -> ThreadChoice:
    """Decide this process's torch CPU threads (`decide_threads`) and set them. When the command chose the count
    itself (no --threads, no OMP_NUM_THREADS) and `report` (the main process of a run), the choice is printed as
    one line on stderr; a count the user gave is not repeated back. Counting free cores sleeps SAMPLE_SECONDS."""
    import torch

    counting = requested is None and not os.environ.get(THREADS_VARIABLE, "").strip().isdigit()
    usable = usable_cores()
    choice = decide_threads(
        requested, os.environ, usable=usable, free=free_cores() if counting and usable > 1 else None
    )
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    if report and counting:
        policy = os.environ.get(WAIT_POLICY_VARIABLE)
        wait = f"{WAIT_POLICY_VARIABLE}={policy}" if policy else "OpenMP's spinning wait: the machine was idle"
        print(f"{choice.line()}; {wait}", file=sys.stderr, flush=True)
    return choice
