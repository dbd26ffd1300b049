"""Shared state for the stand-in tools of the gpuvm test bed (stdlib only).

Each test host keeps its simulated hardware in `$GPUVM_FAKE_STATE/state.json` (default
/var/lib/gpuvm-fake, bind-mounted per host by the bed). Every read-modify-write holds an
exclusive flock on `state.lock`, so parallel sessions on one host do not lose updates.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
import uuid

STATE_DIR = os.environ.get("GPUVM_FAKE_STATE", "/var/lib/gpuvm-fake")
STATE_FILE = os.path.join(STATE_DIR, "state.json")
LOCK_FILE = os.path.join(STATE_DIR, "state.lock")

GPU_NAME = "NVIDIA A100 80GB PCIe"
GPU_BUS_IDS = ["00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0", "00000000:CA:00.0"]
NIC_PCI = "0000:ca:00.0"
NIC_DEV = "/dev/mst/mt4123_pciconf0"
# The NVIDIA vGPU manager (host driver) an ESXi test host has: vGPU 16.3's component, as
# `esxcli software component list` names it, installed and running (gpusim's default too).
MANAGER = {"component": "NVD-AIE-800", "installed": "535.154.02-1OEM.800.1.0.20613240", "running": "535.154.02"}
NO_MANAGER = {"component": None, "installed": None, "running": None}


def default_state(role: str = "guest", hostname: str | None = None, gpus: int = 4) -> dict:
    hostname = hostname or socket.gethostname()
    return {
        "role": role,
        "hostname": hostname,
        "hang": [],
        "reboots": 0,
        "mig_needs_reset": role == "esxi",
        "vgpu_manager": dict(MANAGER),
        "kernel": {"atsSupport": {"configured": "FALSE", "runtime": "FALSE", "default": "FALSE"}},
        "gpus": [
            {
                "index": i,
                "name": GPU_NAME,
                "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{hostname}/gpu{i}")),
                "bus_id": GPU_BUS_IDS[i % len(GPU_BUS_IDS)],
                "mig_current": "Disabled",
                "mig_pending": "Disabled",
                "gpu_instances": [],
            }
            for i in range(gpus)
        ],
        "mst_started": False,
        "mlx": {"ATS_ENABLED": {"default": "False(0)", "current": "False(0)", "next": "False(0)"}},
        "docker": {"server_version": "24.0.7", "images": {}},
    }


@contextlib.contextmanager
def locked_state(write: bool = True):
    """Yield the state dict under the lock; written back on exit when `write`."""
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(LOCK_FILE, "a") as lock:
        with contextlib.suppress(OSError):
            os.chmod(LOCK_FILE, 0o666)
        fcntl.flock(lock, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
        try:
            with open(STATE_FILE) as f:
                state = json.load(f)
        except FileNotFoundError:
            state = default_state()
        try:
            yield state
        except SystemExit:
            # a tool that fails half-way (e.g. the 2nd of 2 GPU instances) keeps what it did
            if write:
                _write(state)
            raise
        if write:
            _write(state)


def _write(state: dict) -> None:
    tmp = f"{STATE_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.chmod(tmp, 0o666)
    os.replace(tmp, STATE_FILE)


def read_state() -> dict:
    with locked_state(write=False) as state:
        return state


def enter(tool: str, allowed_roles: tuple[str, ...] = ("esxi", "guest")) -> dict:
    """Common start of every tool: honour the `hang`, `answer` and `flood` knobs and the host's role.

    `answer`: {tool: text} prints that text instead (a hostile or broken guest); `flood`: [tool]
    prints without end (a runaway tool)."""
    state = read_state()
    if tool in state.get("hang", []):
        while True:  # a hung tool, for timeout tests
            time.sleep(3600)
    if tool in state.get("answer", {}):
        sys.stdout.write(state["answer"][tool])
        sys.exit(0)
    if tool in state.get("flood", []):
        line = (tool + " " * 63 + "\n").encode() * 1024
        try:
            while True:
                sys.stdout.buffer.write(line)
        except (BrokenPipeError, OSError):
            os._exit(1)
    if state.get("role") not in allowed_roles:
        sys.stderr.write(f"sh: {tool}: not found\n")
        sys.exit(127)
    return state


def is_root() -> bool:
    return os.geteuid() == 0


def die(message: str, code: int = 1, stream=None) -> None:
    (stream or sys.stderr).write(message if message.endswith("\n") else message + "\n")
    sys.exit(code)


def vgpu_manager(state: dict) -> dict:
    """The ESXi host's NVIDIA vGPU manager: component name, installed version, running driver version."""
    return state.get("vgpu_manager") or dict(MANAGER)


def apply_reboot(state: dict) -> None:
    """What a host reboot does: pending settings become effective, an installed vGPU manager runs."""
    state["reboots"] = state.get("reboots", 0) + 1
    manager = vgpu_manager(state)
    manager["running"] = manager["installed"].split("-", 1)[0] if manager["installed"] else None
    state["vgpu_manager"] = manager
    for setting in state.get("kernel", {}).values():
        setting["runtime"] = setting["configured"]
    for gpu in state.get("gpus", []):
        gpu["mig_current"] = gpu["mig_pending"]
        gpu["gpu_instances"] = []  # MIG instances do not survive a reboot
    for param in state.get("mlx", {}).values():
        param["current"] = param["next"]
    state["mst_started"] = False


# -- NVIDIA vGPU licensing (the systemctl and nvidia-smi stand-ins) -------------------------------

TOKEN_DIR = "/etc/nvidia/ClientConfigToken"
GRIDD_CONF = "/etc/nvidia/gridd.conf"
FEATURE_TYPES = {"vgpu": 1, "vws": 2, "vcs": 4}  # the guest's GPU kind (state `licensing.kind`) → its FeatureType
LEASE_SECONDS = 90 * 86400


def _token_files() -> dict[str, str]:
    """client_configuration_token_*.tok in the guest's token directory: name → sha256."""
    import glob
    import hashlib

    found = {}
    for path in sorted(glob.glob(os.path.join(TOKEN_DIR, "client_configuration_token_*.tok"))):
        with contextlib.suppress(OSError):
            with open(path, "rb") as f:
                data = f.read()
            if data.strip():
                found[os.path.basename(path)] = hashlib.sha256(data).hexdigest()
    return found


def _feature_type() -> str | None:
    value = None
    with contextlib.suppress(OSError):
        with open(GRIDD_CONF) as f:
            for line in f:
                key, sep, rest = line.strip().partition("=")
                if sep and key.strip() == "FeatureType":
                    value = rest.split("#", 1)[0].strip().strip('"')
    return value


def restart_gridd(state: dict) -> None:
    """What nvidia-gridd does when it starts: read gridd.conf and the token directory, and lease a
    licence when the FeatureType suits the GPU kind and a token the license server issued is there
    (state `licensing.token_sha256`; any non-empty token when unset)."""
    licensing = state.get("licensing", {})
    tokens = _token_files()
    issued = licensing.get("token_sha256")
    usable = [name for name, sha in tokens.items() if issued is None or sha == issued]
    right_type = _feature_type() == str(FEATURE_TYPES.get(licensing.get("kind"), -1))
    state["gridd"] = {"restarts": state.get("gridd", {}).get("restarts", 0) + 1,
                      "token": usable[0] if usable and right_type else None,
                      "token_sha256": tokens[usable[0]] if usable and right_type else None,
                      "expiry": time.time() + licensing.get("lease_seconds", LEASE_SECONDS)}


def licence_status(state: dict) -> str:
    """License Status as nvidia-smi -q prints it: Licensed while nvidia-gridd's lease holds and its
    token is still in place (unpadded fields, as NVIDIA prints them)."""
    gridd = state.get("gridd") or {}
    token = gridd.get("token")
    if token is None or _token_files().get(token) != gridd.get("token_sha256") or gridd["expiry"] <= time.time():
        return "Unlicensed (Restricted)"
    t = time.gmtime(gridd["expiry"])
    return f"Licensed (Expiry: {t.tm_year}-{t.tm_mon}-{t.tm_mday} {t.tm_hour}:{t.tm_min}:{t.tm_sec} GMT)"
