"""A Debian base image for the training image, made on this machine: no image registry needed.

`debootstrap --variant=minbase <suite>` from the Debian mirror this machine's apt uses (so CI, which
reaches only package registries, can make it), packed into a tarball that `docker import` takes.
The tarball is cached under `build/base-images/`, named by the digest of its inputs (suite,
variant, mirror, debootstrap's version, packages included): a second test session imports it again
without bootstrapping. The image keeps the mirror in its apt sources, so builds on it use the same one.

With `include`, the base already carries those Debian packages. The container test's base carries
PRELOADED, the packages gpuvm's Dockerfile installs for its image (distro Open MPI and PyTorch, inbox
RDMA): the build still runs every RUN line, `apt-get update` and `apt-get install` included (a package
name apt does not know still fails it), but apt finds them installed and downloads none, so the test
run spends no minutes fetching PyTorch from the mirror. `make deps` bootstraps that base beforehand
(setup, not the test run). bench/container_path.py builds on the plain minbase: the whole install.

Run as root: `python testbed/base_image.py [--suite bookworm] [--preloaded]` prints the tarball's path.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(__file__).resolve().parents[1] / "build" / "base-images"
VARIANT = "minbase"
# What templates/Dockerfile.j2 installs with apt for `mpi: distro, framework: pytorch,
# framework_from: distro, ofed: inbox` (the container test's image), in its RUN lines' order.
PRELOADED = ("ca-certificates", "openssh-client", "openssh-server", "pciutils", "libnuma1", "procps", "python3",
             "rdma-core", "libibverbs1", "librdmacm1", "ibverbs-providers", "ibverbs-utils",
             "openmpi-bin", "python3-torch", "python3-torchvision", "python3-numpy")
SOURCES = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]


def debian_mirror(suite: str, sources: list[Path] = SOURCES) -> str:
    """The first Debian archive URI this machine's apt uses for `suite` (one-line or deb822 sources)."""
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri, suites in _entries(text):
            if suite in suites and "security" not in uri:
                return uri.rstrip("/")
    raise RuntimeError(f"no Debian mirror for {suite} in /etc/apt/sources.list*: the base image is "
                       "bootstrapped from the mirror apt uses")


def _entries(text: str):
    for line in text.splitlines():  # deb http://deb.debian.org/debian bookworm main
        words = re.sub(r"\[[^]]*\]", "", line).split()
        if len(words) >= 3 and words[0] == "deb":
            yield words[1], {words[2]}
    for stanza in re.split(r"\n\s*\n", text):  # deb822: Types / URIs / Suites
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.MULTILINE))
        if "deb" in fields.get("Types", "").split():
            for uri in fields.get("URIs", "").split():
                yield uri, set(fields.get("Suites", "").split())


def base_tarball(suite: str = "bookworm", cache: Path = CACHE, include: tuple[str, ...] = ()) -> Path:
    """The cached tarball of a minbase `suite` (with the packages `include`), bootstrapped first if no
    tarball has these inputs."""
    for tool in ("debootstrap", "tar"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"making the base image needs {tool}: apt-get install -y debootstrap")
    mirror = debian_mirror(suite)
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "debootstrap"],
                             capture_output=True, text=True).stdout.strip()
    inputs = f"{suite}\n{VARIANT}\n{mirror}\n{version}" + (f"\n{','.join(sorted(include))}" if include else "")
    key = hashlib.sha256(inputs.encode()).hexdigest()[:12]
    tarball = cache / f"debian-{suite}-{VARIANT}-{key}.tar"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one bootstrap at a time; the others wait and reuse it
        if not tarball.exists():
            _bootstrap(suite, mirror, tarball, include)
    return tarball


def _bootstrap(suite: str, mirror: str, tarball: Path, include: tuple[str, ...] = ()) -> None:
    with tempfile.TemporaryDirectory(prefix="bootstrap-", dir=tarball.parent) as tmp:
        root = Path(tmp) / "root"
        packages = [f"--include={','.join(include)}"] if include else []
        done = subprocess.run(["debootstrap", f"--variant={VARIANT}", *packages, suite, str(root), mirror],
                              capture_output=True, text=True)
        if done.returncode != 0:
            log = (root / "debootstrap" / "debootstrap.log")
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else done.stderr[-2000:]
            raise RuntimeError(f"debootstrap {suite} from {mirror} failed:\n{detail}")
        for cache_dir in ("var/cache/apt/archives", "var/lib/apt/lists"):  # the image's apt fetches again
            for entry in (root / cache_dir).glob("*"):
                if entry.is_file():
                    entry.unlink()
        partial = Path(tmp) / "base.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.rename(tarball)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make (or find) the cached Debian base image tarball")
    parser.add_argument("--suite", default="bookworm")
    parser.add_argument("--preloaded", action="store_true",
                        help="the container test's base: with the Debian packages gpuvm's Dockerfile installs")
    args = parser.parse_args(argv)
    print(base_tarball(args.suite, include=PRELOADED if args.preloaded else ()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
