"""Which NVIDIA vGPU guest drivers work with which NVIDIA vGPU manager (ESXi host driver).

NVIDIA's rule, from "Compatibility Requirements for the NVIDIA vGPU Manager and Guest VM Driver"
in the Virtual GPU Software release notes for VMware vSphere (vGPU 19, R580, section 1.2:
https://docs.nvidia.com/vgpu/19.0/grid-vgpu-release-notes-vmware-vsphere/index.html):
"The releases of the NVIDIA vGPU Manager and guest VM drivers that you install must be compatible.
If you install an incompatible guest VM driver release for the release of the vGPU Manager that you
are using, the NVIDIA vGPU fails to load." Compatible are: the manager with guest drivers from the
same release (the R418–R535 notes: from any release of the same major release branch); a manager
from a later major release branch with guest drivers from the previous branch; a manager from a
later long-term support branch with guest drivers from the previous long-term support branch.
A guest driver newer than the manager's branch never is.

A driver version's branch is its first number (535.154.05 → R535); the table below maps branches
to vGPU releases as NVIDIA's release notes list them ("NVIDIA vGPU Software Driver Versions") and
marks the long-term support branches (NVIDIA's vGPU software lifecycle page). A branch it does not
know is compatible with its own branch only.
"""

from __future__ import annotations

# driver branch → (vGPU software release, long-term support branch)
BRANCHES: dict[int, tuple[int, bool]] = {
    418: (8, False), 430: (9, False), 440: (10, False), 450: (11, True), 460: (12, False),
    470: (13, True), 510: (14, False), 525: (15, False), 535: (16, True), 550: (17, False),
    570: (18, False), 580: (19, False),  # 19: check NVIDIA's lifecycle page before marking it LTS
}


def branch(version: str) -> int:
    """535.154.05 → 535."""
    return int(version.split(".", 1)[0])


def describe(version: str) -> str:
    """'535.154.02 (vGPU 16, R535)', or '… (R600)' for a branch the table does not know."""
    known = BRANCHES.get(branch(version))
    return f"{version} (vGPU {known[0]}, R{branch(version)})" if known else f"{version} (R{branch(version)})"


def compatible(manager: str, guest: str) -> bool:
    """Whether a guest driver of version `guest` loads on a vGPU manager of version `manager`."""
    host_branch, guest_branch = branch(manager), branch(guest)
    if host_branch == guest_branch:
        return True
    order = sorted(BRANCHES)
    if host_branch not in BRANCHES or guest_branch not in BRANCHES or guest_branch > host_branch:
        return False
    older = order[:order.index(host_branch)]
    if older and guest_branch == older[-1]:  # the previous major release branch
        return True
    older_lts = [b for b in older if BRANCHES[b][1]]
    return BRANCHES[host_branch][1] and bool(older_lts) and guest_branch == older_lts[-1]


def incompatibility(manager: str, guest: str) -> str | None:
    """Why the guest driver does not work with the manager (None: it does), in NVIDIA's words."""
    if compatible(manager, guest):
        return None
    return (f"guest driver {describe(guest)} does not load on the host's vGPU manager {describe(manager)}: "
            "NVIDIA's vGPU guest driver must come from the manager's release branch (or the branch just before "
            "it, or the previous long-term support branch on a long-term support manager); see "
            "\"Compatibility Requirements for the NVIDIA vGPU Manager and Guest VM Driver\" in NVIDIA's "
            "Virtual GPU Software release notes")
