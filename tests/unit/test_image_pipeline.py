"""The pipelined tree: its shape (pure), and the relay script run by real bash, guests played by
directories: an ssh stand-in runs the remote command locally as the addressed guest."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuvm.image_fanout import Hop
from gpuvm.image_pipeline import Relay, levels, pipeline_script, split

STAND_INS = {
    # the addressed guest's directory becomes the "guest": its docker load writes there
    "ssh": '#!/bin/sh\nfor last; do :; done\nwhile [ $# -gt 2 ]; do prev=$1; shift; done\naddr=$1\n'
           'mkdir -p "$GUESTS/$addr"; echo "$last" > "$GUESTS/$addr/command"\n'
           '[ ! -e "$GUESTS/$addr/unreachable" ] || exit 255\n'
           'GUEST="$GUESTS/$addr" exec sh -c "$last"\n',
    "docker": '#!/bin/sh\ncase "$1" in\n save) printf "image %s\\n" "$2"; head -c 200000 /dev/zero ;;\n'
              ' load) [ ! -e "$GUEST/broken" ] || exit 1; [ ! -e "$GUEST/stalled" ] || exec sleep 600\n'
              '       cat > "$GUEST/loaded" ;;\n *) exit 9 ;;\nesac\n',
    "sudo": '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do [ "$1" = -u ] && shift; shift; done\nexec "$@"\n',
}


def relays(n: int) -> list[Relay]:
    return [Relay(f"10.0.0.{i}", 22, i % 2 == 0, None) for i in range(1, n + 1)]


def test_split_gives_the_left_child_the_larger_half():
    assert split([1, 2, 3, 4, 5]) == ([1, 2, 3], [4, 5])
    assert split([1]) == ([1], []) and split([]) == ([], [])


@pytest.mark.parametrize("n, depth", [(1, 1), (2, 1), (3, 2), (7, 3), (63, 6), (64, 6), (128, 7)])
def test_every_receiver_is_reached_once_at_depth_log2(n, depth):
    names = [f"g{i}" for i in range(n)]
    shape = levels("b", names)
    assert len(shape) == depth
    assert sorted(h.receiver for level in shape for h in level) == sorted(names)
    senders = [h.sender for level in shape for h in level]
    assert max(senders.count(s) for s in set(senders)) <= 2  # each uplink feeds at most two


def test_seven_guests_split_four_and_three_under_the_builder():
    assert levels("b", ["a", "b1", "c", "d", "e", "f", "g"]) == [
        [Hop("b", "a"), Hop("b", "e")],
        [Hop("a", "b1"), Hop("a", "d"), Hop("e", "f"), Hop("e", "g")],
        [Hop("b1", "c")],
    ]


def run_tree(tmp_path: Path, n: int, stall: int = 60, **marks: str) -> subprocess.CompletedProcess:
    bin_dir, guests = tmp_path / "bin", tmp_path / "guests"
    bin_dir.mkdir()
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for address, mark in marks.items():
        (guests / address).mkdir(parents=True, exist_ok=True)
        (guests / address / mark).touch()
    script = pipeline_script("gpuvm/dl:abc", relays(n), save_sudo=False, mesh_user=None, stall=stall, chunk=1 << 16)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GUESTS": str(guests), "HOME": str(tmp_path)}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def loaded(tmp_path: Path, n: int) -> list[str]:
    return [r.address for r in relays(n) if (tmp_path / "guests" / r.address / "loaded").exists()]


def test_every_guest_loads_the_whole_stream(tmp_path):
    run_tree(tmp_path, 7)
    assert loaded(tmp_path, 7) == [r.address for r in relays(7)]
    command = (tmp_path / "guests" / "10.0.0.2" / "command").read_text()  # what 10.0.0.1 ran to reach it
    assert command.startswith('bash -c "$(echo ') and command.split()[-5:] == ["1", "-", "60", "65536", "10.0.0.3,22,0,-"]  # its load (sudo), its user, the stall and chunk, its subtree
    for r in relays(7):
        data = (tmp_path / "guests" / r.address / "loaded").read_bytes()
        assert data.startswith(b"image gpuvm/dl:abc\n") and len(data) == 19 + 200000


def test_a_guest_whose_load_fails_still_passes_the_image_on(tmp_path):
    run_tree(tmp_path, 7, **{"10.0.0.1": "broken"})  # the root's left child: its subtree is 10.0.0.2-4
    assert loaded(tmp_path, 7) == [f"10.0.0.{i}" for i in range(2, 8)]


def test_an_unreachable_guest_cuts_off_its_subtree_only(tmp_path):
    run_tree(tmp_path, 7, **{"10.0.0.5": "unreachable"})  # the root's right child, with 6 and 7 under it
    assert loaded(tmp_path, 7) == [f"10.0.0.{i}" for i in range(1, 5)]


def whole(tmp_path: Path, n: int) -> list[str]:
    return [a for a in loaded(tmp_path, n) if len((tmp_path / "guests" / a / "loaded").read_bytes()) == 19 + 200000]


def test_a_load_that_stops_reading_is_cut_off_and_its_subtree_and_siblings_get_everything(tmp_path):
    """10.0.0.1 (the root's left child, over 10.0.0.2-4) takes a chunk of its load, then reads no more:
    its relay cuts its load off after the stall and goes on to its children; the right half never waits
    long. (Were it not cut, the run would last the load's 600 s and time out.)"""
    run_tree(tmp_path, 7, stall=1, **{"10.0.0.1": "stalled"})
    assert whole(tmp_path, 7) == [f"10.0.0.{i}" for i in range(2, 8)]


def test_a_leaf_that_stops_reading_is_cut_off_by_its_parent_alone(tmp_path):
    """10.0.0.4 is a leaf under 10.0.0.3 (under 10.0.0.2, under 10.0.0.1): the relays above wait one
    stall more per level below them, so only 10.0.0.3 cuts, and every other guest loads it all."""
    run_tree(tmp_path, 7, stall=1, **{"10.0.0.4": "stalled"})
    assert whole(tmp_path, 7) == [f"10.0.0.{i}" for i in (1, 2, 3, 5, 6, 7)]


@pytest.mark.parametrize("stall, half, bound", [(60, 1, 120), (60, 2, 180), (60, 3, 180), (60, 4, 240), (2, 32, 14)])
def test_a_reader_that_is_a_relay_gets_one_stall_more_per_level_below_it(stall, half, bound):
    from gpuvm.image_feed import FEED
    said = subprocess.run(["bash", "-c", FEED + f"bound {stall} {half}"], capture_output=True, text=True, check=True)
    assert int(said.stdout) == bound


def test_each_relay_loads_with_its_own_sudo_and_the_builder_sends_as_the_mesh_user():
    script = pipeline_script("gpuvm/dl:abc", relays(2), save_sudo=True, mesh_user="mpi")
    assert script.startswith("sudo -n docker save gpuvm/dl:abc | bash -c ")
    assert script.split()[-6:] == ["-", "mpi", "60", str(4 << 20), "10.0.0.1,22,0,-", "10.0.0.2,22,1,-"]


@pytest.mark.parametrize("relay", [Relay("10.0.0.1;reboot", 22, False, None),
                                   Relay("10.0.0.1", 22, False, "a b"),
                                   Relay("$(id)", 22, False, None),
                                   Relay("-Jjump.example", 22, False, None),
                                   Relay("10.0.0.1", 22, False, "-")])
def test_words_that_are_not_plain_are_refused(relay):
    assert relay.token is None
    with pytest.raises(ValueError):
        pipeline_script("x:y", [relay], save_sudo=False, mesh_user=None)
