"""VM groups: one `vms:` entry that stands for several VMs, expanded before the runbook is validated.

    - name: train-{n:02d}        # {n}: 1, 2, …; {index}: 0, 1, … (format specs allowed)
      count: 4                   # default: one VM per host of `hosts`
      hosts: [esx-01, esx-02]    # round robin: train-01 on esx-01, train-02 on esx-02, train-03 on esx-01 …
      cloud_init: {address: 10.0.0.21/24, ...}   # the first VM's; the next ones count up (.22, .23 …)
      ...                        # every other field as in a single VM entry, the same for each

Each expanded VM keeps the lines of its group's fields, and its place reads as the group's with the
VM's name: an error in train-03 reads `file:line: vms[1] (train-03).cpus: …`.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any


MAX_GROUP = 4096
Lines = dict[tuple[str | int, ...], int]


def _is_group(item: Any) -> bool:
    return isinstance(item, dict) and ("count" in item or "hosts" in item)


def expand_vm_groups(data: dict, lines: Lines, where: Any) -> tuple[Lines, dict[tuple, str]]:
    """Replace each group in data["vms"] by its VMs (in place); return the line map for the expanded
    list and how each expanded VM's place reads (("vms", 3) → "vms[1] (train-03)"). `where(loc,
    message)` makes the InputError of a group field."""
    vms = data.get("vms")
    if not isinstance(vms, list) or not any(_is_group(item) for item in vms):
        return lines, {}
    shown: dict[tuple, str] = {}
    out: list[Any] = []
    new_lines = {k: v for k, v in lines.items() if k[:1] != ("vms",)}
    if ("vms",) in lines:
        new_lines[("vms",)] = lines[("vms",)]
    by_entry: dict[Any, list[tuple[tuple[str | int, ...], int]]] = {}  # g → the lines under ("vms", g), in order
    for key, line in lines.items():
        if len(key) >= 2 and key[0] == "vms":
            by_entry.setdefault(key[1], []).append((key[2:], line))
    for g, item in enumerate(vms):
        members = _expand(item, g, where) if _is_group(item) else [item]
        entry_lines = by_entry.get(g, [])
        if _is_group(item):  # not the lines of hosts' items: its VMs have no hosts (and no error names them)
            entry_lines = [(rest, line) for rest, line in entry_lines if not (len(rest) > 1 and rest[0] == "hosts")]
        for member in members:
            j = len(out)
            out.append(member)
            for rest, line in entry_lines:
                new_lines[("vms", j) + rest] = line
            if _is_group(item):
                shown[("vms", j)] = f"vms[{g}] ({member['name']})"
                if ("vms", g, "hosts") in lines:
                    new_lines[("vms", j, "host")] = lines[("vms", g, "hosts")]
            elif j != g:
                shown[("vms", j)] = f"vms[{g}]"
    data["vms"] = out
    return new_lines, shown


def _expand(group: dict, g: int, where: Any) -> list[dict]:
    hosts = group.get("hosts")
    if "host" in group and hosts is not None:
        raise where(("vms", g, "hosts"), "give host (all on one host) or hosts (spread over them), not both")
    if hosts is None:
        hosts = [group.get("host")] if group.get("host") is not None else []
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise where(("vms", g, "hosts"), "a VM group needs hosts: a list of host names (or host: one name)")
    count = group.get("count", len(hosts))
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_GROUP:
        raise where(("vms", g, "count"), f"count must be a whole number from 1 to {MAX_GROUP}")
    pattern = group.get("name")
    if not isinstance(pattern, str):
        raise where(("vms", g, "name"), "a VM group needs name: a pattern like train-{n:02d}")
    names = [_name(pattern, n, g, where) for n in range(1, count + 1)]
    if count > 1 and len(set(names)) == 1:
        raise where(("vms", g, "name"), f"name '{pattern}' gives every VM of the group the same name: use {{n}} "
                                        "or {index}, like train-{n:02d}")
    members = []
    for k, name in enumerate(names):
        vm = {key: copy.deepcopy(value) for key, value in group.items() if key not in ("count", "hosts")}
        vm["name"], vm["host"] = name, hosts[k % len(hosts)]
        _next_address(vm, k)
        members.append(vm)
    return members


def _name(pattern: str, n: int, g: int, where: Any) -> str:
    try:
        return pattern.format(n=n, index=n - 1)
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise where(("vms", g, "name"), f"name pattern '{pattern}' cannot be filled in ({type(e).__name__}: {e}); "
                                        "it may use {n} (1, 2, …) and {index} (0, 1, …), like train-{n:02d}") from None


def _next_address(vm: dict, k: int) -> None:
    """The k-th VM of a group gets the group's static address plus k; anything else is left to the
    model's checks."""
    cloud_init = vm.get("cloud_init")
    if not isinstance(cloud_init, dict) or k == 0:
        return
    address = cloud_init.get("address")
    if not isinstance(address, str) or address == "dhcp":
        return
    try:
        interface = ipaddress.ip_interface(address)
    except ValueError:
        return
    cloud_init["address"] = f"{interface.ip + k}/{interface.network.prefixlen}"


