package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

func notFound(ref types.ManagedObjectReference) *soap.Fault {
	return simulator.Fault("managed object not found: "+ref.Value, &types.ManagedObjectNotFound{Obj: ref})
}

// vmFault is the GenericVmConfigFault ESXi reports for a failed power-on.
func vmFault(msg string) types.BaseMethodFault {
	return &types.GenericVmConfigFault{
		VmConfigFault: types.VmConfigFault{VimFault: types.VimFault{MethodFault: methodFault(msg)}},
		Reason:        msg,
	}
}

func invalidPowerState(requested, existing types.VirtualMachinePowerState) types.BaseMethodFault {
	msg := fmt.Sprintf("The attempted operation cannot be performed in the current state (%s).", existing)
	return &types.InvalidPowerState{
		InvalidState:   types.InvalidState{VimFault: types.VimFault{MethodFault: methodFault(msg)}},
		RequestedState: requested,
		ExistingState:  existing,
	}
}

func invalidState(msg string) types.BaseMethodFault {
	return &types.InvalidState{VimFault: types.VimFault{MethodFault: methodFault(msg)}}
}

func isPassthrough(d types.BaseVirtualDevice) bool {
	_, ok := d.(*types.VirtualPCIPassthrough)
	return ok
}

// ReconfigVMTask: refuses to add a PCI passthrough device to a powered-on VM,
// applies -fail-reconfigure, then lets the stock simulator apply the spec,
// except extraConfig, which gpusim merges itself (replace by key, "" removes).
func (p *vmProxy) ReconfigVMTask(ctx *simulator.Context, req *types.ReconfigVM_Task) soap.HasFault {
	vm := p.vm()
	if vm == nil {
		return &methods.ReconfigVM_TaskBody{Fault_: notFound(p.real)}
	}
	ref := p.g.startTask(vm, "reconfigVm", "ReconfigVM_Task", func() (types.AnyType, types.BaseMethodFault) {
		if v := req.Spec.ChangeVersion; v != "" && v != vm.Config.ChangeVersion {
			return nil, &types.ConcurrentAccess{VimFault: types.VimFault{MethodFault: methodFault(
				"Cannot complete operation due to concurrent modification by another operation.")}}
		}
		if reason, fail := p.g.faults.takeReconfigureFault(vm.Name); fail {
			return nil, injectedFault(reason)
		}
		if err := checkDeviceVersions(vm, &req.Spec); err != nil {
			return nil, err
		}
		if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOff {
			for _, c := range req.Spec.DeviceChange {
				dc := c.GetVirtualDeviceConfigSpec()
				if dc.Operation == types.VirtualDeviceConfigSpecOperationAdd && isPassthrough(dc.Device) {
					return nil, invalidPowerState(types.VirtualMachinePowerStatePoweredOff, vm.Runtime.PowerState)
				}
			}
		}
		stock := *req
		stock.This = p.real
		var extra []types.BaseOptionValue
		for _, o := range req.Spec.ExtraConfig {
			key := o.GetOptionValue().Key
			if strings.HasPrefix(key, "SET.") || key == "ip0" {
				extra = append(extra, o) // stock simulator guest hooks
			}
		}
		stock.Spec.ExtraConfig = extra
		res, err := p.g.stockTaskResult(p.real, func() soap.HasFault { return vm.ReconfigVMTask(ctx, &stock) })
		if err != nil {
			return nil, err
		}
		mergeExtraConfig(vm, req.Spec.ExtraConfig)
		bumpChangeVersion(vm)
		return res, nil
	})
	return &methods.ReconfigVM_TaskBody{Res: &types.ReconfigVM_TaskResponse{Returnval: ref}}
}

// bumpChangeVersion gives the VM's configuration a new config.changeVersion, as vSphere does on
// every change; a ReconfigVM_Task whose spec names another changeVersion fails with ConcurrentAccess
// ("VirtualMachineConfigSpec.changeVersion", vSphere Web Services API). The VM's lock is held.
func bumpChangeVersion(vm *simulator.VirtualMachine) {
	changeVersionMu.Lock()
	changeVersionSeq++
	v := fmt.Sprintf("%s-%d", time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"), changeVersionSeq)
	changeVersionMu.Unlock()
	vm.Config.ChangeVersion = v
	simulator.Map.Update(vm, []types.PropertyChange{{Name: "config.changeVersion", Val: v}})
}

var (
	changeVersionMu  sync.Mutex
	changeVersionSeq int
)

func optionString(v types.AnyType) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	default:
		return fmt.Sprint(x)
	}
}

// mergeExtraConfig applies extraConfig like ESXi: keys are case-insensitive,
// a new value replaces the old one and an empty value removes the key.
func mergeExtraConfig(vm *simulator.VirtualMachine, changes []types.BaseOptionValue) {
	if len(changes) == 0 {
		return
	}
	cur := append([]types.BaseOptionValue(nil), vm.Config.ExtraConfig...)
	for _, c := range changes {
		o := c.GetOptionValue()
		if strings.HasPrefix(o.Key, "SET.") || o.Key == "ip0" {
			continue
		}
		idx := -1
		for i, e := range cur {
			if strings.EqualFold(e.GetOptionValue().Key, o.Key) {
				idx = i
				break
			}
		}
		val := optionString(o.Value)
		switch {
		case val == "" && idx >= 0:
			cur = append(cur[:idx], cur[idx+1:]...)
		case val == "":
		case idx >= 0:
			cur[idx] = &types.OptionValue{Key: o.Key, Value: val}
		default:
			cur = append(cur, &types.OptionValue{Key: o.Key, Value: val})
		}
	}
	simulator.Map.Update(vm, []types.PropertyChange{{Name: "config.extraConfig", Val: cur}})
}

// PowerOnVMTask checks the passthrough rules ESXi enforces before power-on.
func (p *vmProxy) PowerOnVMTask(ctx *simulator.Context, req *types.PowerOnVM_Task) soap.HasFault {
	vm := p.vm()
	if vm == nil {
		return &methods.PowerOnVM_TaskBody{Fault_: notFound(p.real)}
	}
	ref := p.g.startTask(vm, "powerOn", "PowerOnVM_Task", func() (types.AnyType, types.BaseMethodFault) {
		if vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
			return nil, invalidPowerState(types.VirtualMachinePowerStatePoweredOn, vm.Runtime.PowerState)
		}
		var h *gpuHost
		if vm.Runtime.Host != nil {
			h = p.g.host(*vm.Runtime.Host)
		}
		var assign func()
		if h != nil {
			if h.hs.Runtime.InMaintenanceMode {
				return nil, invalidState(fmt.Sprintf("The operation is not allowed in the current state: host %s is in maintenance mode.", h.hs.Name))
			}
			if err := checkCPUs(vm, h); err != nil {
				return nil, err
			}
			var err types.BaseMethodFault
			if assign, err = p.g.checkPassthrough(vm, h); err != nil {
				return nil, err
			}
		}
		stock := *req
		stock.This = p.real
		res, err := p.g.stockTaskResult(p.real, func() soap.HasFault { return vm.PowerOnVMTask(ctx, &stock) })
		if err == nil && assign != nil {
			assign()
		}
		if err == nil {
			p.g.runPowerOnHook(vm)
		}
		return res, err
	})
	return &methods.PowerOnVM_TaskBody{Res: &types.PowerOnVM_TaskResponse{Returnval: ref}}
}

// PowerOffVMTask is the stock power-off, plus releasing dynamic DirectPath devices.
func (p *vmProxy) PowerOffVMTask(ctx *simulator.Context, req *types.PowerOffVM_Task) soap.HasFault {
	vm := p.vm()
	if vm == nil {
		return &methods.PowerOffVM_TaskBody{Fault_: notFound(p.real)}
	}
	ref := p.g.startTask(vm, "powerOff", "PowerOffVM_Task", func() (types.AnyType, types.BaseMethodFault) {
		stock := *req
		stock.This = p.real
		res, err := p.g.stockTaskResult(p.real, func() soap.HasFault { return vm.PowerOffVMTask(ctx, &stock) })
		if err == nil {
			releaseDynamic(vm)
		}
		return res, err
	})
	return &methods.PowerOffVM_TaskBody{Res: &types.PowerOffVM_TaskResponse{Returnval: ref}}
}

func releaseDynamic(vm *simulator.VirtualMachine) {
	for _, d := range vm.Config.Hardware.Device {
		if pt, ok := d.(*types.VirtualPCIPassthrough); ok {
			if b, ok := pt.Backing.(*types.VirtualPCIPassthroughDynamicBackingInfo); ok {
				b.AssignedId = ""
			}
		}
	}
}

func shortID(id string) string { return strings.TrimPrefix(id, "0000:") }

// usedDevices maps passthrough device ids to the powered-on VM (other than self) using them.
func usedDevices(h *gpuHost, self types.ManagedObjectReference) map[string]string {
	used := map[string]string{}
	for _, ref := range h.hs.Vm {
		if ref == self {
			continue
		}
		other, ok := simulator.Map.Get(ref).(*simulator.VirtualMachine)
		if !ok || other.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
			continue
		}
		for _, d := range other.Config.Hardware.Device {
			pt, ok := d.(*types.VirtualPCIPassthrough)
			if !ok {
				continue
			}
			switch b := pt.Backing.(type) {
			case *types.VirtualPCIPassthroughDeviceBackingInfo:
				used[b.Id] = other.Name
			case *types.VirtualPCIPassthroughDynamicBackingInfo:
				if b.AssignedId != "" {
					used[b.AssignedId] = other.Name
				}
			}
		}
	}
	return used
}

func extraConfigValue(vm *simulator.VirtualMachine, key string) (string, bool) {
	for _, o := range vm.Config.ExtraConfig {
		ov := o.GetOptionValue()
		if strings.EqualFold(ov.Key, key) {
			return optionString(ov.Value), true
		}
	}
	return "", false
}

const pagesPerGB = 262144 // 4 KiB pages

// checkPassthrough applies ESXi's power-on rules for passthrough devices.
// On success it returns a func that records dynamic DirectPath assignments.
func (g *gpusim) checkPassthrough(vm *simulator.VirtualMachine, h *gpuHost) (func(), types.BaseMethodFault) {
	var devs []*types.VirtualPCIPassthrough
	for _, d := range vm.Config.Hardware.Device {
		if pt, ok := d.(*types.VirtualPCIPassthrough); ok {
			devs = append(devs, pt)
		}
	}
	if len(devs) == 0 {
		return nil, nil
	}
	memMB := vm.Config.Hardware.MemoryMB
	if r := vm.Config.MemoryReservationLockedToMax; r == nil || !*r {
		return nil, vmFault(fmt.Sprintf("Invalid memory setting: memory reservation (sched.mem.min) should be equal to memsize(%d).", memMB))
	}
	used := usedDevices(h, vm.Self)
	gpus := 0
	type pending struct {
		b  *types.VirtualPCIPassthroughDynamicBackingInfo
		id string
	}
	var dyn []pending
	var vgpus []string
	for _, pt := range devs {
		switch b := pt.Backing.(type) {
		case *types.VirtualPCIPassthroughDeviceBackingInfo:
			info, spec := h.passthruInfo(b.Id), h.spec(b.Id)
			if info == nil || spec == nil || !info.PassthruActive {
				return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Device %s is not a passthrough device.", shortID(b.Id)))
			}
			if other, ok := used[b.Id]; ok {
				return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Device %s is already in use by virtual machine %s.", shortID(b.Id), other))
			}
			used[b.Id] = vm.Name
			if spec.gpu {
				gpus++
			}
		case *types.VirtualPCIPassthroughDynamicBackingInfo:
			nodes, affinity := numaAffinity(vm)
			id := pickDynamic(h, b.AllowedDevice, used, nodes)
			if id == "" && nodes != nil {
				return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. No available passthrough device on host %s matches dynamic DirectPath device %d on the virtual machine's NUMA node affinity (numa.nodeAffinity = %s).", h.hs.Name, pt.Key, affinity))
			}
			if id == "" {
				return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. No available passthrough device on host %s matches dynamic DirectPath device %d.", h.hs.Name, pt.Key))
			}
			used[id] = vm.Name
			dyn = append(dyn, pending{b, id})
			if h.spec(id).vendor == vendorNVIDIA {
				gpus++
			}
		case *types.VirtualPCIPassthroughVmiopBackingInfo:
			if h.manager == "" {
				return nil, noManagerFault(b.Vgpu, h.hs.Name)
			}
			if !h.anyRunsSharedDirect() {
				return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Could not initialize plugin for vGPU %q: no GPU on host %s runs in Shared Direct (sharedDirect) graphics mode; a changed graphics type takes effect after the host reboots.", b.Vgpu, h.hs.Name))
			}
			if !contains(h.hs.Config.SharedPassthruGpuTypes, b.Vgpu) {
				return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. vGPU profile %q is not supported by host %s.", b.Vgpu, h.hs.Name))
			}
			vgpus = append(vgpus, b.Vgpu)
		default:
			return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Unsupported PCI passthrough backing %T.", pt.Backing))
		}
	}
	if gpus > 0 {
		if vm.Config.Firmware != string(types.GuestOsDescriptorFirmwareTypeEfi) {
			return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. PCI passthrough GPUs need 64-bit MMIO, which requires EFI firmware (firmware is %q).", vm.Config.Firmware))
		}
		if v, _ := extraConfigValue(vm, "pciPassthru.use64bitMMIO"); !strings.EqualFold(strings.TrimSpace(v), "TRUE") {
			return nil, vmFault("Module DevicePowerOn power on failed. PCI passthrough device BARs do not fit in 32-bit MMIO space: set pciPassthru.use64bitMMIO = \"TRUE\".")
		}
		size := 32 // ESXi's default 64-bit MMIO size when unset
		if v, ok := extraConfigValue(vm, "pciPassthru.64bitMMIOSizeGB"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 0 {
				return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Invalid pciPassthru.64bitMMIOSizeGB value %q.", v))
			}
			size = n
		}
		need := gpus * g.gpu.bar1GB()
		if size < need {
			return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Failed to map 64-bit MMIO for PCI passthrough devices: total number of pages needed (%d) exceeds limit (%d). Set pciPassthru.64bitMMIOSizeGB to at least %d.", need*pagesPerGB, size*pagesPerGB, need))
		}
	}
	placeVgpus, fault := g.placeVgpus(vm, h, vgpus)
	if fault != nil {
		return nil, fault
	}
	return func() {
		for _, d := range dyn {
			d.b.AssignedId = d.id
		}
		placeVgpus()
	}, nil
}

// numaAffinity reads the VM's numa.nodeAffinity ("1", "0,1"): the nodes, and the value as set;
// nil nodes when it is unset.
func numaAffinity(vm *simulator.VirtualMachine) (map[int]bool, string) {
	v, ok := extraConfigValue(vm, "numa.nodeAffinity")
	if !ok || strings.TrimSpace(v) == "" {
		return nil, ""
	}
	nodes := map[int]bool{}
	for _, f := range strings.Split(v, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			nodes[n] = true
		}
	}
	return nodes, v
}

// pickDynamic is the device ESXi assigns to a dynamic DirectPath backing at power-on: the first
// active, unused device the backing allows, on the VM's NUMA node affinity when it has one.
//
// VMware documents that a dynamic DirectPath device is assigned at power-on from the host's
// available devices of the allowed vendor and model (vSphere Virtual Machine Administration,
// "PCI vSphere Dynamic DirectPath I/O devices"), and that with NUMA node affinity "NUMA can
// schedule a virtual machine only on the nodes specified in the affinity", its memory coming only
// from those nodes (vSphere Resource Management, "Specifying NUMA Controls"). That the device is
// then picked on those nodes only is not stated there (unconfirmed): gpusim models it, as a device
// on another node would defeat the affinity, and gpuvm's plan shows the GPUs on that node.
func pickDynamic(h *gpuHost, allowedDevs []types.VirtualPCIPassthroughAllowedDevice, used map[string]string, nodes map[int]bool) string {
	for _, s := range h.pci {
		info := h.passthruInfo(s.id)
		if info == nil || !info.PassthruActive {
			continue
		}
		if _, taken := used[s.id]; taken {
			continue
		}
		if nodes != nil && !nodes[s.numa] {
			continue
		}
		if allowed(allowedDevs, s) {
			return s.id
		}
	}
	return ""
}

func allowed(list []types.VirtualPCIPassthroughAllowedDevice, s pciSpec) bool {
	for _, a := range list {
		if uint16(a.VendorId) == s.vendor && uint16(a.DeviceId) == s.device {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
