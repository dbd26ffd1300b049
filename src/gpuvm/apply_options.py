"""What the user lets `apply` do, and how many targets it may change at once: the command line's
`--allow-*` flags and bounds, one frozen value the CLI builds once and `runs`, the engine
(`check_allowed`) and a benchmark campaign's setups (`bench.stages.preflight`) read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ApplyOptions:
    """`gpuvm apply`'s flags (and `gpuvm bench run`'s, for its setups). The defaults allow nothing
    disruptive: a change that needs a flag not given is refused before anything is touched."""

    allow_power_off: bool = False  # VMs may be powered off (guest shutdown first)
    allow_host_reboot: bool = False  # hosts may enter maintenance mode and reboot
    allow_destroy: bool = False  # VMs the runbook marks `state: absent` may be destroyed
    allow_repeat_reboot: bool = False  # a host may reboot again for a change still pending after gpuvm rebooted it
    parallel: int = 8  # targets changed at once
    max_unavailable: int = 1  # hosts rebooted at once
    shutdown_timeout: float = 300.0  # seconds to wait for a guest shutdown
    drain_timeout: float | None = None  # seconds a host reboot waits for the Slurm jobs on its nodes; None: refused
