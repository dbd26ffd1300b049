"""What a guest says is untrusted input: each value is held to the grammar of what it names before it
is used anywhere (a command line, a file name, a launcher's environment, the journal, a report), and
text shown to the operator never carries control characters.

A tenant's guest answering `ibdev2netdev` with a port name holding `$(…)` must not get that text
into an MCA value that Open MPI forwards to the other nodes inside double quotes; an image id or a
port name holding `ESC ]0;…BEL` must not retitle the operator's window.
"""

from __future__ import annotations

import re

from gpuvm.errors import RemoteCommandError

# Control characters but newline and tab: C0, DEL and C1 (ESC starts terminal sequences, BEL ends
# some, CR rewrites the line, C1's CSI 0x9b is ESC [ on some terminals).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
SHOWN = 80  # characters of an invalid value an error quotes

# Linux's limit (IFNAMSIZ 16 with the NUL); ':' for the alias labels `ip` prints (eth0:1). A leading
# '-' is refused too: no real interface has one, and a command line would read it as an option.
INTERFACE = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,14}")
RDMA_DEVICE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # mlx5_0, mlx5_bond_0, rocep202s0f0
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
PCI_ADDRESS = re.compile(r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
MST_DEVICE = re.compile(r"(?:/dev/mst/)?[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,63}")  # /dev/mst/mt4123_pciconf0
DEVICE_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # ConnectX6, BlueField2
VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+~:_-]{0,63}")  # 24.0.7, 535.129.03, 5.8-1.0.1.1
MIG_PROFILE = re.compile(r"[0-9][0-9a-z.+-]{0,31}")  # 3g.40gb, 1g.10gb+me, 1g.24gb-me, 1c.3g.20gb
GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]{1,80}")
PRODUCT_NAME = re.compile(r"[\x20-\x7e]{1,200}")  # "NVIDIA A100 80GB PCIe": printable ASCII
MLX_PARAMETER = re.compile(r"[A-Z0-9_]{1,64}(?:\[\d{1,4}\])?")
MLX_VALUE = re.compile(r"[\x21-\x7e]{1,64}")  # True(1), False(0), 8, ETH(2), Array[0..7]: one printable word

GRAMMARS = {
    "an interface name": (INTERFACE, "at most 15 characters of A-Za-z0-9_.:- (not '.' or '..')"),
    "an RDMA device name": (RDMA_DEVICE, "like mlx5_0: letters, digits, _ . -"),
    "an image id": (IMAGE_ID, "sha256: and 64 lowercase hex digits"),
    "a PCI address": (PCI_ADDRESS, "like 0000:ca:00.0 or ca:00.0"),
    "an MST device": (MST_DEVICE, "like /dev/mst/mt4123_pciconf0"),
    "a device type": (DEVICE_TYPE, "like ConnectX6"),
    "a version": (VERSION, "like 535.129.03: letters, digits, . + ~ : _ -"),
    "a MIG profile": (MIG_PROFILE, "like 3g.40gb"),
    "a GPU UUID": (GPU_UUID, "like GPU-5c9e1a2b-…"),
    "a product name": (PRODUCT_NAME, "printable ASCII, at most 200 characters"),
    "an mlxconfig parameter": (MLX_PARAMETER, "like ATS_ENABLED"),
    "an mlxconfig value": (MLX_VALUE, "one printable word, like True(1)"),
    "a licence status": (re.compile(r"[\x20-\x7e]{1,120}"), "printable ASCII, at most 120 characters"),
    "a MIG mode": (re.compile(r"Enabled|Disabled|\[N/A\]|N/A"), "Enabled, Disabled or [N/A]"),
    "a host name": (re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?"), "one DNS label: letters, digits, -"),
}


class UntrustedValueError(RemoteCommandError):
    """A host answered a value that is not what it names; the value was used nowhere."""


def printable(text: str) -> str:
    """`text` with every control character but newline and tab escaped (ESC → `\\x1b`)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def shown(value: str) -> str:
    """A value for an error message: quoted and escaped, cut to about SHOWN characters."""
    quoted = ascii(value)
    return quoted if len(quoted) <= SHOWN else quoted[:SHOWN] + "…"


def checked(value: str, what: str, source: str) -> str:
    """`value` if it matches the grammar of `what` (a key of GRAMMARS), else UntrustedValueError
    naming `source` (the command that answered it) and the value, escaped."""
    grammar, rule = GRAMMARS[what]
    if grammar.fullmatch(value) and value not in (".", ".."):
        return value
    raise UntrustedValueError(f"`{source}` answered {shown(value)} as {what}, which is not one ({rule}); "
                              "refusing to use it")


def interface(value: str, source: str) -> str:
    return checked(value, "an interface name", source)


def rdma_device(value: str, source: str) -> str:
    return checked(value, "an RDMA device name", source)


def image_id(value: str, source: str) -> str:
    return checked(value, "an image id", source)


def pci_address(value: str, source: str) -> str:
    return checked(value, "a PCI address", source)


def version(value: str, source: str) -> str:
    return checked(value, "a version", source)
