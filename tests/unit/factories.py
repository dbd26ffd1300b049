"""Small builders of inventory facts for table-driven plan tests (like the simulator's R750xa)."""

from __future__ import annotations

from gpuvm.vsphere.facts import HostFacts, Inventory, PciDevice, VmFacts

GPU_ADDRESSES = [("0000:17:00.0", 0), ("0000:31:00.0", 0), ("0000:b1:00.0", 1), ("0000:ca:00.0", 1)]


A100_80GB = (0x20B5, "GA100 [A100 PCIe 80GB]")
H100 = (0x2331, "GH100 [H100 PCIe]")


def r750xa(name: str = "esx-01", enabled: bool = False, active: bool = False, gpu: tuple[int, str] = A100_80GB,
           **extra) -> HostFacts:
    pci = [PciDevice(id=a, vendor_id=0x10DE, device_id=gpu[0], device_name=gpu[1], class_id=0x0302,
                     numa_node=n, passthru_capable=True, passthru_enabled=enabled, passthru_active=active)
           for a, n in GPU_ADDRESSES]
    pci += [PciDevice(id=f"0000:4b:00.{f}", vendor_id=0x15B3, device_id=0x101B, class_id=0x0207,
                      device_name="MT28908 Family [ConnectX-6]", numa_node=0, passthru_capable=True,
                      passthru_enabled=enabled, passthru_active=active) for f in (0, 1)]
    pci.append(PciDevice(id="0000:00:00.0", vendor_id=0x8086, device_id=0x09A2, device_name="Ice Lake Memory Map"))
    defaults = dict(name=name, moid=f"host-{name}", system_uuid=f"uuid-{name}", memory_mb=1024 * 1024,
                    vgpu_profiles=["grid_a100d-3-40c", "grid_a100d-80c"], pci=pci)
    defaults.update(extra)
    return HostFacts(**defaults)


def vm(name: str, host: str = "esx-01", **extra) -> VmFacts:
    defaults = dict(name=name, moid=f"vm-{name}", host=host, cpus=4, memory_mb=8192, firmware="bios")
    defaults.update(extra)
    return VmFacts(**defaults)


# A runbook of one host, one VM and its guest, as `str.format` text (literal braces doubled); what the guest
# entry needs more follows, indented by six spaces.
ONE_GUEST_RUNBOOK = """\
hosts: [{{name: esx-01}}]
vms: [{{name: gpu-vm-01, host: esx-01}}]
guests:
  hosts:
    - vm: gpu-vm-01
      ssh: {{address: 10.0.0.13, user: gpuadmin}}
"""


def bench_cli():
    """`gpuvm bench …` of the report commands, invoked in process: args → CliRunner's result."""
    import typer
    from typer.testing import CliRunner

    from gpuvm.cli.bench_report import register

    app, bench = typer.Typer(), typer.Typer()
    register(bench)
    app.add_typer(bench, name="bench")
    return lambda *args: CliRunner().invoke(app, ["bench", *map(str, args)])


def inventory(hosts: list[HostFacts], vms: list[VmFacts]) -> Inventory:
    return Inventory(hosts={h.name: h for h in hosts}, vms={v.name: v for v in vms})
