"""guest.licensing: the NVIDIA License System client on every guest that needs a licence (vGPU guests;
passthrough guests with `guests.licensing.passthrough`), as NVIDIA's "Virtual GPU Client Licensing
User Guide" sets it up on Linux (`gpuvm.licensing`).

Observed: the token files in /etc/nvidia/ClientConfigToken (mode and sha256, never their content),
gridd.conf's FeatureType, and the License Status `nvidia-smi -q` reports. Planned: the runbook's
token as the only client_configuration_token_*.tok there (mode 744; the plan shows a digest prefix,
never the token), FeatureType, and a restart of nvidia-gridd whenever either changed or the guest is
not licensed, or its licence expires within `min_validity`. Apply reads the licence back until it is
Licensed (`acquire_timeout`). Takes effect at once; nothing else on the guest is disturbed.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from gpuvm.desired.ssh import DesiredGuest, GuestLicence
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.licensing import (GRIDD_CONF, GRIDD_TEMPLATE, TOKEN_DIR, TOKEN_MODE, TOKEN_NAME, Licence, expires_in,
                             feature_type, licence_problem, problem, read_licence, read_token, shown_digest,
                             token_digest, with_feature_type)
from gpuvm.plan import Change
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context, Step
from gpuvm.untrusted import UntrustedValueError, shown

NAME = "guest.licensing"
POLL = 2.0  # seconds between reads of the licence while nvidia-gridd acquires one
TOKEN_FILE = re.compile(r"client_configuration_token_[A-Za-z0-9._-]{0,200}\.tok")
# one line per token file: octal mode, sha256, name (a file's content never leaves the guest)
LIST_TOKENS = (f"for f in {TOKEN_DIR}/client_configuration_token_*.tok; do [ -f \"$f\" ] || continue; "
               "printf '%s %s %s\\n' \"$(stat -c %a \"$f\")\" \"$(sha256sum < \"$f\" | cut -d' ' -f1)\" \"${f##*/}\"; done")


def _wanted(target: DesiredGuest) -> GuestLicence:
    assert target.licence is not None  # wanted
    return target.licence


@dataclass(frozen=True)
class TokenFile:
    name: str
    mode: str  # octal, as stat prints it: 744
    sha256: str


@dataclass(frozen=True)
class LicensingFact:
    want_token: str  # sha256 of the runbook's token (read on this machine)
    tokens: tuple[TokenFile, ...]  # client_configuration_token_*.tok in the token directory
    feature_type: str | None  # gridd.conf's FeatureType; None: no gridd.conf or no setting
    status: str | None  # License Status as nvidia-smi -q printed it; None: none printed, or no driver
    licensed: bool
    expires_in: float | None  # seconds the licence had left when observed; None: no expiry printed


@dataclass(frozen=True)
class PlaceToken:
    sha256: str  # the runbook's token's digest when planned: apply refuses a token changed since
    remove: tuple[str, ...]  # other token files, which nvidia-gridd could read instead


@dataclass(frozen=True)
class SetFeatureType:
    value: int


@dataclass(frozen=True)
class RestartGridd:
    """systemctl restart nvidia-gridd, then read the licence back until it is Licensed."""


def wanted(target: DesiredGuest) -> bool:
    return target.licence is not None


def observe(ctx: Context, target: DesiredGuest) -> LicensingFact:
    want = _wanted(target)
    cluster = ctx.cluster
    executor = cluster.executors[target.name]
    listing = executor.run_script(LIST_TOKENS, sudo=target.root, check=False, timeout=cluster.command_timeout)
    conf = run(target, cluster, ["cat", GRIDD_CONF], sudo=target.root, check=False)
    licence = read_licence(executor, timeout=cluster.command_timeout)
    return LicensingFact(token_digest(want), parse_tokens(listing.stdout), feature_type(conf.stdout if conf.ok else None),
                         licence.status, licence.licensed, expires_in(licence, datetime.now(UTC)))


def parse_tokens(text: str) -> tuple[TokenFile, ...]:
    """LIST_TOKENS's lines → token files; a guest answering anything else is refused."""
    tokens = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3 or not re.fullmatch(r"[0-7]{3,4}", fields[0]) or not re.fullmatch(r"[0-9a-f]{64}", fields[1]) \
                or not TOKEN_FILE.fullmatch(fields[2]):
            raise UntrustedValueError(f"the token directory listing answered {shown(line)}, not `mode sha256 "
                                      "client_configuration_token_*.tok`; refusing to use it")
        tokens.append(TokenFile(fields[2], fields[0], fields[1]))
    return tuple(tokens)


def plan(target: DesiredGuest, fact: LicensingFact) -> list[Change]:
    want = _wanted(target)
    changes: list[Change] = []
    ours = [t for t in fact.tokens if t.name == TOKEN_NAME and t.sha256 == fact.want_token and t.mode == f"{TOKEN_MODE:o}"]
    others = tuple(t.name for t in fact.tokens if t.name != TOKEN_NAME)
    if not ours or others:
        before = ", ".join(f"{t.name} {shown_digest(t.sha256)} mode {t.mode}" for t in fact.tokens) or None
        changes.append(Change(NAME, target.name, f"licence token {TOKEN_DIR}", "token", before,
                              f"{TOKEN_NAME} {shown_digest(fact.want_token)} mode 744",
                              action=PlaceToken(fact.want_token, others)))
    if fact.feature_type != str(want.feature_type):
        changes.append(Change(NAME, target.name, GRIDD_CONF, "FeatureType", fact.feature_type,
                              str(want.feature_type), action=SetFeatureType(want.feature_type)))
    why = problem(fact.licensed, fact.status, fact.expires_in, want.min_validity)
    if changes or why:
        changes.append(Change(NAME, target.name, "licence (nvidia-gridd)", "License Status",
                              why or fact.status, "Licensed", action=RestartGridd()))
    return changes


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    want = _wanted(target)
    cluster = ctx.cluster
    for change in changes:
        action = change.action
        if isinstance(action, PlaceToken):
            data = read_token(want)
            if hashlib.sha256(data).hexdigest() != action.sha256:
                raise InputError(f"{want.where}: {want.token_file} changed since the plan was made; plan again")
            run(target, cluster, ["mkdir", "-p", TOKEN_DIR], sudo=target.root)
            cluster.executors[target.name].put(data, f"{TOKEN_DIR}/{TOKEN_NAME}", mode=TOKEN_MODE, sudo=target.root)
            if action.remove:
                run(target, cluster, ["rm", "-f", "--", *(f"{TOKEN_DIR}/{name}" for name in action.remove)],
                    sudo=target.root)
        elif isinstance(action, SetFeatureType):
            cluster.executors[target.name].put(with_feature_type(_current_conf(ctx, target), action.value).encode(),
                                               GRIDD_CONF, mode=0o644, sudo=target.root)
        elif isinstance(action, RestartGridd):
            run(target, cluster, ["systemctl", "restart", "nvidia-gridd"], sudo=target.root)
            _await_licence(target, cluster, want)


def _current_conf(ctx: Context, target: DesiredGuest) -> str:
    """gridd.conf as it is now; where there is none, the driver's template (as the guide starts it)."""
    script = f"cat {shlex.quote(GRIDD_CONF)} 2>/dev/null || cat {shlex.quote(GRIDD_TEMPLATE)} 2>/dev/null || true"
    return ctx.cluster.executors[target.name].run_script(script, sudo=target.root, timeout=ctx.cluster.command_timeout).stdout


def _await_licence(target: DesiredGuest, cluster: Cluster, want: GuestLicence) -> Licence:
    """Read the licence until it is good, or `acquire_timeout` passed: then say what it is."""
    deadline = time.monotonic() + want.acquire_timeout
    while True:
        licence = read_licence(cluster.executors[target.name], timeout=60)
        why = licence_problem(licence, want.min_validity, datetime.now(UTC))
        if why is None:
            return licence
        left = deadline - time.monotonic()
        if left <= 0:
            raise RemoteCommandError(
                f"nvidia-gridd restarted, but after {want.acquire_timeout:g} s the guest is {why}: check the "
                "token is the license server's current one and that the guest reaches the server "
                "(journalctl -u nvidia-gridd)")
        time.sleep(min(POLL, left))


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted)
