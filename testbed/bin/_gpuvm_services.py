"""Real daemons behind the stand-in systemctl on a test bed guest: munge, slurmctld and slurmd, run
the way their Debian units run them (Type=simple: munged -F as user munge, slurmctld -D, slurmd -D
with $SLURMD_OPTIONS from /etc/default/slurmd) and started detached, so they outlive the SSH session
in the guest's network and mount namespaces. Their files are the guest's own: the bed binds
/run/munge, /run/slurm, /var/lib/munge, /var/log/munge, /var/lib/slurm and /var/log/slurm per host.
The main process's pid is kept in the host's state directory (`units/<unit>.pid`), as systemd keeps it.
"""
import os
import shlex
import signal
import subprocess
import time

import _gpuvm_fake as fake

UNITS = ("munge", "slurmctld", "slurmd")
PACKAGE_OF = {"munge": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd"}


def _pid_file(unit):
    return os.path.join(fake.STATE_DIR, "units", f"{unit}.pid")


def main_pid(unit):
    try:
        pid = int(open(_pid_file(unit)).read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:  # a zombie is not running
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                return None
    except OSError:
        return None
    return pid


def _options(name, variable):
    """$VARIABLE from /etc/default/<name>, as systemd reads it: EnvironmentFile= unquotes the value,
    an unbraced $VARIABLE in ExecStart= splits it at whitespace."""
    try:
        lines = open(f"/etc/default/{name}").read().splitlines()
    except OSError:
        return []
    for line in lines:
        key, _, value = line.strip().partition("=")
        if key == variable:
            return " ".join(shlex.split(value)).split()
    return []


def _command(unit):
    if unit == "munge":
        os.makedirs("/run/munge", exist_ok=True)  # RuntimeDirectory=munge
        os.chmod("/run/munge", 0o755)
        import pwd
        user = pwd.getpwnam("munge")
        os.chown("/run/munge", user.pw_uid, user.pw_gid)
        return ["/usr/sbin/munged", "-F", *_options("munge", "OPTIONS")], user
    if unit == "slurmctld":
        return ["/usr/sbin/slurmctld", "-D", "-s", *_options("slurmctld", "SLURMCTLD_OPTIONS")], None
    return ["/usr/sbin/slurmd", "-D", "-s", *_options("slurmd", "SLURMD_OPTIONS")], None


def start(unit):
    if main_pid(unit):
        return
    argv, user = _command(unit)
    os.makedirs(os.path.dirname(_pid_file(unit)), exist_ok=True)
    log = open(os.path.join(fake.STATE_DIR, "units", f"{unit}.log"), "ab")
    extra = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                            close_fds=True, **extra)
    with open(_pid_file(unit), "w") as f:
        f.write(f"{proc.pid}\n")
    time.sleep(0.3)
    if proc.poll() is not None:
        tail = open(log.name, "rb").read()[-1500:].decode(errors="replace").splitlines()[-8:]
        fake.die(f"Job for {unit}.service failed because the control process exited with error code: "
                 + " | ".join(tail), 1)
    if unit == "munge":  # units after munge need its socket
        deadline = time.monotonic() + 10
        while not os.path.exists("/run/munge/munge.socket.2") and time.monotonic() < deadline:
            time.sleep(0.1)


def stop(unit, timeout=15.0):
    pid = main_pid(unit)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while main_pid(unit) and time.monotonic() < deadline:
        time.sleep(0.1)
    if main_pid(unit):
        os.kill(pid, signal.SIGKILL)


def installed(state, unit):
    return PACKAGE_OF[unit] in state.get("packages", {})
