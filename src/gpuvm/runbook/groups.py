"""VM groups: one `vms:` entry that stands for several VMs, expanded before the runbook is validated.

    - name: train-{n:02d}        # {n}: 1, 2, …; {index}: 0, 1, … (format specs allowed)
      count: 4                   # default: one VM per host of `hosts`
      hosts: [esx-01, esx-02]    # round robin: train-01 on esx-01, train-02 on esx-02, train-03 on esx-01 …
      cloud_init: {address: 10.0.0.21/24, ...}   # the first VM's; the next ones count up (.22, .23 …)
      ...                        # every other field as in a single VM entry, the same for each

Each expanded VM keeps the lines of its group's fields, and its place reads as the group's with the
VM's name: an error in train-03 reads `file:line: vms[1] (train-03).cpus: …`.

What a group expands to is bounded before it is expanded: its count, the width of each field of its
name (`{n:0999999999}` would make names of a gigabyte each), the pattern's length, and the values of
every group together (document.MAX_NODES, as for YAML aliases).
"""

from __future__ import annotations

import copy
import ipaddress
import re
import string
from typing import Any

from gpuvm.runbook.document import MAX_NODES, expanded_size

MAX_GROUP = 4096
MAX_WIDTH = 80  # a name field's width or precision: a VM name's length (strict.NAME)
MAX_PATTERN = 256  # characters in a name pattern
# the standard format spec: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<precision>\d*))?[a-zA-Z%]?", re.S)
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
    _check_size(vms, where)
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
    count = _count(group, hosts, g, where)
    pattern = group.get("name")
    if not isinstance(pattern, str):
        raise where(("vms", g, "name"), "a VM group needs name: a pattern like train-{n:02d}")
    _check_pattern(pattern, g, where)
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


def _count(group: dict, hosts: list, g: int, where: Any) -> int:
    count = group.get("count", len(hosts))
    if "count" not in group and count > MAX_GROUP:
        raise where(("vms", g, "hosts"), f"{count:,} hosts, one VM each: at most {MAX_GROUP} VMs in a group "
                                         "(give count to place fewer)")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_GROUP:
        raise where(("vms", g, "count"), f"count must be a whole number from 1 to {MAX_GROUP}")
    return count


def _check_size(vms: list, where: Any) -> None:
    """The VMs' values once every group is expanded, counted before any is: at most MAX_NODES."""
    total = 0
    for g, item in enumerate(vms):
        if not _is_group(item):
            total += expanded_size(item, {})
            continue
        hosts = item.get("hosts", [item.get("host")])
        count = _count(item, hosts if isinstance(hosts, list) and hosts else [None], g, where)
        size = expanded_size({k: v for k, v in item.items() if k not in ("count", "hosts")}, {})
        total += count * size
        if total > MAX_NODES:
            raise where(("vms", g, "count"), f"the VM groups expand to more than {MAX_NODES:,} values (this "
                                             f"one: {count:,} VMs of {size:,} values each); split the runbook")


def _check_pattern(pattern: str, g: int, where: Any) -> None:
    """A pattern whose names stay small: bounded before any name is made."""
    if len(pattern) > MAX_PATTERN:
        raise where(("vms", g, "name"), f"name pattern of {len(pattern):,} characters: at most {MAX_PATTERN}")
    try:
        fields = [(name, spec) for _, name, spec, _ in string.Formatter().parse(pattern) if name is not None]
    except ValueError:
        return  # unbalanced braces: filling it in (_name) says so
    for name, spec in fields:
        if "{" in (spec or ""):  # {n:{index}}: a width that grows with the count
            raise where(("vms", g, "name"), f"name pattern '{pattern}': field {{{name}}}'s format spec may not "
                                            "hold another field")
        parts = SPEC.fullmatch(spec or "")
        for part in ("width", "precision"):
            if parts is not None and int(parts[part] or 0) > MAX_WIDTH:  # a spec not matched: filling in says why
                raise where(("vms", g, "name"), f"name pattern '{pattern}': field {{{name}}} has a {part} of "
                                                f"{int(parts[part]):,}; at most {MAX_WIDTH} (a VM name's length)")


def _name(pattern: str, n: int, g: int, where: Any) -> str:
    try:
        return pattern.format(n=n, index=n - 1)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
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


