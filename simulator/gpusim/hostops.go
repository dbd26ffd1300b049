package main

import (
	"fmt"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

func poweredOnVMs(h *gpuHost) []*simulator.VirtualMachine {
	var out []*simulator.VirtualMachine
	for _, ref := range h.hs.Vm {
		if vm, ok := simulator.Map.Get(ref).(*simulator.VirtualMachine); ok &&
			vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
			out = append(out, vm)
		}
	}
	return out
}

func vmNames(h *gpuHost) []string {
	var out []string
	for _, ref := range h.hs.Vm {
		if vm, ok := simulator.Map.Get(ref).(*simulator.VirtualMachine); ok {
			out = append(out, vm.Name)
		}
	}
	return out
}

// EnterMaintenanceModeTask fails while any VM on the host is powered on, as
// on ESXi without DRS to evacuate it.
func (p *hostProxy) EnterMaintenanceModeTask(req *types.EnterMaintenanceMode_Task) soap.HasFault {
	h := p.g.host(p.real)
	ref := p.g.startTask(h.hs, "enterMaintenanceMode", "EnterMaintenanceMode_Task", func() (types.AnyType, types.BaseMethodFault) {
		if on := poweredOnVMs(h); len(on) > 0 {
			return nil, invalidState(fmt.Sprintf("The operation is not allowed in the current state: host %s has %d powered-on virtual machine(s) (%s, ...) and cannot enter maintenance mode.", h.hs.Name, len(on), on[0].Name))
		}
		simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "runtime.inMaintenanceMode", Val: true}})
		return nil, nil
	})
	return &methods.EnterMaintenanceMode_TaskBody{Res: &types.EnterMaintenanceMode_TaskResponse{Returnval: ref}}
}

// RebootHostTask needs maintenance mode (or force). A reboot makes
// passthruActive follow passthruEnabled for every device and the GPUs take the
// configured graphics type; with force, VMs still running are powered off. A
// reboot whose hook fails changes nothing (the host did not come back new).
func (p *hostProxy) RebootHostTask(req *types.RebootHost_Task) soap.HasFault {
	h := p.g.host(p.real)
	ref := p.g.startTask(h.hs, "reboot", "RebootHost_Task", func() (types.AnyType, types.BaseMethodFault) {
		if !h.hs.Runtime.InMaintenanceMode && !req.Force {
			return nil, invalidState("host must be in maintenance mode")
		}
		if err := p.g.runRebootHook(h.hs.Name, vmNames(h)); err != nil {
			return nil, &types.SystemError{RuntimeFault: types.RuntimeFault{MethodFault: types.MethodFault{
				FaultMessage: []types.LocalizableMessage{{Key: "gpusim.reboot", Message: err.Error()}}}},
				Reason: err.Error()}
		}
		for _, vm := range poweredOnVMs(h) {
			simulator.Map.WithLock(vm, func() {
				releaseDynamic(vm)
				simulator.Map.Update(vm, []types.PropertyChange{
					{Name: "runtime.powerState", Val: types.VirtualMachinePowerStatePoweredOff},
					{Name: "summary.runtime.powerState", Val: types.VirtualMachinePowerStatePoweredOff},
				})
			})
		}
		for _, b := range h.hs.Config.PciPassthruInfo {
			info := b.GetHostPciPassthruInfo()
			info.PassthruActive = info.PassthruEnabled && info.PassthruCapable
		}
		if cfg := h.hs.Config.GraphicsConfig; cfg != nil {
			h.bootGraphics = *cfg
		}
		h.passthru.publish()
		now := time.Now()
		simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "runtime.bootTime", Val: &now}})
		return nil, nil
	})
	return &methods.RebootHost_TaskBody{Res: &types.RebootHost_TaskResponse{Returnval: ref}}
}
