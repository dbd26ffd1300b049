"""A clone's identity on first boot, for cloud-init's VMware datasource.

The datasource reads `guestinfo.metadata` (instance-id, local-hostname, netplan-style network
config) and `guestinfo.userdata` (cloud-config) from the VM's extraConfig, each with its
`.encoding` key (`base64`): cloud-init docs, "Datasources: VMware", and VMware's archived
cloud-init-vmware-guestinfo README. gpuvm sets them once, in the clone spec; the user data
carries the SSH public key and nothing else, so no secret ever goes into extraConfig.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from gpuvm.files import KEY_BYTES, read_text_capped
from gpuvm.runbook.vms import CloudInit

PUBLIC_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-")


def public_key_problem(text: str) -> str | None:
    """Why `text` is not one OpenSSH public key line (None when it is)."""
    if "PRIVATE KEY" in text:
        return "is a private key: give the .pub file (the private key must never go into guestinfo)"
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith(PUBLIC_KEY_TYPES):
        return "is not one OpenSSH public key line (ssh-ed25519 AAAA... comment)"
    return None


def read_public_key(path: Path) -> str:
    """The key file's text: a regular file of at most KEY_BYTES (FileRefused otherwise)."""
    return read_text_capped(path, KEY_BYTES, "SSH public key")


def metadata(vm: str, ci: CloudInit) -> dict:
    nic: dict = {"match": {"name": ci.interfaces}}
    if ci.address == "dhcp":
        nic["dhcp4"] = True
    else:
        nic["addresses"] = [ci.address]
        if ci.gateway:
            nic["routes"] = [{"to": "default", "via": ci.gateway}]
    if ci.nameservers:
        nic["nameservers"] = {"addresses": list(ci.nameservers)}
    return {"instance-id": vm, "local-hostname": ci.hostname or vm,
            "network": {"version": 2, "ethernets": {"nics": nic}}}


def userdata(public_key: str) -> str:
    return "#cloud-config\n" + json.dumps({"ssh_authorized_keys": [public_key.strip()]}) + "\n"


def guestinfo(vm: str, ci: CloudInit, public_key: str) -> dict[str, str]:
    """The extraConfig keys a clone gets: metadata and user data, base64 with their encodings."""
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {"guestinfo.metadata": b64(json.dumps(metadata(vm, ci))), "guestinfo.metadata.encoding": "base64",
            "guestinfo.userdata": b64(userdata(public_key)), "guestinfo.userdata.encoding": "base64"}

