"""The image tree over the mesh: its schedule (pure), the driver with a mocked hop, the hop script."""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

import pytest

from gpuvm import image_fanout as fanout
from gpuvm.errors import RemoteCommandError
from gpuvm.image_fanout import Hop, HopError, fan_out, hop_script, next_round, tree_rounds


def names(n: int) -> list[str]:
    return [f"g{i:02d}" for i in range(1, n + 1)]


def test_eight_guests_make_a_binomial_tree():
    assert tree_rounds("b", names(7)) == [
        [Hop("b", "g01")],
        [Hop("b", "g02"), Hop("g01", "g03")],
        [Hop("b", "g04"), Hop("g01", "g05"), Hop("g02", "g06"), Hop("g03", "g07")],
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64])
def test_rounds_stay_within_log2_plus_the_first_send(n):
    rounds = tree_rounds("b", names(n))
    assert len(rounds) == math.ceil(math.log2(n + 1)) <= math.ceil(math.log2(n)) + 1
    assert rounds[0] == [Hop("b", "g01")]  # the builder's first send
    holders = {"b"}
    for hops in rounds:
        senders = [h.sender for h in hops]
        assert len(senders) == len(set(senders))  # one send per holder per round
        assert set(senders) <= holders  # only a guest that has the image sends it
        assert not {h.receiver for h in hops} & holders
        holders |= {h.receiver for h in hops}
    assert holders == {"b", *names(n)}


def test_a_round_skips_senders_already_tried_for_a_receiver():
    assert next_round(["b", "g01"], ["g02", "g03"], {"g02": {"b"}}) == [Hop("b", "g03"), Hop("g01", "g02")]
    assert next_round(["b"], ["g02"], {"g02": {"b"}}) == []


def test_a_failed_hop_is_served_by_another_holder_in_a_later_round(mocker):
    failed_once: set[str] = set()

    def send(hop: Hop) -> None:
        if hop.receiver == "g01" and "g01" not in failed_once:
            failed_once.add("g01")
            raise RemoteCommandError("g01: docker load failed: no space left on device")

    send = mocker.Mock(side_effect=send)
    result = fan_out(["b"], names(4), send)
    assert result.failures == {}
    assert sorted(result.served) == names(4)
    assert result.rounds == [
        [Hop("b", "g01")],  # fails: g01's subtree waits
        [Hop("b", "g02")],  # only the builder has it; g01 tried from the builder already
        [Hop("b", "g03"), Hop("g02", "g01")],  # g01 from another holder
        [Hop("b", "g04")],
    ]
    assert send.call_count == 5


def test_a_receiver_failing_every_try_is_reported_and_the_others_are_served(mocker):
    def send(hop: Hop) -> None:
        if hop.receiver == "g03":
            raise RemoteCommandError(f"g03: guest.docker: image from {hop.sender}: docker load failed")

    result = fan_out(["b"], names(8), mocker.Mock(side_effect=send), max_tries=2)
    assert sorted(result.served) == [n for n in names(8) if n != "g03"]
    assert list(result.failures) == ["g03"] and "docker load failed" in str(result.failures["g03"])
    tries = [h for hops in result.rounds for h in hops if h.receiver == "g03"]
    assert len(tries) == 2 and len({h.sender for h in tries}) == 2


def test_a_sender_that_cannot_read_its_image_sends_no_more(mocker):
    def send(hop: Hop) -> None:
        if hop.sender == "g01":
            raise HopError("docker save failed", side="sender")

    result = fan_out(["b"], names(5), mocker.Mock(side_effect=send))
    assert result.failures == {} and sorted(result.served) == names(5)
    assert [h for hops in result.rounds for h in hops if h.sender == "g01"] == [Hop("g01", "g03")]


def test_a_sender_failing_twice_in_a_row_sends_no_more(mocker):
    def send(hop: Hop) -> None:
        if hop.sender == "b" and hop.receiver != "g01":
            raise RemoteCommandError("ssh over the mesh failed: Permission denied (publickey).")

    result = fan_out(["b"], names(6), mocker.Mock(side_effect=send))
    assert result.failures == {} and sorted(result.served) == names(6)
    assert [h.receiver for hops in result.rounds for h in hops if h.sender == "b"] == ["g01", "g02", "g04"]


def test_a_builder_whose_every_hop_fails_is_given_up_after_two(mocker):
    send = mocker.Mock(side_effect=RemoteCommandError("ssh over the mesh failed: Connection timed out"))
    result = fan_out(["b"], names(6), send)
    assert send.call_count == 2 and sorted(result.failures) == names(6)
    assert "Connection timed out" in str(result.failures["g02"])
    assert "no guest that has the image is left" in str(result.failures["g06"])


def test_guests_that_have_it_send_and_are_skipped(mocker):
    send = mocker.Mock()
    result = fan_out(["b", "g01", "g02"], ["g01", "g02", "g03", "g04", "g05"], send)
    assert result.rounds == [[Hop("b", "g03"), Hop("g01", "g04"), Hop("g02", "g05")]]


def test_no_holder_left_reports_every_receiver(mocker):
    send = mocker.Mock(side_effect=HopError("docker save failed: no such image", side="sender"))
    result = fan_out(["b"], names(2), send)
    assert sorted(result.failures) == names(2) and result.served == []
    assert "docker save failed" in str(result.failures["g01"])
    assert "no guest that has the image is left" in str(result.failures["g02"])


# -- the hop script, run by a real sh with stand-ins for docker and ssh -------------------------

STAND_INS = {
    "docker": '#!/bin/sh\n[ "$1" = save ] || exit 9\n[ -z "$SAVE_FAIL" ] || { echo "$SAVE_FAIL" >&2; exit 1; }\n'
              'echo "image $2"\n[ -z "$SAVE_BYTES" ] || head -c "$SAVE_BYTES" /dev/zero\n',
    "ssh": '#!/bin/sh\nfor last; do :; done\necho "$@" > "$STANDIN_DIR/ssh.args"\n'
           '[ -z "$SSH_EXIT" ] || { echo "Warning: Permanently added x"; echo "$SSH_SAYS" >&2; exit "$SSH_EXIT"; }\n'
           '[ -z "$LOAD_STALLS" ] || exec sleep 600\ncat > "$STANDIN_DIR/received"\n',
}


def run_hop(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    for name, text in STAND_INS.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    script = hop_script("gpuvm/dl:abc123abc123", "10.0.0.2", 2222, save_sudo=False, load_sudo=True, stall=1,
                        chunk=1 << 16)
    environ = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "STANDIN_DIR": str(tmp_path), **env}
    return subprocess.run(["sh", "-c", script], env=environ, capture_output=True, text=True, timeout=30)


def test_the_hop_pipes_save_into_the_peers_load_over_the_mesh_key(tmp_path):
    done = run_hop(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "received").read_text() == "image gpuvm/dl:abc123abc123\n"
    args = (tmp_path / "ssh.args").read_text().split()
    assert "StrictHostKeyChecking=yes" in args and "BatchMode=yes" in args
    assert "ServerAliveInterval=15" in args and "ServerAliveCountMax=4" in args  # a silent peer ends the hop
    assert args[args.index("-i") + 1].endswith("/.ssh/id_ed25519_gpuvm")
    assert args[-7:] == ["-p", "2222", "10.0.0.2", "sudo", "-n", "docker", "load"]


@pytest.mark.parametrize("env, code, said", [
    ({"SAVE_FAIL": "Error: reference does not exist"}, fanout.SAVE_FAILED,
     "docker save failed (exit 1): Error: reference does not exist"),
    ({"SSH_EXIT": "1", "SSH_SAYS": "Error processing tar file: no space left on device"}, fanout.LOAD_FAILED,
     "docker load failed (exit 1): Error processing tar file: no space left on device"),
    ({"SSH_EXIT": "255", "SSH_SAYS": "Host key verification failed."}, fanout.SSH_FAILED,
     "ssh over the mesh failed: Host key verification failed."),
])
def test_the_hop_says_whose_side_failed(tmp_path, env, code, said):
    done = run_hop(tmp_path, **env)
    assert (done.returncode, done.stderr.strip()) == (code, said)


def test_the_hop_carries_a_stream_of_many_chunks_whole(tmp_path):
    done = run_hop(tmp_path, SAVE_BYTES="300000")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "received").read_bytes() == b"image gpuvm/dl:abc123abc123\n" + bytes(300000)


def test_a_load_that_stops_reading_is_cut_off_after_the_stall_as_the_receivers_failure(tmp_path):
    """The peer's load reads nothing (for 600 s): the hop ends after its 1 s stall, not at its timeout."""
    done = run_hop(tmp_path, SAVE_BYTES="300000", LOAD_STALLS="1")
    assert (done.returncode, done.stderr.strip()) == (fanout.STALLED, "docker load took no bytes for 1 s: cut off")


def test_another_mesh_user_runs_ssh_through_sudo_and_words_are_quoted():
    script = hop_script("gpuvm/dl:abc", "10.0.0.2", 22, save_sudo=True, load_sudo=False, mesh_user="mpi user")
    assert "sudo -n docker save gpuvm/dl:abc 2>" in script
    assert "sudo -n -u 'mpi user' -H ssh " in script and "getent passwd 'mpi user'" in script
    assert " -p 22 10.0.0.2 'docker load'" in script


def test_the_operator_byte_counter_resets():
    fanout.OPERATOR_BYTES.reset()
    fanout.OPERATOR_BYTES.add(5)
    assert (fanout.OPERATOR_BYTES.reset(), fanout.OPERATOR_BYTES.bytes) == (5, 0)


def test_a_stopped_hop_stops_its_pipeline(tmp_path):
    """TERM to the hop's shell (how gpuvm stops a remote command) ends the save and ssh too."""
    (tmp_path / "docker").write_text('#!/bin/sh\necho $$ > "$STANDIN_DIR/save.pid"\nexec sleep 30\n')
    (tmp_path / "ssh").write_text('#!/bin/sh\ncat > /dev/null\n')
    for name in ("docker", "ssh"):
        (tmp_path / name).chmod(0o755)
    script = hop_script("gpuvm/dl:abc", "10.0.0.2", 22, save_sudo=False, load_sudo=False)
    environ = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "STANDIN_DIR": str(tmp_path)}
    shell = subprocess.Popen(["sh", "-c", script], env=environ, start_new_session=True)
    pid_file = tmp_path / "save.pid"
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.01)
    save = int(pid_file.read_text())
    shell.terminate()
    assert shell.wait(timeout=5) == 143
    for _ in range(200):  # the save (sleep) is gone too
        if not Path(f"/proc/{save}").exists() or "Z" in Path(f"/proc/{save}/stat").read_text().split()[2]:
            break
        time.sleep(0.01)
    else:
        os.kill(save, 9)
        raise AssertionError("the save outlived its stopped hop")


def test_no_round_starts_once_the_deadline_has_passed(mocker):
    clock = iter([0, 0, 200])  # the third round would start after the deadline (100)
    mocker.patch.object(fanout, "monotonic", lambda: next(clock))
    send = mocker.Mock(side_effect=[RemoteCommandError("g01: docker load failed"), None, None])
    result = fan_out(["b"], names(4), send, deadline=100)
    assert result.rounds == [[Hop("b", "g01")], [Hop("b", "g02")]] and result.served == ["g02"]
    assert sorted(result.failures) == ["g01", "g03", "g04"]
    assert all(isinstance(e, fanout.OutOfTime) for e in result.failures.values())
    assert str(result.failures["g01"]) == "g01: docker load failed; no time was left to try again"
    assert str(result.failures["g03"]) == "no time was left to send it (the copies' build_timeout)"


def test_a_sender_without_bash_says_so_on_its_own_side(tmp_path):
    for name in ("docker", "ssh"):
        (tmp_path / name).write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / name).chmod(0o755)
    script = hop_script("gpuvm/dl:abc", "10.0.0.2", 22, save_sudo=False, load_sudo=False)
    tools = tmp_path / "tools"  # what the script needs but bash
    tools.mkdir()
    for tool in ("mktemp", "rm", "getent", "cut", "id", "tr", "grep", "tail", "mkfifo", "cat"):
        (tools / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                 text=True, check=True).stdout.strip())
    sh = subprocess.run(["sh", "-c", "command -v sh"], capture_output=True, text=True, check=True).stdout.strip()
    done = subprocess.run([sh, "-c", script], env={"PATH": f"{tmp_path}:{tools}"}, capture_output=True, text=True,
                          timeout=10)
    assert (done.returncode, done.stderr.strip()) == (fanout.SAVE_FAILED, "bash is not installed: it feeds the load")
