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

// EnterMaintenanceModeTask enters maintenance mode as ESXi without DRS does: while VMs on the
// host run, the task keeps running (nothing evacuates them) until they are powered off, then the
// host enters; with a timeout (seconds, 0: none) still waiting then, it fails with Timedout. The
// task is cancelable (RequestCanceled) and completes whether or not its client is still there.
// -latency EnterMaintenanceMode_Task=D: entering takes at least D.
func (p *hostProxy) EnterMaintenanceModeTask(req *types.EnterMaintenanceMode_Task) soap.HasFault {
	h := p.g.host(p.real)
	if p.g.faults.latencyOf("EnterMaintenanceMode_Task") == 0 && len(poweredOnVMs(h)) == 0 {
		ref := p.g.startTask(h.hs, "enterMaintenanceMode", "EnterMaintenanceMode_Task", func() (types.AnyType, types.BaseMethodFault) {
			simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "runtime.inMaintenanceMode", Val: true}})
			return nil, nil
		})
		return &methods.EnterMaintenanceMode_TaskBody{Res: &types.EnterMaintenanceMode_TaskResponse{Returnval: ref}}
	}
	t := simulator.CreateTask(h.hs.Reference(), "enterMaintenanceMode", nil)
	simulator.Map.Update(t, []types.PropertyChange{
		{Name: "info.startTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateRunning},
	})
	canceled := cancelable(t.Self)
	go p.g.enterMaintenance(h, t, canceled, time.Duration(req.Timeout)*time.Second)
	return &methods.EnterMaintenanceMode_TaskBody{Res: &types.EnterMaintenanceMode_TaskResponse{Returnval: t.Self}}
}

// enterMaintenance waits out the latency, then for the host's VMs to stop, and completes the task.
func (g *gpusim) enterMaintenance(h *gpuHost, t *simulator.Task, canceled <-chan struct{}, timeout time.Duration) {
	began := time.Now()
	earliest := began.Add(g.faults.latencyOf("EnterMaintenanceMode_Task"))
	for {
		select {
		case <-canceled:
			completeTask(t, nil, canceledFault())
			return
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().Before(earliest) {
			continue
		}
		entered, running := false, 0
		simulator.Map.WithLock(h.hs, func() {
			if running = len(poweredOnVMs(h)); running == 0 {
				simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "runtime.inMaintenanceMode", Val: true}})
				entered = true
			}
		})
		if entered {
			completeTask(t, nil, nil)
			return
		}
		if timeout > 0 && time.Since(began) >= timeout {
			completeTask(t, nil, &types.Timedout{VimFault: types.VimFault{MethodFault: methodFault(fmt.Sprintf(
				"Operation timed out. (host %s still has %d powered-on virtual machine(s) after %s)", h.hs.Name, running, timeout))}})
			return
		}
	}
}

// RebootHostTask needs maintenance mode (or force). A reboot makes
// passthruActive follow passthruEnabled for every device and the GPUs take the
// configured graphics type; with force, VMs still running are powered off. A
// reboot whose hook fails changes nothing (the host did not come back new); one
// whose hook names the vGPU manager the host booted with runs that one.
func (p *hostProxy) RebootHostTask(req *types.RebootHost_Task) soap.HasFault {
	h := p.g.host(p.real)
	ref := p.g.startTask(h.hs, "reboot", "RebootHost_Task", func() (types.AnyType, types.BaseMethodFault) {
		if !h.hs.Runtime.InMaintenanceMode && !req.Force {
			return nil, invalidState("host must be in maintenance mode")
		}
		out, err := p.g.runRebootHook(h.hs.Name, vmNames(h))
		if err != nil {
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
		if version, ok := managerAfterReboot(out); ok {
			h.setManager(version)
		}
		now := time.Now()
		simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "runtime.bootTime", Val: &now}})
		return nil, nil
	})
	return &methods.RebootHost_TaskBody{Res: &types.RebootHost_TaskResponse{Returnval: ref}}
}
