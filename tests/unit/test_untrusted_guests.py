"""Guests are untrusted input (issue 22, item 8): a value a guest answers is held to the grammar of
what it names before it reaches a command line, a launcher's environment, the journal or a report;
control characters never reach the terminal."""

from __future__ import annotations

import pytest

from gpuvm.bench.campaign import plan_campaign
from gpuvm.bench.network import derive, rank_script, read_port_maps
from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.parsers import ibdev2netdev, ip, mst, nvidia_smi
from gpuvm.parsers.ibdev2netdev import PortMap
from gpuvm.steps import guest_driver, guest_image
from gpuvm.untrusted import UntrustedValueError, checked, printable
from tests.unit.test_bench_setups import RUN, book

# The attack of the issue: a port name holding a command substitution (no space, so it is one word)
HOSTILE = "x$(touch${IFS}/tmp/pwned)"
GOOD = "mlx5_0 port 1 ==> ens64np1 (Up)\n"


def answering(name: str, text: str) -> FakeExecutor:
    return FakeExecutor(name, {"ibdev2netdev": CommandResult("ibdev2netdev", 0, text, "")})


@pytest.mark.parametrize("line", [
    f"mlx5_0 port 1 ==> {HOSTILE} (Up)",
    f"{HOSTILE} port 1 ==> ens64np1 (Up)",
    "mlx5_0 port 1 ==> ens64np1\x1b]0;owned\x07 (Up)",  # retitles the operator's terminal
    "mlx5_0 port 1 ==> a_name_longer_than_15 (Up)",
    "mlx5_0 port 1 ==> .. (Up)",
    f"0000:ca:00.0 mlx5_0 (MT4123 - MCX653106A-ECAT) ConnectX-6 fw 20.31.1014 port 1 (ACTIVE) ==> {HOSTILE} (Up)",
])
def test_ibdev2netdev_refuses_names_outside_their_grammar(line):
    with pytest.raises(UntrustedValueError) as info:
        ibdev2netdev.parse_ibdev2netdev(line + "\n")
    message = str(info.value)
    assert "ibdev2netdev" in message and "refusing to use it" in message
    assert "\x1b" not in message and "\x07" not in message  # shown escaped


def test_a_hostile_port_name_never_reaches_the_launcher(tmp_path):
    """vm2 answers a port name holding `$(…)`: reading the port maps fails naming vm2 and the value,
    escaped; no mapping, so no mpirun line carries it (the campaign refuses before any command)."""
    runbook = book(tmp_path, RUN.replace("scenario: concurrent}", "nodes: [2]}"))
    vm1, vm2 = runbook.guests.hosts
    executors = {"vm1": answering("vm1", GOOD),
                 "vm2": answering("vm2", f"mlx5_1 port 1 ==> {HOSTILE} (Up)\nmlx5_0 port 1 ==> ens64np2 (Up)\n")}
    with pytest.raises(RemoteCommandError) as info:
        read_port_maps(executors, [vm1, vm2])
    assert "guest vm2" in str(info.value) and repr(HOSTILE) in str(info.value)
    # the honest guest's map still makes a clean launcher line
    good = read_port_maps({"vm1": executors["vm1"]}, [vm1])
    good["vm2"] = [PortMap("mlx5_1", 1, "ens64np2", True)]
    [point] = plan_campaign(runbook, ports=good)
    settings = dict(point.guest_network)  # each guest's own values, exported by its rank wrapper
    assert "OMPI_MCA_btl_tcp_if_include=ens64np2" in rank_script(dict(settings["vm2"])), settings
    assert HOSTILE not in point.jobs[0].command and point.jobs[0].network_script in point.jobs[0].command
    # a map built around the parser (another reader, an old results file) is checked again
    with pytest.raises(UntrustedValueError, match="interface name"):
        derive([vm1, vm2], {"vm1": [PortMap("mlx5_0", 1, HOSTILE, True)], "vm2": good["vm2"]})


@pytest.mark.parametrize("parse, text, what", [
    (mst.parse_mst_status, "DEVICE_TYPE MST PCI RDMA NET NUMA\n"
                           "ConnectX6(rev:0) /dev/mst/mt4123_pciconf0 ca:00.0 mlx5_0 net-$(reboot) 1\n", "interface name"),
    (mst.parse_mst_status, "DEVICE_TYPE MST PCI RDMA NET NUMA\n"
                           "ConnectX6(rev:0) /dev/mst/`id` ca:00.0 mlx5_0 net-ens1 1\n", "MST device"),
    (ip.parse_ip_addr_json, '[{"ifname": "eth0;reboot", "mtu": 1500}]', "interface name"),
    (ip.parse_ip_addr_json, '[{"ifname": "eth0", "mtu": 1500, "addr_info": [{"local": "1.2.3.4 -x", "prefixlen": 24}]}]',
     "address"),
    (nvidia_smi.parse_gpu_list, "GPU 0: NVIDIA A100\x1b[2J (UUID: GPU-5c9e1a2b-0000)\n", "product name"),
    (nvidia_smi.parse_gpu_instances, "+---+\n| GPU instances: |\n|====|\n|   0  MIG 3g.40gb$(id)  9  1  0:4  |\n",
     "MIG profile"),
    (guest_driver.parse_driver_versions, "535.129.03\x1b]0;owned\x07\n", "version"),
])
def test_parsers_refuse_values_outside_their_grammar(parse, text, what):
    with pytest.raises(UntrustedValueError, match=what):
        parse(text)


def test_image_ids_from_a_guest_are_checked(mocker):
    target = mocker.Mock()
    target.name = "gpu-vm-01"
    answer = CommandResult("docker image inspect", 0, "sha256:abc\x1b[2J\n", "")
    mocker.patch.object(guest_image, "run", return_value=answer)
    with pytest.raises(UntrustedValueError, match=r"'sha256:abc\\x1b\[2J' as an image id"):
        guest_image.inspect_id(target, mocker.Mock(), "gpuvm/train:abc")
    good = "sha256:" + "0123456789abcdef" * 4
    guest_image.run.return_value = CommandResult("docker image inspect", 0, good + "\n", "")
    assert guest_image.inspect_id(target, mocker.Mock(), "gpuvm/train:abc") == good


def test_printable_escapes_control_characters_but_newline_and_tab():
    assert printable("a\x1b]0;title\x07b\x1b[2Jc\r\x9bd\x7f") == "a\\x1b]0;title\\x07b\\x1b[2Jc\\x0d\\x9bd\\x7f"
    assert printable("two\nlines\tand tab, é ✓") == "two\nlines\tand tab, é ✓"


def test_an_error_quotes_a_long_value_cut_and_escaped():
    with pytest.raises(UntrustedValueError) as info:
        checked("\x1b" * 500, "an interface name", "ip")
    assert len(str(info.value)) < 400 and "\\x1b" in str(info.value)


TITLE, CLEAR = "\x1b]0;owned\x07", "\x1b[2J"


@pytest.mark.parametrize("form", ["text", "table"])
def test_a_plan_holding_a_guests_control_characters_prints_them_escaped(form):
    import io

    from gpuvm.cli.common import _safe_console
    from gpuvm.plan import Change, Note, Plan
    from gpuvm.render import print_plan

    plan = Plan(changes=[Change("guest.image", "vm1", "image gpuvm/train:abc", "id", f"sha256:x{TITLE}", "sha256:y")],
                notes=[Note("vm1", "observe", f"said {CLEAR}")])
    sink = io.StringIO()
    print_plan(_safe_console(file=sink, width=200, force_terminal=form == "table"), plan, form)
    shown = sink.getvalue()
    assert "\\x1b]0;owned\\x07" in shown and "\\x1b[2J" in shown
    assert TITLE not in shown and CLEAR not in shown and "\x07" not in shown


def test_an_error_holding_control_characters_prints_them_escaped(capsys):
    from gpuvm.cli.common import fail

    fail(f"guest vm2: `nvidia-smi -L` failed: {TITLE}{CLEAR}", 4)
    printed = capsys.readouterr().err
    assert "\\x1b]0;owned\\x07\\x1b[2J" in printed and "\x07" not in printed and "\x1b]" not in printed



def test_a_pci_address_in_an_error_prints_as_written_not_as_an_emoji(capsys):
    """rich reads `:ab:` as the emoji code of 🆎: a GPU at 0000:ab:00.0 (an HGX H200's) came out as 0000🆎00.0."""
    from gpuvm.cli.common import fail

    fail("GPU passthrough of GPU(s) 0000:ab:00.0, 0000:cd:00.0 is refused", 2)
    assert "0000:ab:00.0, 0000:cd:00.0" in capsys.readouterr().err

@pytest.mark.parametrize("line, error", [
    ("@@gpuvm home /home/u\x1b[2J", UntrustedValueError),
    ("@@gpuvm home relative/home", UntrustedValueError),
    ("@@gpuvm stat authorized_keys;reboot gpuadmin 600", UntrustedValueError),
    ("@@gpuvm stat authorized_keys gpuadmin", RemoteCommandError),  # was a ValueError traceback
    ("@@gpuvm stat authorized_keys gpuadmin rw", RemoteCommandError),
    ("@@gpuvm digest $(id)", UntrustedValueError),
    ("@@gpuvm file config not-base64!", RemoteCommandError),
])
def test_the_mesh_readers_answer_is_held_to_its_grammar(line, error):
    from gpuvm.steps.guest_ssh_mesh.ssh_dir import parse_mesh_files

    with pytest.raises(error):
        parse_mesh_files("gpuadmin", f"@@gpuvm home /home/gpuadmin\n{line}\n")
