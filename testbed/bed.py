"""The SSH test bed: ESXi hosts and GPU guests as network namespaces, each with a real sshd.

Every host is a network namespace `gpuvm-<name>` joined by a veth pair to the bridge
`gpuvmbr0` (10.250.0.1/24) in the root namespace; hosts get 10.250.0.11, .12, ... in order
(ESXi hosts first). Each host's sshd runs in a private mount (and UTS) namespace where
`/root`, `/home`, `/etc` (a copy of this machine's, with the host's own `ssh/` and `hosts`),
`/tmp`, `/var/lib/gpuvm-fake` and munge's and Slurm's directories (`OWN_DIRS`) are the host's own
directories under `<root>/hosts/<name>/` (a guest's `/proc/driver` too: the NVIDIA driver's mig-minors),
and the stand-in tools of `testbed/bin` are on PATH at `/usr/local/bin` (in the default PATH of root and of ordinary users alike). Everything an
ssh session starts lives in those namespaces, so `down()` ends a host by killing the
processes of its network namespace and deleting it: no mount outlives it.

Real Docker, on demand (`start_docker`, or `up --docker`): one `dockerd` per guest, entered into the
guest's network namespace with `nsenter --net` (not `ip netns exec`, which remounts /sys without
the cgroup hierarchies dockerd needs) and into a private mount namespace with the same binds as
its sshd, so `docker run -v /etc/ssh:...` means the guest's own files. Its data root, exec root,
socket and pid file live in `<root>/hosts/<name>/docker`, seen inside the host at
`/run/gpuvm-docker`; it runs with `--bridge=none --iptables=false` (containers use
`--network=host`) and its containers under the cgroup `gpuvm-<name>`. The `docker` on the host's
PATH (testbed/bin/docker) hands every command to the real CLI once that socket exists, and is
the stand-in before. Builds reach the Debian mirror through NAT on the bridge (`uplink`), the
way real guests reach theirs.

Guests booted from cloud-init data (`boot NAME --metadata B64 --userdata B64`, what gpusim's
-on-power-on runs for a cloned VM): a guest named after the VM at the metadata's static address,
whose default user authorises the user data's SSH keys; recorded in bed.json, removed by `down()`.

Run as root: `python testbed/bed.py up|down|status --root DIR [--esxi 2 --guests 4]`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import re
import pwd
import shlex
import shutil
import stat
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BIN = Path(__file__).resolve().parent / "bin"
sys.path.insert(0, str(BIN))
import _gpuvm_fake as fake  # noqa: E402

BRIDGE = "gpuvmbr0"
FABRIC = "gpuvmbr1"  # the guests' first ConnectX port (ens64np1) on a network of its own, as in a lab
FABRIC_PREFIX = "gvf-"
NETNS_PREFIX = "gpuvm-"
VETH_PREFIX = "gvh-"
SUBNET = "10.250.0"
GUEST_USER = "gpuadmin"
NIC_NAMES = ("ens64np1", "ens64np2")
FAKE_STATE_DIR = "/var/lib/gpuvm-fake"
# Each host's own, as on a machine of its own: where munge and Slurm keep their sockets, pids, state, logs
OWN_DIRS = ("/run/munge", "/run/slurm", "/var/lib/munge", "/var/log/munge", "/var/lib/slurm", "/var/log/slurm")
TOOLS_MOUNT = "/usr/local/bin"
DOCKER_MOUNT = "/run/gpuvm-docker"  # a host's docker dir (socket, data root, exec root) inside the host
DOCKER_GROUP = "docker"  # the guest user is in it, as on a real guest: the socket is the group's
REQUIRED_TOOLS = ("ip", "unshare", "ssh-keygen", "sudo", "useradd")
DOCKER_CLI = "/usr/bin/docker"  # Debian's docker.io (the bed's PATH has the stand-in first)
NAT_COMMENT = "gpuvm-testbed-uplink"
# Each host's /etc is a tmpfs of this name (+ the bed's netns prefix: down() finds a crashed run's by
# it): a copy of this machine's /etc (~1,500 files) takes 1.3-1.8 s per host on this ext4, 0.1 s in memory.
ETC_TMPFS = "gpuvm-bed-etc"


@dataclass(frozen=True)
class BedNames:
    """The machine-wide names a bed uses: two beds with different names never touch each other's
    namespaces, links or subnet (the tests' bed and a benchmark's large bed side by side)."""

    bridge: str = BRIDGE
    fabric: str = FABRIC
    netns_prefix: str = NETNS_PREFIX
    veth_prefix: str = VETH_PREFIX
    fabric_prefix: str = FABRIC_PREFIX
    subnet: str = SUBNET


TEST_NAMES = BedNames()
BENCH_NAMES = BedNames("gpbbr0", "gpbbr1", "gpb-", "gbh-", "gbf-", "10.251.0")  # bench/: never the tests' bed
NVIDIA_CAPS_MAJOR = 510  # a dynamic major, as the driver's nvidia-caps gets one
FORWARD_SAVED = "/run/gpuvm-testbed-ip_forward"  # ip_forward before uplink(), restored by down()


@dataclass(frozen=True)
class BedHost:
    name: str
    role: str  # "esxi" | "guest"
    address: str
    port: int
    user: str
    key_file: Path
    host_key_line: str  # the host's key as a known_hosts line ("name,address ssh-ed25519 AAAA...")


def mig_minors(gpus: int = 32) -> str:
    """/proc/driver/nvidia-caps/mig-minors as the NVIDIA driver writes it (the same whatever MIG
    devices exist): `config 1`, `monitor 2`, then for each GPU 15 GPU instances of 9 minors each,
    its own (`gpu0/gi1/access 12`) and 8 compute instances' (`gpu0/gi1/ci0/access 13`)."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(gpus):
        for gi in range(15):
            first = 3 + (gpu * 15 + gi) * 9
            lines += [f"gpu{gpu}/gi{gi}/access {first}", *(f"gpu{gpu}/gi{gi}/ci{ci}/access {first + 1 + ci}" for ci in range(8))]
    return "\n".join(lines) + "\n"


def _gpu_device_files(count: int = 4) -> None:
    """/dev/nvidia0 … as a GPU machine has them (character devices, major 195), for the stand-in
    nvidia-smi's four GPUs, and their MIG capabilities' /dev/nvidia-caps/nvidia-cap<minor> (`mig_minors`;
    the driver's major for them is dynamic): Slurm's gres.conf names them (File=, MultipleFiles=) and
    slurmd checks they are devices. The guests share this machine's /dev; nothing drives the nodes,
    so nothing opens them. Kept."""
    for index in range(count):
        path = Path(f"/dev/nvidia{index}")
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, index))
    Path("/dev/nvidia-caps").mkdir(mode=0o755, exist_ok=True)
    for line in mig_minors(count).splitlines():
        minor = int(line.split()[1])
        path = Path(f"/dev/nvidia-caps/nvidia-cap{minor}")
        if not path.exists():
            os.mknod(path, 0o444 | stat.S_IFCHR, os.makedev(NVIDIA_CAPS_MAJOR, minor))


def _mac(address: str, port: int) -> str:
    """A locally administered MAC for a bed host's port, the same whenever that address is used."""
    return "02:%02x:" % port + ":".join("%02x" % int(octet) for octet in address.split("."))


def _copy_etc(target: Path) -> None:
    """This machine's /etc into `target` with `cp -a` (a fifth of shutil.copytree's time: a bed copies
    it for every host), a file that went away meanwhile skipped: useradd's /etc/passwd.lock and the
    like, while another bed on this machine (the tests' and a benchmark's) sets its user up."""
    done = _run("cp", "-a", "/etc/.", str(target), check=False)
    errors = [line for line in done.stderr.splitlines() if not line.endswith(": No such file or directory")]
    if done.returncode != 0 and errors:
        raise RuntimeError(f"copying /etc to {target} failed: {'; '.join(errors)}")


def _run(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kwargs)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unmount_tmpfs(source: str, under: Path | None = None) -> None:
    """Unmount (lazily: a dying host may still hold it) every tmpfs called `source` [under `under`]."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        name, target, kind = line.split()[:3]
        target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), target)  # /proc's octal escapes
        if kind == "tmpfs" and name == source and (under is None or Path(target).is_relative_to(under)):
            _run("umount", "-l", target, check=False)


def _netns_pids(netns: str) -> list[int]:
    out = _run("ip", "netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split()]


def _kill_netns_processes(netns: str, timeout: float = 5.0) -> None:
    """SIGKILL every process in the network namespace (sshd, sessions, tools) and wait."""
    deadline = time.monotonic() + timeout
    while True:
        pids = _netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {netns} would not die")
        time.sleep(0.05)


def _cgroups_named(name: str) -> list[Path]:
    """The cgroups called `name` in every hierarchy. Another guest's cgroups may be removed while the
    tree is walked (guests' daemons are stopped side by side): a directory gone mid-walk, walk again."""
    for _ in range(20):
        try:
            return sorted(Path("/sys/fs/cgroup").glob(f"**/{name}"), key=lambda p: -len(p.parts))
        except FileNotFoundError:
            time.sleep(0.05)
    return sorted(Path("/sys/fs/cgroup").glob(f"**/{name}"), key=lambda p: -len(p.parts))  # its error, if again


def _remove_cgroups(name: str) -> None:
    """Kill what is left in the cgroup `name` (every hierarchy) and remove it, leaves first."""
    for top in _cgroups_named(name):
        for group in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            procs = group / "cgroup.procs"
            for _ in range(50):
                pids = procs.read_text().split() if procs.exists() else []
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                group.rmdir()


class TestBed:
    """A set of SSH test hosts; see the module docstring for the layout."""

    __test__ = False  # not a pytest test class

    def __init__(self, root: Path, esxi: int = 2, guests: int = 4, names: BedNames = TEST_NAMES):
        if esxi + guests > 200:
            raise ValueError(f"at most 200 hosts fit in {names.subnet}.11-.210")
        self.root = Path(root).resolve()
        self.naming = names
        self.esxi = esxi
        self.guests = guests
        self.client_key = self.root / "client_key"
        self.known_hosts_file = self.root / "known_hosts"
        self._base = [f"esx-{i:02d}" for i in range(1, esxi + 1)] + [f"gpu-vm-{i:02d}" for i in range(1, guests + 1)]
        self.booted: dict[str, str] = {}  # guests booted from cloud-init data (`boot`): name → address
        self.reload()

    def reload(self) -> None:
        """Read the guests booted since (by `bed.py boot`, another process) from bed.json."""
        saved = self.root / "bed.json"
        self.booted = json.loads(saved.read_text()).get("booted", {}) if saved.exists() else {}
        self._names = self._base + [n for n in self.booted if n not in self._base]

    # -- layout -----------------------------------------------------------------------------

    def role(self, name: str) -> str:
        return "esxi" if name.startswith("esx-") else "guest"

    def address(self, name: str) -> str:
        return self.booted.get(name) or f"{self.naming.subnet}.{11 + self._names.index(name)}"

    def host_dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    def own_dir(self, name: str, own: str) -> Path:
        """Where one of `OWN_DIRS` of a host lives on this machine (bound there in the host)."""
        return self.host_dir(name) / "var" / own.strip("/").replace("/", "-")

    @property
    def _etc_tmpfs(self) -> str:
        return ETC_TMPFS + "-" + self.naming.netns_prefix.rstrip("-")

    def netns(self, name: str) -> str:
        return self.naming.netns_prefix + name

    @property
    def hosts(self) -> list[BedHost]:
        return [self.host(name) for name in self._names]

    def host(self, name: str) -> BedHost:
        if name not in self._names:
            raise KeyError(f"no bed host {name!r}; hosts are {', '.join(self._names)}")
        pub = self.host_dir(name) / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
        key_type, key_b64 = pub.read_text().split()[:2] if pub.exists() else ("", "")
        return BedHost(
            name=name,
            role=self.role(name),
            address=self.address(name),
            port=22,
            user="root" if self.role(name) == "esxi" else GUEST_USER,
            key_file=self.client_key,
            host_key_line=f"{name},{self.address(name)} {key_type} {key_b64}",
        )

    # -- lifecycle --------------------------------------------------------------------------

    def up(self) -> None:
        """Build every host and start its sshd; a previous bed (even a crashed one) goes first."""
        self._check_prerequisites()
        self.down()
        self.booted, self._names = {}, list(self._base)
        self._ensure_guest_user()
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        shutil.rmtree(self.root / "hosts", ignore_errors=True)
        if not self.client_key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuvm-testbed-client", "-f", str(self.client_key))
        Path(FAKE_STATE_DIR).mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        _gpu_device_files()
        self._make_bridge()
        for name in self._names:
            self._make_host_files(name)
            self._make_netns(name)
        self.known_hosts_file.write_text("".join(h.host_key_line + "\n" for h in self.hosts))
        self._save()
        for name in self._names:
            self.start_sshd(name)

    def _save(self) -> None:
        (self.root / "bed.json").write_text(json.dumps({"esxi": self.esxi, "guests": self.guests, "booted": self.booted,
                                                        "hosts": [self._host_json(h) for h in self.hosts]}, indent=1))

    # -- guests booted from cloud-init data ---------------------------------------------------

    def boot(self, name: str, metadata: str, userdata: str) -> str:
        """What a VM cloned with cloud-init's guestinfo (`guestinfo.metadata`/`.userdata`, base64, in
        the JSON form gpuvm writes) does on first boot: a guest `name` at the metadata's static
        address, its default user authorising the user data's SSH keys. Idempotent (a power-on
        again starts its sshd). gpusim's -on-power-on runs it; returns the address."""
        with open(self.root / "boot.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.reload()  # another boot may have saved meanwhile
            if name not in self.booted:
                meta = json.loads(base64.b64decode(metadata))
                nics = meta["network"]["ethernets"].values()
                address = next(a for nic in nics for a in nic.get("addresses", []))  # static only
                keys = json.loads(base64.b64decode(userdata).decode().partition("\n")[2])["ssh_authorized_keys"]
                if len(self.naming.netns_prefix + name) > 15 or len(self.naming.veth_prefix + name) > 15:
                    raise ValueError(f"{name}: at most {15 - len(self.naming.veth_prefix)} characters (interface names)")
                self.booted[name] = address.split("/")[0]
                self._names.append(name)
                _unmount_tmpfs(self._etc_tmpfs, self.host_dir(name))  # a fresh disk: a new VM of that name
                shutil.rmtree(self.host_dir(name), ignore_errors=True)
                self._make_host_files(name, authorized="".join(k + "\n" for k in keys))
                self._make_netns(name)
                self._save()
            self.start_sshd(name)
            return self.address(name)

    def remove(self, name: str) -> None:
        """Take a booted guest away entirely (its VM was destroyed)."""
        self.reload()
        if (self.host_dir(name) / "run" / "dockerd.pid").exists():
            self.stop_docker(name)
        _kill_netns_processes(self.netns(name))
        _run("ip", "netns", "del", self.netns(name), check=False)
        _unmount_tmpfs(self._etc_tmpfs, self.host_dir(name))
        for link in (self.naming.veth_prefix + name, self.naming.fabric_prefix + name):
            _run("ip", "link", "del", link, check=False)
        self.booted.pop(name, None)
        self._names = [n for n in self._names if n != name]
        self._save()

    def down(self) -> None:
        """Remove every bed namespace, link and process, ours or a crashed run's. Idempotent."""
        for name in self._names:
            if (self.host_dir(name) / "run" / "dockerd.pid").exists():
                self.stop_docker(name)
        netns_list = _run("ip", "netns", "list", check=False).stdout.split("\n")
        for line in netns_list:
            netns = line.split(" ")[0].strip()
            if netns.startswith(self.naming.netns_prefix):
                _kill_netns_processes(netns)
                _run("ip", "netns", "del", netns, check=False)
        links = _run("ip", "-o", "link", "show", check=False).stdout.splitlines()
        for line in links:
            ifname = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            n = self.naming
            if ifname.startswith((n.veth_prefix, n.fabric_prefix)) or ifname in (n.bridge, n.fabric):
                _run("ip", "link", "del", ifname, check=False)
        for path in Path("/sys/fs/cgroup").glob(f"**/{self.naming.netns_prefix}*"):  # a crashed run's containers
            _remove_cgroups(path.name)
        _unmount_tmpfs(self._etc_tmpfs)  # every host's /etc, ours or a crashed run's
        self._drop_uplink()

    def _drop_uplink(self) -> None:
        if shutil.which("iptables") is None:
            return
        # only this bed's rule: another bed's (a benchmark's beside the tests') keeps its image builds online
        rules = _run("iptables", "-t", "nat", "-S", "POSTROUTING", check=False).stdout.splitlines()
        own = f"-s {self.naming.subnet}.0/24 "
        for rule in rules:
            if NAT_COMMENT in rule and rule.startswith("-A ") and own in rule:
                _run("iptables", "-t", "nat", "-D", *shlex.split(rule)[1:], check=False)
        others = any(NAT_COMMENT in rule and own not in rule for rule in rules)
        saved = Path(FORWARD_SAVED)
        if saved.exists() and not others:
            Path("/proc/sys/net/ipv4/ip_forward").write_text(saved.read_text())
            saved.unlink()

    def _mount_script(self, name: str) -> str:
        """The binds that make a private mount namespace this host's "OS" (sshd's and dockerd's)."""
        d = self.host_dir(name)
        binds = [
            (d / "root", "/root"),
            (d / "home", "/home"),
            (d / "fake", FAKE_STATE_DIR),
            (d / "docker", DOCKER_MOUNT),
            (BIN, TOOLS_MOUNT),
            *((self.own_dir(name, own), own) for own in OWN_DIRS),
            (d / "etc", "/etc"),
            *(((d / "proc-driver", "/proc/driver"),) if (d / "proc-driver").is_dir() else ()),  # a guest's mig-minors
            (d / "tmp", "/tmp"),  # last: the bed's own root may be under /tmp
        ]
        made = " ".join(str(p) for p in (DOCKER_MOUNT, *OWN_DIRS, *(self.own_dir(name, o) for o in OWN_DIRS)))
        return f"mkdir -p {made}; " + "; ".join(f"mount --bind {src} {dst}" for src, dst in binds)

    def start_sshd(self, name: str) -> None:
        """Start the host's sshd (its whole "OS": sessions run inside its namespaces)."""
        d = self.host_dir(name)
        if self._sshd_pid(name):
            return
        # `ip netns exec` remounts /sys without cgroups; slurmd refuses to start on a /sys/fs/cgroup with no
        # filesystem, so the host gets a cgroup v1 root with one named, controller-less hierarchy of its own
        # (its Slurm uses no cgroup plugin)
        cgroup = ("mountpoint -q /sys/fs/cgroup || { mount -t tmpfs -o mode=755 gpuvm-cgroup /sys/fs/cgroup && "
                  "mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=gpuvm-bed gpuvm-cgroup /sys/fs/cgroup/systemd; }")
        script = (f"set -e; {self._mount_script(name)}; {cgroup}; hostname {name}; "
                  "exec /usr/sbin/sshd -D -e -f /etc/ssh/sshd_config")
        log = open(d / "sshd.log", "ab")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(name), "unshare", "--mount", "--uts", "--propagation", "private",
             "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
        log.close()
        (d / "run" / "sshd.pid").write_text(f"{proc.pid}\n")
        self._wait_listening(name, proc)

    # -- real Docker --------------------------------------------------------------------------

    def start_docker(self, name: str, timeout: float = 60.0) -> None:
        """Start the guest's own dockerd (see the module docstring); waits until it answers."""
        if self.role(name) != "guest":
            raise ValueError(f"{name}: only guests run Docker")
        missing = [t for t in ("dockerd", "nsenter", "iptables") if shutil.which(t) is None]
        if missing or not Path(DOCKER_CLI).exists():
            raise RuntimeError(f"real Docker on the test bed needs {', '.join(missing) or DOCKER_CLI}; "
                               "apt-get install -y docker.io")
        d = self.host_dir(name)
        if self._docker_answers(name):
            return
        self.uplink()
        daemon = [
            "dockerd", "--data-root", f"{DOCKER_MOUNT}/data", "--exec-root", f"{DOCKER_MOUNT}/exec",
            "-H", f"unix://{DOCKER_MOUNT}/docker.sock", "--pidfile", f"{DOCKER_MOUNT}/dockerd.pid",
            "--group", DOCKER_GROUP, "--bridge=none", "--iptables=false", "--ip-forward=false",
            "--ip-masq=false", "--cgroup-parent", f"/{self.cgroup(name)}", "--storage-driver", "overlay2",
        ]
        # /run/containerd hidden: dockerd starts its own containerd instead of a system one
        script = (f"set -e; {self._mount_script(name)}; mkdir -p /run/containerd; "
                  f"mount -t tmpfs none /run/containerd; hostname {name}; exec {' '.join(daemon)}")
        log = open(d / "dockerd.log", "ab")
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.netns(name)}", "unshare", "--mount", "--uts",
             "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
        log.close()
        (d / "run" / "dockerd.pid").write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while not self._docker_answers(name):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (d / "dockerd.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name}: dockerd did not come up (exit {proc.poll()}):\n{tail}")
            time.sleep(0.2)

    def docker(self, name: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """The real docker CLI against this guest's daemon, from the root namespace."""
        return _run(DOCKER_CLI, "-H", f"unix://{self.host_dir(name)}/docker/docker.sock", *args, **kwargs)

    def stop_docker(self, name: str, timeout: float = 20.0) -> None:
        """Stop the guest's dockerd (it stops its containers), then anything left in its cgroup."""
        pid_file = self.host_dir(name) / "run" / "dockerd.pid"
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            pid = None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _pid_alive(pid) and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            pid_file.unlink(missing_ok=True)
        _remove_cgroups(self.cgroup(name))
        # its mounts died with its mount namespace; the socket goes (the host's `docker` is the
        # stand-in again) and so do its images
        docker_dir = self.host_dir(name) / "docker"
        (docker_dir / "docker.sock").unlink(missing_ok=True)
        for sub in ("data", "exec"):
            shutil.rmtree(docker_dir / sub, ignore_errors=True)

    def cgroup(self, name: str) -> str:
        return self.naming.netns_prefix + name

    def uplink(self) -> None:
        """NAT from the bed's bridge to this machine's default route (for image builds); undone by down()."""
        net = f"{self.naming.subnet}.0/24"
        rule = ["POSTROUTING", "-s", net, "!", "-d", net, "-j", "MASQUERADE",
                "-m", "comment", "--comment", NAT_COMMENT]
        if _run("iptables", "-t", "nat", "-C", *rule, check=False).returncode != 0:
            _run("iptables", "-t", "nat", "-A", *rule)
        forward = Path("/proc/sys/net/ipv4/ip_forward")
        saved = Path(FORWARD_SAVED)
        if forward.read_text().strip() != "1":
            saved.write_text(forward.read_text())
            forward.write_text("1\n")

    def _docker_answers(self, name: str) -> bool:
        sock = self.host_dir(name) / "docker" / "docker.sock"
        return sock.exists() and self.docker(name, "version", "--format", "{{.Server.Version}}",
                                             check=False).returncode == 0

    def stop_sshd(self, name: str) -> None:
        """Take the host down: its sshd, every session and every process it started."""
        _kill_netns_processes(self.netns(name))
        (self.host_dir(name) / "run" / "sshd.pid").unlink(missing_ok=True)

    # -- stand-in tool state ----------------------------------------------------------------

    def state(self, name: str) -> dict:
        with self._state_env(name):
            return fake.read_state()

    def set_state(self, name: str, key: str, value) -> None:
        """Set a state knob, e.g. `set_state("gpu-vm-01", "hang", ["nvidia-smi"])`."""
        with self._state_env(name), fake.locked_state() as state:
            state[key] = value

    def reboot(self, name: str) -> str | None:
        """What a reboot does to a host's tools: pending ESXi, GPU and NIC settings take effect. An
        ESXi host: the NVIDIA vGPU manager it runs now (None: none)."""
        with self._state_env(name), fake.locked_state() as state:
            fake.apply_reboot(state)
            return fake.vgpu_manager(state)["running"] if state.get("role") == "esxi" else None

    def _state_env(self, name: str):
        import contextlib

        @contextlib.contextmanager
        def patched():
            old = (fake.STATE_DIR, fake.STATE_FILE, fake.LOCK_FILE)
            state_dir = str(self.host_dir(name) / "fake")
            fake.STATE_DIR, fake.STATE_FILE, fake.LOCK_FILE = (
                state_dir, os.path.join(state_dir, "state.json"), os.path.join(state_dir, "state.lock"))
            try:
                yield
            finally:
                fake.STATE_DIR, fake.STATE_FILE, fake.LOCK_FILE = old

        return patched()

    def status(self) -> list[tuple[BedHost, bool]]:
        return [(h, self._sshd_pid(h.name) is not None) for h in self.hosts]

    # -- building blocks --------------------------------------------------------------------

    def _check_prerequisites(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the test bed needs root (network and mount namespaces)")
        missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
        if not Path("/usr/sbin/sshd").exists():
            missing.append("sshd (openssh-server)")
        if missing:
            raise RuntimeError(f"the test bed needs {', '.join(missing)}; apt-get install -y sudo openssh-server iproute2")

    def _ensure_guest_user(self) -> None:
        try:
            pwd.getpwnam(GUEST_USER)
        except KeyError:
            _run("useradd", "-M", "-d", f"/home/{GUEST_USER}", "-s", "/bin/bash", GUEST_USER)
        # "*" (no password, not locked): sshd refuses key logins to locked ("!") accounts
        _run("usermod", "-p", "*", GUEST_USER)
        _run("groupadd", "-f", DOCKER_GROUP)
        _run("usermod", "-a", "-G", DOCKER_GROUP, GUEST_USER)
        sudoers = Path("/etc/sudoers.d/gpuvm-testbed")
        if not sudoers.exists():
            sudoers.write_text(f"{GUEST_USER} ALL=(ALL) NOPASSWD:ALL\n")
            os.chmod(sudoers, 0o440)

    def _make_bridge(self) -> None:
        self._fit_neighbour_table()
        _run("ip", "link", "add", self.naming.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.naming.subnet}.1/24", "dev", self.naming.bridge)
        _run("ip", "link", "set", self.naming.bridge, "up")
        _run("ip", "link", "add", self.naming.fabric, "type", "bridge")  # no address: only the guests talk on it
        _run("ip", "link", "set", self.naming.fabric, "up")

    def _fit_neighbour_table(self) -> None:
        """Room for every guest's neighbours. The kernel keeps one ARP table for all network namespaces
        (real guests each have their own): the defaults (gc_thresh3 1,024 entries) overflow at 64 guests
        that all talk to each other (4,032 pairs, on two networks), and logins fail "No route to host".
        Only ever raised, never put back: another bed may be up beside this one."""
        hosts = len(self._names) + 1  # gpuvm's side of the bridge too
        for level, wanted in (("gc_thresh2", hosts * hosts), ("gc_thresh3", 2 * hosts * hosts)):
            path = Path(f"/proc/sys/net/ipv4/neigh/default/{level}")
            if int(path.read_text()) < wanted:
                path.write_text(f"{wanted}\n")

    def _make_netns(self, name: str) -> None:
        netns, veth = self.netns(name), self.naming.veth_prefix + name
        _run("ip", "netns", "add", netns)
        # The MAC follows the address: a guest booted again at an address (a new VM of that name)
        # answers at the MAC every neighbour cache already holds, or connections wait out the
        # stale entry (30 s and more), as a real guest's gratuitous ARP would spare them.
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "address", _mac(self.address(name), 0),
             "netns", netns)
        _run("ip", "link", "set", veth, "master", self.naming.bridge, "up")
        ip = ["ip", "-n", netns]
        _run(*ip, "link", "set", "lo", "up")
        _run(*ip, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
        _run(*ip, "link", "set", "eth0", "up")
        _run(*ip, "route", "add", "default", "via", f"{self.naming.subnet}.1")
        if self.role(name) == "guest":
            # port 1 is cabled: a veth to the fabric bridge, so traffic the derived network (NCCL,
            # btl_tcp_if_include) sends over it reaches the other guests; port 2 is not
            fabric = self.naming.fabric_prefix + name
            _run("ip", "link", "add", fabric, "type", "veth", "peer", "name", NIC_NAMES[0],
                 "address", _mac(self.address(name), 1), "netns", netns)
            _run("ip", "link", "set", fabric, "master", self.naming.fabric, "up")
            for i, nic in enumerate(NIC_NAMES[1:], 2):
                # The kernel may lack the dummy driver; a veth pair whose peer stays up is the
                # same to `ip` and to ibdev2netdev (its operstate follows `ip link set ... up|down`).
                if _run(*ip, "link", "add", nic, "type", "dummy", check=False).returncode != 0:
                    _run(*ip, "link", "add", nic, "type", "veth", "peer", "name", f"peer-np{i}")
                    _run(*ip, "link", "set", f"peer-np{i}", "up")

    def _make_host_files(self, name: str, authorized: str | None = None) -> None:
        d = self.host_dir(name)
        user = self.host(name).user
        pw = pwd.getpwnam(user)
        for sub in ("root", "home", "tmp", "fake", "run", "docker"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d / "root", 0o700)
        os.chmod(d / "home", 0o755)
        os.chmod(d / "tmp", 0o1777)
        os.chmod(d / "fake", 0o777)
        # /etc: a copy of this machine's (users, sudoers, ssh client config), with the host's
        # own sshd config, host key and /etc/hosts naming every bed host
        (d / "etc").mkdir()
        _run("mount", "-t", "tmpfs", "-o", "size=64m,mode=755", self._etc_tmpfs, str(d / "etc"))
        _copy_etc(d / "etc")
        etc_ssh = d / "etc" / "ssh"
        for old in etc_ssh.glob("ssh_host_*"):
            old.unlink()
        shutil.rmtree(etc_ssh / "sshd_config.d", ignore_errors=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}",
             "-f", str(etc_ssh / "ssh_host_ed25519_key"))
        (etc_ssh / "sshd_config").write_text(self._sshd_config(name))
        hosts = "127.0.0.1\tlocalhost\n" + "".join(f"{self.address(n)}\t{n}\n" for n in self._names)
        (d / "etc" / "hosts").write_text(hosts)
        (d / "etc" / "hostname").write_text(name + "\n")
        # the login user's home, with the test client key authorised
        home = d / "root" if user == "root" else d / "home" / user
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(authorized or Path(f"{self.client_key}.pub").read_text())
        for path, mode in ((home, 0o700 if user == "root" else 0o755), (ssh_dir, 0o700), (ssh_dir / "authorized_keys", 0o600)):
            os.chown(path, pw.pw_uid, pw.pw_gid)
            os.chmod(path, mode)
        if self.role(name) == "guest":  # the NVIDIA driver's /proc/driver/nvidia-caps (what the GPUs' MIG devices need)
            (d / "proc-driver" / "nvidia-caps").mkdir(parents=True, exist_ok=True)
            (d / "proc-driver" / "nvidia-caps" / "mig-minors").write_text(mig_minors())
        state = fake.default_state(role=self.role(name), hostname=name)
        (d / "fake" / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
        os.chmod(d / "fake" / "state.json", 0o666)

    def _sshd_config(self, name: str) -> str:
        """A GPU guest's sshd, as cheap per login as a real one: the key exchange Ubuntu 22.04's OpenSSH
        8.9 negotiates by default (curve25519-sha256). This machine's OpenSSH 9.x client would pick
        sntrup761x25519, whose key generation costs ~90 ms of CPU per login here against ~13 ms: on
        real guests each with their own cores that is noise, but the bed's every guest shares 2 cores
        and a 64-guest mesh check is 4,032 logins. No DNS look-up of the client either."""
        return f"""# gpuvm test bed host {name}
ListenAddress {self.address(name)}:22
HostKey /etc/ssh/ssh_host_ed25519_key
PidFile none
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
AuthorizedKeysFile .ssh/authorized_keys
MaxStartups 200:30:400
MaxSessions 64
UseDNS no
KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org
Subsystem sftp internal-sftp
AcceptEnv LANG LC_*
LogLevel INFO
"""

    def _sshd_pid(self, name: str) -> int | None:
        pid_file = self.host_dir(name) / "run" / "sshd.pid"
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if b"sshd" in cmdline and _pid_alive(pid) else None

    def _wait_listening(self, name: str, proc: subprocess.Popen, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = (self.host_dir(name) / "sshd.log").read_text(errors="replace")
                raise RuntimeError(f"{name}: sshd exited with {proc.returncode}:\n{log}")
            try:
                with socket.create_connection((self.address(name), 22), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{name}: sshd is not listening on {self.address(name)}:22 after {timeout:g}s")

    @staticmethod
    def _host_json(host: BedHost) -> dict:
        data = asdict(host)
        data["key_file"] = str(host.key_file)
        return data


def nvidia_run_package(path: Path, version: str) -> Path:
    """A stand-in for NVIDIA's NVIDIA-Linux-x86_64-<version>.run at `path`: like the real package, a
    shell script run with `sh`, here handing its arguments to the stand-in nvidia-installer."""
    path.write_text(f'#!/bin/sh\nexec nvidia-installer --standin-version={version} "$@"\n')
    path.chmod(0o755)
    return path


def guest_of_vm(name: str, vms_per_host: int = 2) -> str:
    """The test host standing in for a simulated VM's guest OS, as the lab runbook pairs them:
    gpusim's `esx-02-vm1` (2 VMs per host) is `gpu-vm-03`. Other names are returned as they are."""
    m = re.fullmatch(r"esx-(\d+)-vm(\d+)", name)
    return f"gpu-vm-{(int(m[1]) - 1) * vms_per_host + int(m[2]):02d}" if m else name


def _bed_from_args(args: argparse.Namespace) -> TestBed:
    esxi, guests = args.esxi, args.guests
    saved = Path(args.root) / "bed.json"
    if args.command != "up" and saved.exists() and esxi is None and guests is None:
        data = json.loads(saved.read_text())
        esxi, guests = data["esxi"], data["guests"]
    return TestBed(Path(args.root), esxi=2 if esxi is None else esxi, guests=4 if guests is None else guests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gpuvm SSH test bed (run as root)")
    parser.add_argument("command", choices=["up", "down", "status", "reboot", "boot"])
    parser.add_argument("names", nargs="*", help="with reboot: the test hosts (e.g. esx-01 and its guests)")
    parser.add_argument("--root", required=True, help="directory for keys and per-host files")
    parser.add_argument("--esxi", type=int, default=None, help="number of ESXi hosts (default 2)")
    parser.add_argument("--guests", type=int, default=None, help="number of GPU guests (default 4)")
    parser.add_argument("--vms-per-host", type=int, default=2,
                        help="with reboot: how gpusim's VMs pair with guests (esx-02-vm1 is guest 3 with 2)")
    parser.add_argument("--docker", action="store_true", help="with up: a real dockerd on every guest")
    parser.add_argument("--metadata", default="", help="with boot: cloud-init metadata (base64 JSON)")
    parser.add_argument("--userdata", default="", help="with boot: cloud-init user data (base64 #cloud-config JSON)")
    args = parser.parse_args(argv)
    bed = _bed_from_args(args)
    if args.command == "down":
        bed.down()
        print("test bed is down")
        return 0
    if args.command == "boot":
        for name in args.names:
            print(f"{name}: up at {bed.boot(name, args.metadata, args.userdata)}")
        return 0
    if args.command == "reboot":  # names without a test host behind them: nothing to do
        known = [h.name for h in bed.hosts]
        for name in [n for n in (guest_of_vm(a, args.vms_per_host) for a in args.names) if n in known]:
            manager = bed.reboot(name)
            print(f"{name}: rebooted")
            if bed.role(name) == "esxi":  # gpusim's -on-reboot reads what the host booted with
                print(f"GPUSIM_VGPU_MANAGER={manager or 'none'}")
        return 0
    if args.command == "up":
        bed.up()
        if args.docker:
            for host in bed.hosts:
                if host.role == "guest":
                    bed.start_docker(host.name)
    print(f"client key: {bed.client_key}\nknown hosts: {bed.known_hosts_file}")
    print(f"{'NAME':<12}{'ROLE':<7}{'ADDRESS':<14}{'USER':<10}SSHD")
    for host, running in bed.status():
        print(f"{host.name:<12}{host.role:<7}{host.address:<14}{host.user:<10}{'running' if running else 'stopped'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
