"""Start and stop gpusim, the vCenter simulator with a GPU model (simulator/gpusim).

    with Simulator(hosts=2, gpu="a100-80") as sim:
        si = SmartConnect(host=..., user=sim.username, pwd=sim.password, ...)

``python simulator/gpusim.py build`` builds the binary (Go in GOPATH mode
against Debian's golang-github-vmware-govmomi-dev; nothing is downloaded).
Part of the source checkout's test bed, not of the gpuvm package: tests and
benchmarks put ``simulator/`` on sys.path and ``import gpusim``.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Mapping

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIR = REPO_ROOT / "simulator" / "gpusim"
GOPATH = "/usr/share/gocode"
DEFAULT_USERNAME = "administrator@vsphere.local"
DEFAULT_PASSWORD = "gpusim-pass"
URL_PREFIX = "GPUSIM_URL="
START_TIMEOUT_S = 20.0
# SIGTERM makes gpusim close its server, which waits for every request in flight: one held by
# -latency (a test's 120 s inventory read) is not waited out, nothing of it is read after stop.
STOP_GRACE_S = 2.0


def binary_path() -> Path:
    """Where the gpusim binary is: $GPUVM_SIMULATOR, else <repo>/build/gpusim."""
    env = os.environ.get("GPUVM_SIMULATOR")
    return Path(env) if env else REPO_ROOT / "build" / "gpusim"


def build(output: Path | None = None) -> Path:
    """Build gpusim with the system Go toolchain and govmomi sources; return the binary path."""
    output = Path(output) if output else binary_path()
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("Go is not installed: apt-get install golang-go golang-github-vmware-govmomi-dev")
    if not (Path(GOPATH) / "src" / "github.com" / "vmware" / "govmomi" / "simulator").is_dir():
        raise RuntimeError(
            f"govmomi sources not found under {GOPATH}: apt-get install golang-github-vmware-govmomi-dev"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH, GOFLAGS="")
    env.setdefault("GOCACHE", str(Path(tempfile.gettempdir()) / "gpuvm-go-cache"))
    proc = subprocess.run(
        [go, "build", "-o", str(output.resolve()), "."],
        cwd=SOURCE_DIR,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"go build of {SOURCE_DIR} failed:\n{proc.stderr}")
    return output


class Simulator:
    """A running gpusim process; use as a context manager or call start()/stop()."""

    def __init__(
        self,
        hosts: int = 2,
        vms_per_host: int = 2,
        gpu: str = "a100-80",
        tls: bool = True,
        vm_power: str = "off",
        faults: Iterable[str] = (),
        latency: Mapping[str, str] | None = None,
        rebind: bool = False,
        on_reboot: str | None = None,
        mig: Mapping[str, str] | None = None,
        vgpu_manager: Mapping[str, str] | None = None,
        vm_version: str = "vmx-19",
        templates: Iterable[str] = (),
        vm_folders: Iterable[str] = (),
        resource_pools: Iterable[str] = (),
        networks: Iterable[str] = (),
        on_power_on: str | None = None,
        datastore_gb: int | None = None,
        binary: str | Path | None = None,
        workdir: str | Path | None = None,
        username: str = DEFAULT_USERNAME,
        password: str = DEFAULT_PASSWORD,
        host_prefix: str = "",
    ) -> None:
        self.hosts = hosts
        self.vms_per_host = vms_per_host
        self.gpu = gpu
        self.tls = tls
        self.vm_power = vm_power
        self.faults = list(faults)
        self.latency = dict(latency or {})
        self.rebind = rebind
        self.on_reboot = on_reboot
        self.mig = dict(mig or {})  # host → "all" or GPU indices "0,1": GPUs in MIG mode
        # host → the NVIDIA vGPU manager version it runs, or "none" (default: every host runs one)
        self.vgpu_manager = dict(vgpu_manager or {})
        self.vm_version = vm_version
        self.templates = list(templates)  # VM templates on the first host, to clone from
        self.vm_folders = list(vm_folders)  # VM folders in the datacenter, to clone into
        self.resource_pools = list(resource_pools)  # pools in the cluster's root pool, to clone into
        self.networks = list(networks)  # NAME[:HOST,HOST...]: standard port groups on those hosts (default all)
        self.on_power_on = on_power_on  # run when a VM with cloud-init data powers on
        self.datastore_gb = datastore_gb  # room for clones (40 GB each) on each datastore
        self.binary = Path(binary) if binary else binary_path()
        self.username = username
        self.password = password
        self.host_prefix = host_prefix  # before every host's (and so VM's) name: one of several vCenters
        self._workdir_arg = Path(workdir) if workdir else None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self.workdir: Path | None = None
        self.url: str = ""
        self.cert_file: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._stderr_file = None

    # ``faults`` entries are flags without the leading dash, e.g.
    # "fail-reconfigure=esx-01-vm1:2" or "fail-task=3" (a leading "-" is accepted too).
    def command(self) -> list[str]:
        cmd = [
            str(self.binary),
            f"-hosts={self.hosts}",
            f"-vms-per-host={self.vms_per_host}",
            f"-gpu={self.gpu}",
            "-listen=127.0.0.1:0",
            f"-tls={'true' if self.tls else 'false'}",
            f"-username={self.username}",
            f"-password={self.password}",
            f"-vm-power={self.vm_power}",
            f"-rebind-without-reboot={'true' if self.rebind else 'false'}",
            f"-vm-version={self.vm_version}",
        ]
        if self.tls and self.cert_file is not None:
            cmd.append(f"-cert-out={self.cert_file}")
        if self.host_prefix:
            cmd.append(f"-host-prefix={self.host_prefix}")
        if self.on_reboot:
            cmd.append(f"-on-reboot={self.on_reboot}")
        if self.on_power_on:
            cmd.append(f"-on-power-on={self.on_power_on}")
        if self.datastore_gb is not None:
            cmd.append(f"-datastore-gb={self.datastore_gb}")
        cmd += [f"-template={name}" for name in self.templates]
        cmd += [f"-vm-folder={name}" for name in self.vm_folders]
        cmd += [f"-resource-pool={name}" for name in self.resource_pools]
        cmd += [f"-network={spec}" for spec in self.networks]
        for f in self.faults:
            cmd.append("-" + f.lstrip("-"))
        for host, gpus in self.mig.items():
            cmd.append(f"-mig={host}={gpus}")
        cmd += [f"-vgpu-manager={host}={version}" for host, version in self.vgpu_manager.items()]
        for method, duration in self.latency.items():
            cmd.append(f"-latency={method}={duration}")
        return cmd

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

    def start(self) -> "Simulator":
        if self._proc is not None:
            return self
        if not self.binary.is_file():
            raise RuntimeError(
                f"gpusim binary not found at {self.binary}: run `make sim` "
                "(or `python simulator/gpusim.py build`) to build it, or set GPUVM_SIMULATOR"
            )
        if self._workdir_arg is not None:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="gpusim-")
            self.workdir = Path(self._tmpdir.name)
        self.cert_file = self.workdir / "gpusim-cert.pem" if self.tls else None
        self._stderr_file = open(self.workdir / "gpusim.log", "w+b")
        self._proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=self._stderr_file,
            cwd=self.workdir,
        )
        line = self._read_url_line()
        if not line.startswith(URL_PREFIX):
            log = self.log()
            self.stop()
            raise RuntimeError(f"gpusim did not start (got {line!r}):\n{log}")
        self.url = line[len(URL_PREFIX):]
        return self

    def _read_url_line(self) -> str:
        result: list[str] = []
        proc = self._proc
        assert proc is not None and proc.stdout is not None

        def reader() -> None:
            result.append(proc.stdout.readline().decode(errors="replace").strip())

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        timeout = self.start_timeout
        t.join(timeout)
        if not result:
            log = self.log()
            self.stop()
            raise RuntimeError(f"gpusim printed no URL within {timeout:.0f} s:\n{log}")
        return result[0]

    def log(self) -> str:
        """The simulator's stderr so far."""
        if self._stderr_file is None:
            return ""
        self._stderr_file.flush()
        self._stderr_file.seek(0)
        return self._stderr_file.read().decode(errors="replace")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    @property
    def start_timeout(self) -> float:
        """Seconds to wait for the URL line: gpusim creates its VMs first (4,096 take about a minute
        on a busy 2-core machine)."""
        return START_TIMEOUT_S + 0.05 * self.hosts * self.vms_per_host

    def requests(self, reset: bool = False) -> dict[str, int]:
        """The SOAP requests gpusim answered since it started (or was last reset), by method name:
        what went over the wire. `reset` sets the counts back to zero (after reading them)."""
        import urllib.request

        url = self.url.rsplit("/", 1)[0] + "/gpusim/requests"
        context = ssl.create_default_context(cafile=str(self.cert_file)) if self.tls else None
        request = urllib.request.Request(url, method="DELETE" if reset else "GET")
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return json.loads(answer.read())

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build"]:
        out = Path(argv[1]) if len(argv) > 1 else None
        try:
            path = build(out)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
        print(path)
        return 0
    print("usage: python simulator/gpusim.py build [OUTPUT]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
