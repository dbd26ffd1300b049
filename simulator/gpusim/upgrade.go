package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// maxHardwareVersion is the newest VM hardware version the simulated hosts (ESXi 7.0 U3) run.
const maxHardwareVersion = 19

func hardwareVersion(text string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(text, "vmx-"))
	return n, err == nil && strings.HasPrefix(text, "vmx-")
}

// UpgradeVMTask upgrades the VM's compatibility as vSphere does (UpgradeVM_Task): only while the
// VM is powered off (InvalidPowerState), never to the same or an older version (AlreadyUpgraded),
// never past what the host runs. The stock simulator upgrades to its own version whatever was asked.
func (p *vmProxy) UpgradeVMTask(ctx *simulator.Context, req *types.UpgradeVM_Task) soap.HasFault {
	vm := p.vm()
	if vm == nil {
		return &methods.UpgradeVM_TaskBody{Fault_: notFound(p.real)}
	}
	ref := p.g.startTask(vm, "upgradeVm", "UpgradeVM_Task", func() (types.AnyType, types.BaseMethodFault) {
		if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOff {
			return nil, invalidPowerState(types.VirtualMachinePowerStatePoweredOff, vm.Runtime.PowerState)
		}
		want := fmt.Sprintf("vmx-%d", maxHardwareVersion)
		if req.Version != "" {
			want = req.Version
		}
		wanted, ok := hardwareVersion(want)
		if !ok || wanted > maxHardwareVersion {
			return nil, &types.InvalidArgument{
				RuntimeFault:    types.RuntimeFault{MethodFault: methodFault("A specified parameter was not correct: version")},
				InvalidProperty: "version",
			}
		}
		if have, ok := hardwareVersion(vm.Config.Version); ok && have >= wanted {
			return nil, &types.AlreadyUpgraded{VimFault: types.VimFault{MethodFault: methodFault(
				"Virtual machine compatibility is already up-to-date.")}}
		}
		simulator.Map.Update(vm, []types.PropertyChange{{Name: "config.version", Val: want}})
		bumpChangeVersion(vm)
		return nil, nil
	})
	return &methods.UpgradeVM_TaskBody{Res: &types.UpgradeVM_TaskResponse{Returnval: ref}}
}
