"""Tool output (real formats, tests/fixtures/tools) in, typed facts out."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvm.errors import RemoteCommandError
from gpuvm.parsers import esxcli, ibdev2netdev, mlxconfig, mst, nvidia_smi, nvidia_topo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    "file, name, expected",
    [
        ("esxcli_kernel_list_atsSupport.txt", "atsSupport", ("Bool", "FALSE", "FALSE", "FALSE")),
        ("esxcli_kernel_list_iovDisableIR.txt", "iovDisableIR", ("Bool", "FALSE", "FALSE", "TRUE")),
    ],
)
def test_kernel_setting(file, name, expected):
    setting = esxcli.parse_kernel_setting(fixture(file), name)
    assert (setting.type, setting.configured, setting.runtime, setting.default) == expected
    assert not setting.pending


def test_kernel_setting_set_in_lower_case_is_not_pending():
    # `esxcli ... kernel set -v true` stores the value as typed; the runtime column reads TRUE
    setting = esxcli.parse_kernel_setting(fixture("esxcli_kernel_list_atsSupport_lowercase.txt"), "atsSupport")
    assert (setting.configured, setting.runtime) == ("true", "TRUE")
    assert not setting.pending


def test_kernel_setting_description_keeps_spaces():
    setting = esxcli.parse_kernel_setting(fixture("esxcli_kernel_list_iovDisableIR.txt"), "iovDisableIR")
    assert setting.description == "Disable Interrupt Routing in the IOMMU."


@pytest.mark.parametrize(
    "file, gpus, mig_counts",
    [("nvidia_smi_L.txt", 4, [0, 0, 0, 0]), ("nvidia_smi_L_mig.txt", 4, [2, 2, 0, 0])],
)
def test_gpu_list(file, gpus, mig_counts):
    parsed = nvidia_smi.parse_gpu_list(fixture(file))
    assert [g.index for g in parsed] == list(range(gpus))
    assert [len(g.mig_devices) for g in parsed] == mig_counts
    assert parsed[0].name == "NVIDIA A100 80GB PCIe"
    assert parsed[0].uuid.startswith("GPU-")


def test_gpu_list_mig_devices():
    gpu1 = nvidia_smi.parse_gpu_list(fixture("nvidia_smi_L_mig.txt"))[1]
    assert [(m.profile, m.device) for m in gpu1.mig_devices] == [("1g.10gb", 0), ("2g.20gb", 1)]


def test_mig_query_csv():
    modes = nvidia_smi.parse_mig_query_csv(fixture("nvidia_smi_query_mig.csv"))
    assert [(m.index, m.current, m.pending) for m in modes] == [
        (0, "Enabled", "Enabled"), (1, "Disabled", "Enabled"), (2, "Disabled", "Disabled"), (3, "[N/A]", "[N/A]"),
    ]
    assert modes[0].enabled and not modes[0].pending_change
    assert modes[1].pending_change


@pytest.mark.parametrize(
    "file, expected",
    [
        ("nvidia_smi_mig_lgi.txt", [(0, "3g.40gb", 9, 1, 0, 4), (0, "3g.40gb", 9, 2, 4, 4), (1, "1g.10gb", 19, 7, 0, 1), (1, "2g.20gb", 14, 3, 2, 2)]),
        ("nvidia_smi_mig_lgi_a100_40gb.txt", [(0, "1g.5gb", 19, 7, 4, 1), (0, "1g.5gb", 19, 8, 5, 1), (0, "1g.5gb", 19, 9, 6, 1), (0, "2g.10gb", 14, 3, 0, 2), (0, "2g.10gb", 14, 4, 2, 2)]),
    ],
)
def test_gpu_instances(file, expected):
    got = nvidia_smi.parse_gpu_instances(fixture(file))
    assert [(g.gpu, g.profile, g.profile_id, g.instance_id, g.placement_start, g.placement_size) for g in got] == expected


@pytest.mark.parametrize("text", ["No MIG-enabled devices found.\n", "No GPU instances found: Not Found\n"])
def test_gpu_instances_none(text):
    assert nvidia_smi.parse_gpu_instances(text) == []


def test_compute_instances():
    got = nvidia_smi.parse_compute_instances(fixture("nvidia_smi_mig_lci.txt"))
    assert [(c.gpu, c.gpu_instance_id, c.profile, c.profile_id, c.instance_id) for c in got] == [
        (0, 1, "3g.40gb", 2, 0), (0, 2, "3g.40gb", 2, 0), (1, 1, "1c.3g.40gb", 0, 0), (1, 1, "1c.3g.40gb", 0, 1)]


@pytest.mark.parametrize("text", ["No MIG-enabled devices found.\n", "No compute instances found: Not Found\n"])
def test_compute_instances_none(text):
    assert nvidia_smi.parse_compute_instances(text) == []


def test_mig_minors():
    from gpuvm.parsers import nvidia_caps

    minors = nvidia_caps.parse_mig_minors(fixture("proc_nvidia_caps_mig_minors_2gpus.txt"))
    assert len(minors) == 2 + 2 * 15 * 9 and minors["config"] == 1
    assert minors[nvidia_caps.gpu_instance_cap(0, 1)] == 12 and minors[nvidia_caps.compute_instance_cap(0, 1, 0)] == 13
    assert minors[nvidia_caps.gpu_instance_cap(1, 0)] == 138 and nvidia_caps.cap_device(138) == "/dev/nvidia-caps/nvidia-cap138"
    with pytest.raises(RemoteCommandError, match="mig-minors"):
        nvidia_caps.parse_mig_minors("gpu0/gi1/access 12\ngpu0/gi1/access twelve\n")


def test_gpu_instance_profiles():
    profiles = nvidia_smi.parse_gpu_instance_profiles(fixture("nvidia_smi_mig_lgip.txt"))
    assert {p.profile: p.profile_id for p in profiles} == {
        "1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0,
    }
    assert profiles[0].free == 7 and profiles[0].total == 7 and profiles[-1].memory_gib == 79.25


def test_created_instances():
    created = nvidia_smi.parse_created_instances(fixture("nvidia_smi_mig_cgi.txt"))
    assert [(c.kind, c.instance_id, c.gpu_instance_id) for c in created] == [
        ("GPU", 2, None), ("compute", 0, 2), ("GPU", 1, None), ("compute", 0, 1),
    ]


def test_mlxconfig_query_full():
    params = mlxconfig.parse_mlxconfig_query(fixture("mlxconfig_q.txt"))
    assert params["ATS_ENABLED"] == "False(0)"
    assert params["LINK_TYPE_P1"] == "ETH(2)"
    assert len(params) > 50


def test_mlxconfig_extended_shows_pending():
    params = mlxconfig.parse_mlxconfig_params(fixture("mlxconfig_e_q_ats_pending.txt"))
    assert params["ATS_ENABLED"] == mlxconfig.MlxParam("False(0)", "False(0)", "True(1)")
    assert mlxconfig.ats_state(fixture("mlxconfig_e_q_ats_pending.txt")) == mlxconfig.AtsState(False, True)


def test_mlxconfig_ats_state_needs_the_current_column():
    """Without -e, mlxconfig prints the Next Boot column only: what runs now is unknown, so it is refused."""
    with pytest.raises(RemoteCommandError, match="Current"):
        mlxconfig.ats_state(fixture("mlxconfig_q.txt"))


@pytest.mark.parametrize("value, expected", [("True(1)", True), ("False(0)", False), ("1", True), ("false", False)])
def test_mlx_bool(value, expected):
    assert mlxconfig.mlx_bool(value) is expected


@pytest.mark.parametrize(
    "file, expected",
    [
        ("ibdev2netdev.txt", [("mlx5_0", 1, "ens64np1", True, None), ("mlx5_1", 1, "ens64np2", False, None)]),
        ("ibdev2netdev_v.txt", [("mlx5_0", 1, "ens64np1", True, "0000:ca:00.0"), ("mlx5_1", 1, "ens64np2", False, "0000:ca:00.1")]),
        ("ibdev2netdev_v_cx5.txt", [("mlx5_0", 1, "enp59s0f0", True, "0000:3b:00.0"), ("mlx5_1", 1, "enp59s0f1", False, "0000:3b:00.1")]),
        # the script prints the port state with %-6s: "(DOWN  )"
        ("ibdev2netdev_v_padded.txt", [("mlx5_0", 1, "ens64np1", True, "0000:ca:00.0"), ("mlx5_1", 1, "ens64np2", False, "0000:ca:00.1")]),
    ],
)
def test_ibdev2netdev(file, expected):
    got = ibdev2netdev.parse_ibdev2netdev(fixture(file))
    assert [(p.ibdev, p.port, p.netdev, p.up, p.pci) for p in got] == expected


@pytest.mark.parametrize("file", ["ibdev2netdev_v.txt", "ibdev2netdev_v_padded.txt"])
def test_ibdev2netdev_verbose_port_state(file):
    got = ibdev2netdev.parse_ibdev2netdev(fixture(file))
    assert [p.port_state for p in got] == ["ACTIVE", "DOWN"]


@pytest.mark.parametrize(
    "file, expected",
    [
        ("mst_status_v.txt", [("/dev/mst/mt4123_pciconf0.1", "ca:00.1", "mlx5_1", "ens64np2"), ("/dev/mst/mt4123_pciconf0", "ca:00.0", "mlx5_0", "ens64np1")]),
        ("mst_status_v_connectx7.txt", [("/dev/mst/mt4129_pciconf0", "17:00.0", "mlx5_0", "ibp23s0"), ("/dev/mst/mt4125_pciconf0.1", "b1:00.1", "mlx5_2", "ens6f1np1"), ("/dev/mst/mt4125_pciconf0", "b1:00.0", "mlx5_1", "ens6f0np0")]),
        # mst started, the second port has no netdev yet: its NET column is blank
        ("mst_status_v_no_netdev.txt", [("/dev/mst/mt4123_pciconf0.1", "ca:00.1", "mlx5_1", None), ("/dev/mst/mt4123_pciconf0", "ca:00.0", "mlx5_0", "ens64np1")]),
    ],
)
def test_mst_status(file, expected):
    got = mst.parse_mst_status(fixture(file))
    assert [(d.mst, d.pci, d.rdma, d.net) for d in got] == expected


@pytest.mark.parametrize("file, expected", [
    # `mst cable add` was run: the device table is followed by a "Cable devices:" section
    ("mst_status_v_cables.txt", [("/dev/mst/mt4123_pciconf0.1", "ca:00.1", "mlx5_1", "ens64np2"),
                                 ("/dev/mst/mt4123_pciconf0", "ca:00.0", "mlx5_0", "ens64np1")]),
    # MFT 4.2x with the pci_cr0 device: cables, then LinkX chips
    ("mst_status_v_cables_linkx.txt", [("/dev/mst/mt4129_pciconf0", "17:00.0", "mlx5_0", "ibp23s0"),
                                       ("/dev/mst/mt4129_pci_cr0", "17:00.0", "mlx5_0", "ibp23s0")]),
])
def test_mst_status_reads_only_the_device_table(file, expected):
    got = mst.parse_mst_status(fixture(file))
    assert [(d.mst, d.pci, d.rdma, d.net) for d in got] == expected


def test_mst_status_device_type():
    assert {d.device_type for d in mst.parse_mst_status(fixture("mst_status_v_connectx7.txt"))} == {"ConnectX7", "ConnectX6DX"}


@pytest.mark.parametrize(
    "parse, text, names",
    [
        (lambda t: esxcli.parse_kernel_setting(t, "atsSupport"), "Error: Unknown command or namespace\n", "esxcli"),
        (lambda t: esxcli.parse_kernel_setting(t, "atsSupport"), fixture("esxcli_kernel_list_iovDisableIR.txt"), "atsSupport"),
        (nvidia_smi.parse_gpu_list, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "nvidia-smi -L"),
        (nvidia_smi.parse_mig_query_csv, "0, NVIDIA A100 80GB PCIe, Enabled\n", "--query-gpu"),
        (nvidia_smi.parse_gpu_instances, "+----+\n| GPU instances: |\n|   0  garbage |\n", "mig -lgi"),
        (nvidia_smi.parse_created_instances, "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources", "mig -cgi"),
        (mlxconfig.parse_mlxconfig_query, "-E- Failed to open device: /dev/mst/mt4123_pciconf0. No such file or directory", "mlxconfig q"),
        (mlxconfig.ats_state, fixture("mlxconfig_e_q_ats_pending.txt").replace("ATS_ENABLED", "ATS_DISABLED"), "ATS_ENABLED"),
        (ibdev2netdev.parse_ibdev2netdev, "mlx5_0 port 1 --> ens64np1\n", "ibdev2netdev"),
        (mst.parse_mst_status, "-E- You must be root to use mst tool\n", "mst status -v"),
        (mst.parse_mst_status, "DEVICE_TYPE MST PCI RDMA NET NUMA\nConnectX6\n", "mst status -v"),
    ],
)
def test_malformed_output_names_the_command(parse, text, names):
    with pytest.raises(RemoteCommandError, match="could not parse") as info:
        parse(text)
    assert names in str(info.value)


def test_ip_addr_json():
    from gpuvm.parsers import ip

    links = ip.parse_ip_addr_json(fixture("ip_j_addr_show.json"))
    assert list(links) == ["lo", "p1", "ens64np1", "ens64np2"]
    assert links["ens64np1"] == ip.Link("ens64np1", True, 9000, ("192.168.100.11/24", "fe80::58db:2aff:fec1:9d4e/64"), "UP")
    assert (links["ens64np2"].up, links["ens64np2"].mtu, links["ens64np2"].addresses) == (False, 1500, ())


def test_ip_addr_json_skips_empty_entries_of_old_iproute2():
    from gpuvm.parsers import ip

    assert list(ip.parse_ip_addr_json('[{}, {"ifname": "eth0", "flags": ["UP"], "mtu": 1500, "addr_info": [{}]}]')) == ["eth0"]


@pytest.mark.parametrize("text", ["Object \"addr\" is unknown, try \"ip help\".", '{"ifname": "eth0"}'])
def test_ip_addr_json_malformed(text):
    from gpuvm.parsers import ip

    with pytest.raises(RemoteCommandError, match="could not parse the output of `ip -j addr show`"):
        ip.parse_ip_addr_json(text)


@pytest.mark.parametrize("row, expected", [
    ("ConnectX6(rev:0)  NA                        ca:00.0  mlx5_0  net-ens64np1  1", (None, "mlx5_0", "ens64np1", 1)),
    ("ConnectX6(rev:0)  NA                        ca:00.0  NA      NA            NA", (None, None, None, None)),
    ("ConnectX6(rev:0)  /dev/mst/mt4123_pciconf0  ca:00.0  mlx5_0                -1", ("/dev/mst/mt4123_pciconf0", "mlx5_0", None, -1)),
    ("ConnectX6(rev:0)  /dev/mst/mt4123_pciconf0  ca:00.0  mlx5_0", ("/dev/mst/mt4123_pciconf0", "mlx5_0", None, None)),
])
def test_mst_status_blank_and_na_columns(row, expected):
    text = "PCI devices:\n------------\nDEVICE_TYPE  MST  PCI  RDMA  NET  NUMA\n" + row + "\n"
    (device,) = mst.parse_mst_status(text)
    assert (device.mst, device.rdma, device.net, device.numa) == expected


def test_mst_status_refuses_a_row_with_too_many_columns():
    text = "DEVICE_TYPE  MST  PCI  RDMA  NET  NUMA\nConnectX6  /dev/mst/x  ca:00.0  mlx5_0  mlx5_1  net-a  1\n"
    with pytest.raises(RemoteCommandError, match="could not parse"):
        mst.parse_mst_status(text)


@pytest.mark.parametrize("file, gpus, pairs, cell", [
    # R750xa (2 sockets): bridges join GPU0+GPU1 and GPU2+GPU3; header underlined on a terminal
    ("nvidia_smi_topo_m_r750xa.txt", (0, 1, 2, 3), [(0, 1), (2, 3)], ((0, 2), "SYS")),
    # one socket, one bridged pair, R535+ columns (GPU NUMA ID) and a NIC legend
    ("nvidia_smi_topo_m_nic_legend.txt", (0, 1, 2, 3), [(0, 1)], ((2, 3), "PHB")),
])
def test_topo_matrix(file, gpus, pairs, cell):
    matrix = nvidia_topo.parse_topo_matrix(fixture(file))
    assert matrix.gpus == gpus
    assert matrix.nvlinked() == pairs
    assert matrix.links[cell[0]] == cell[1] and matrix.links[cell[0][::-1]] == cell[1]


def test_topo_matrix_without_gpus_and_malformed():
    assert nvidia_topo.parse_topo_matrix("No devices were found\n").gpus == ()
    with pytest.raises(RemoteCommandError, match=r"`nvidia-smi topo -m`: expected a matrix"):
        nvidia_topo.parse_topo_matrix("NVIDIA-SMI has failed\n")
    with pytest.raises(RemoteCommandError, match=r"rows of 2 cells"):
        nvidia_topo.parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNVLINK\t0-31\n")


def test_bus_ids():
    text = "0, 00000000:17:00.0\n1, 00000000:31:00.0\n2, 00000000:B1:00.0\n"
    assert nvidia_topo.parse_bus_ids(text) == {0: "0000:17:00.0", 1: "0000:31:00.0", 2: "0000:b1:00.0"}
    with pytest.raises(RemoteCommandError, match="index, 00000000:17:00.0"):
        nvidia_topo.parse_bus_ids("0, GPU-1234\n")


def test_mlxconfig_query_accepts_lower_case_parameter_names():
    """MFT names some boot-ROM parameters in mixed case (EXP_ROM_UEFI_x86_ENABLE): a real
    ConnectX-6 Dx `mlxconfig -d ... q` is read, not refused."""
    params = mlxconfig.parse_mlxconfig_query(fixture("mlxconfig_q_boot_rom.txt"))
    assert params["EXP_ROM_UEFI_x86_ENABLE"] == "True(1)"
    assert params["EXP_ROM_UEFI_ARM_ENABLE"] == "False(0)"
    assert params["ATS_ENABLED"] == "False(0)"
    assert len(params) == 34


def test_software_components_and_the_nvidia_host_driver_among_them():
    from gpuvm.steps.esxi_vgpu_manager import _is_host_driver

    components = esxcli.parse_components(fixture("esxcli_software_component_list_nvidia.txt"))
    assert [c.name for c in components][:3] == ["Broadcom-ELX-IMA-plugin", "ESXi", "NVD-AIE-800"]
    nvidia = [c for c in components if _is_host_driver(c)]  # not NVIDIA's GPU management daemon
    assert [(c.name, c.version, c.driver_version) for c in nvidia] == [
        ("NVD-AIE-800", "535.154.02-1OEM.800.1.0.20613240", "535.154.02")]


def test_software_components_without_the_columns_are_refused():
    with pytest.raises(RemoteCommandError, match="esxcli software component list"):
        esxcli.parse_components("Name   Size\n-----  ----\nfoo    1\n")
