"""Guests for the image fan-out test and bench: real Docker, the SSH mesh, a small image on the builder.

`add_guests` boots extra guests (the way a cloned VM boots, `TestBed.boot`) when the bed has fewer
than asked; `small_image` imports a tarball of random bytes (nothing to compress, no registry, no
build) under the recipe's name:tag on the builder, as if it had built it.
"""

from __future__ import annotations

import base64
import json
import os
import tarfile
import tempfile
import threading
from pathlib import Path

from bed import TestBed

EXTRA_PREFIX = "fan-"
EXTRA_FIRST_OCTET = 230  # booted guests at 10.250.0.230 and up, clear of the bed's own


def add_guests(bed: TestBed, count: int) -> tuple[list[str], list[str]]:
    """(every guest to use, the ones booted here): the bed's guests first, then booted ones."""
    own = [h.name for h in bed.hosts if h.role == "guest"][:count]
    added = []
    user_data = "#cloud-config\n" + json.dumps({"ssh_authorized_keys": [Path(f"{bed.client_key}.pub").read_text().strip()]})
    for i in range(count - len(own)):
        name = f"{EXTRA_PREFIX}{i + 1:02d}"
        meta = {"network": {"ethernets": {"eth0": {"addresses": [f"10.250.0.{EXTRA_FIRST_OCTET + i}/24"]}}}}
        bed.boot(name, base64.b64encode(json.dumps(meta).encode()).decode(),
                 base64.b64encode(user_data.encode()).decode())
        added.append(name)
    return own + added, added


def start_docker(bed: TestBed, names: list[str]) -> None:
    """Every guest's dockerd, started side by side."""
    _each(bed.start_docker, names)


def _each(fn, names: list[str]) -> None:
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            fn(name)
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def stop_docker(bed: TestBed, names: list[str]) -> None:
    """Every guest's dockerd, stopped side by side (each waits for its daemon to end)."""
    _each(bed.stop_docker, names)


def small_image(bed: TestBed, guest: str, ref: str, size: int) -> str:
    """Import `size` random bytes as image `ref` on `guest`; its id."""
    with tempfile.TemporaryDirectory(prefix="gpuvm-fanout-") as tmp:
        blob, tar = Path(tmp) / "blob", Path(tmp) / "rootfs.tar"
        blob.write_bytes(os.urandom(size))
        with tarfile.open(tar, "w") as t:
            t.add(blob, arcname="blob")
        bed.docker(guest, "import", str(tar), ref)
    return bed.docker(guest, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()


def write_runbook(bed: TestBed, names: list[str], path: Path) -> Path:
    """Every guest with the mesh and a CPU image; its own known_hosts (booted guests included)."""
    known = path.parent / "known_hosts"
    known.write_text("".join(bed.host(n).host_key_line + "\n" for n in names))
    lines = [f"ssh: {{known_hosts: {known}, connect_timeout: 10, command_timeout: 120}}",
             "hosts: [{name: esx-01}]", "vms:", *[f"  - {{name: {n}, host: esx-01}}" for n in names],
             "guests:", "  image: {name: gpuvm/fanout, gpus: false}", "  ssh_mesh: {}", "  hosts:"]
    lines += [f"    - {{vm: {n}, ssh: {{address: {bed.address(n)}, user: {bed.host(n).user}, "
              f"key_file: {bed.client_key}, sudo: true}}}}" for n in names]
    path.write_text("\n".join(lines) + "\n")
    return path
