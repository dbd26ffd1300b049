"""vCenter connections: one `vcenter`, or several named `vcenters`."""

from __future__ import annotations

import os
from urllib.parse import urlsplit
from pathlib import Path

from pydantic import Field, field_validator

from gpuvm.runbook.fields import HOSTNAME, Name
from gpuvm.runbook.strict import Seconds, Strict, shown
from gpuvm.secrets import without_password


class VCenter(Strict):
    url: str | None = None  # https://vcenter.example.com/sdk; default: GOVC_URL
    user: str | None = None  # default: GOVC_USERNAME
    password_env: str | None = Field(default=None, description="environment variable holding the password")
    insecure: bool | None = None  # true: TLS verification off (said so on every connect); default: GOVC_INSECURE
    ca_file: Path | None = None  # a CA bundle to verify vCenter's certificate; default: GOVC_TLS_CA_CERTS
    connect_timeout: Seconds = 15  # seconds to open a connection (TCP and TLS); past it, the vCenter is not reached
    call_timeout: Seconds = 120  # seconds a call may wait for its answer; past it, the vCenter is not answering

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and (problem := url_problem(value)):
            raise ValueError(f"{shown(without_password(value))} {problem}")
        return value


class NamedVCenter(VCenter):
    """One of several vCenters (`vcenters:`): hosts and VMs name theirs with `vcenter: <name>`."""

    name: Name  # how hosts and VMs name it (vcenter: <name>), and a --target for all its hosts and VMs


DEFAULT_VCENTER = "default"  # the name of the one vCenter of a runbook that gives `vcenter:` (or neither)


def env_flag(name: str) -> bool | None:
    """A govc-style boolean variable (GOVC_INSECURE): None when unset or empty."""
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a vCenter address (None when it can): scheme, host and port checked."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        return "contains control characters"
    try:
        parts = urlsplit(url if "://" in url else "https://" + url)
        port = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError as e:
        return f"is not a valid URL ({without_password(str(e))})"  # Python may quote the netloc
    if port == 0:
        return "names port 0 (leave the port out for 443)"
    if parts.scheme != "https":
        return f"is not an https URL like https://vcenter.example.com/sdk ('{parts.scheme}://': vCenter speaks https)"
    if not parts.hostname:
        return "names no host (a URL like https://vcenter.example.com/sdk)"
    if not HOSTNAME.fullmatch(parts.hostname) and ":" not in parts.hostname:  # IPv6 literals were checked
        return "is not a URL like https://vcenter.example.com/sdk (the host name has characters no host has)"
    return None


def vcenter_address(url: str) -> str:
    """What tells one vCenter's URL from another's: https://host:port/path, case folded, the defaults
    filled in (port 443, path /sdk), no user or password: "VC1" and "https://vc1:443/SDK/" are one."""
    parts = urlsplit(url if "://" in url else "https://" + url)
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return f"https://{host}:{parts.port or 443}{parts.path.rstrip('/').lower() or '/sdk'}"
