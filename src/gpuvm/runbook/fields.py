"""Field types and checks the runbook's sections share: names, references, PCI addresses and ids,
image references, versions, download URLs and digests."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from gpuvm.runbook.strict import checked_name, checked_reference, shown

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCI_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
# Image references as Docker reads them (distribution/reference's grammar, without IPv6 hosts), so
# nothing the Dockerfile or a docker command line would read as more than a name gets through.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
IMAGE_NAME = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
IMAGE_REFERENCE = re.compile(rf"{IMAGE_NAME.pattern}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                             r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")
REGISTRY = re.compile(rf"{_DOMAIN}(?:/{_COMPONENT})*")
VERSION = re.compile(r"[0-9][0-9A-Za-z.+-]{0,39}")
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
MAX_MMIO_GB = 1 << 16  # 64 TB: far beyond any GPU set; a larger figure is a typo


def pci_address(value: str) -> str:
    value = value.strip().lower()
    if len(value) == 7:  # '17:00.0' → domain 0000
        value = "0000:" + value
    if not PCI_ADDRESS.match(value):
        raise ValueError(f"'{value}' is not a PCI address like 0000:17:00.0")
    return value


def pci_id(value: str) -> str:
    value = value.strip().lower().replace("0x", "")
    if not PCI_ID.match(value):
        raise ValueError(f"'{value}' is not a vendor:device id like 10de:20b5")
    return value


Name = Annotated[str, AfterValidator(checked_name)]  # hosts, VMs, vCenters as named in vCenter
Reference = Annotated[str, AfterValidator(checked_reference)]  # a host or VM: name, or <vcenter>/<name>

def address_with_prefix(value: str) -> str:
    import ipaddress

    try:
        ipaddress.ip_interface(value)
    except ValueError:
        raise ValueError(f"'{value}' is not an address with prefix like 192.168.100.11/24") from None
    if "/" not in value:
        raise ValueError(f"'{value}' needs a prefix length, like {value}/24")
    return value

def download_url(value: str) -> str:
    """An http(s) or file URL the guests fetch with curl; `{version}` is filled in."""
    if not re.fullmatch(r"(https?|file)://[^\s'\"]+", value):
        raise ValueError(f"{shown(value)} is not an http(s):// or file:// URL")
    return value


def sha256_field(value: str | None, what: str) -> str | None:
    """An installer's sha256, lowercase: required, since `what` runs as root on every guest (a
    "missing" error, so that the message names the field itself)."""
    if value is None:
        raise PydanticCustomError("missing", f"{what}'s sha256 is required")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise ValueError(f"{shown(value)} is not a sha256 digest (64 hexadecimal digits, as sha256sum prints them)")
    return value.lower()


def driver_version(value: str, example: str) -> str:
    """An NVIDIA driver version as nvidia-smi reports it (`example` shown when it is not one)."""
    if not re.fullmatch(r"\d{3}\.\d{2,3}(\.\d{2})?", value):
        raise ValueError(f"{shown(value)} is not an NVIDIA driver version like {example}")
    return value
