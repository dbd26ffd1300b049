package main

// The capacity rules ESXi applies that gpuvm also checks at plan time
// (src/gpuvm/capacity.py): vGPU placement on GPUs, MIG mode for MIG-backed
// profiles, the VM hardware version each passthrough backing needs, and vCPUs
// against the host's logical CPUs.

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// vgpuMu guards every gpuHost.vgpus.
var vgpuMu sync.Mutex

// grid_a100-20c: time-sliced, 20 GB; grid_a100d-3-40c: MIG-backed, 3 compute slices, 40 GB;
// nvidia_h200x-1-18cme: MIG-backed on 1g.18gb+me; nvidia_rtx_pro_6000_blackwell_dc-4-96q (as
// src/gpuvm/vgpu_profiles.py reads them).
var profileRE = regexp.MustCompile(`(?i)^(?:(?:grid|nvidia)_)?[a-z][a-z0-9_]*?-(?:(\d)-)?(\d+)[abcq](?:me)?$`)

type vgpuProfile struct {
	name       string
	gb, slices int // slices 0: time-sliced
}

func parseProfile(name string) (vgpuProfile, bool) {
	m := profileRE.FindStringSubmatch(name)
	if m == nil {
		return vgpuProfile{}, false
	}
	gb, _ := strconv.Atoi(m[2])
	slices, _ := strconv.Atoi(m[1])
	return vgpuProfile{name, gb, slices}, true
}

const (
	migComputeSlices = 7 // A100 and H100
	migMemorySlices  = 8
)

// gpuLoad is what one GPU runs while vGPUs are placed on it. A GPU in MIG mode
// runs MIG-backed vGPUs only, up to 7 compute and 8 memory slices (a profile's
// memory slices: its share of the GPU's memory in eighths); otherwise it runs
// time-sliced vGPUs of one frame-buffer size, as many as its memory holds.
type gpuLoad struct {
	id              string
	memoryGB        int
	blocked         string
	mig             bool
	size            int
	compute, memory int
	users           []string
}

func (l *gpuLoad) refusal(p vgpuProfile) string {
	by := strings.Join(l.users, ", ")
	switch {
	case l.blocked != "":
		return l.blocked
	case p.slices == 0 && l.mig:
		return "is in MIG mode"
	case p.slices == 0 && l.size != 0 && l.size != p.gb:
		return fmt.Sprintf("runs %d GB vGPUs (%s)", l.size, by)
	case p.slices == 0 && (len(l.users)+1)*p.gb > l.memoryGB:
		return fmt.Sprintf("is full (%s)", by)
	case p.slices > 0 && !l.mig:
		return "is not in MIG mode"
	case p.slices > 0 && (l.compute+p.slices > migComputeSlices || l.memory+l.memSlices(p) > migMemorySlices):
		return fmt.Sprintf("has %d of %d MIG compute slices free (%s)", migComputeSlices-l.compute, migComputeSlices, by)
	}
	return ""
}

// memSlices is the profile's share of the GPU's memory in eighths, rounded (3g.71gb of 141 GB: 4).
func (l *gpuLoad) memSlices(p vgpuProfile) int {
	return (p.gb*migMemorySlices + l.memoryGB/2) / l.memoryGB
}

func (l *gpuLoad) take(vm string, p vgpuProfile) {
	l.users = append(l.users, vm)
	if p.slices == 0 {
		l.size = p.gb
		return
	}
	l.compute += p.slices
	l.memory += l.memSlices(p)
}

// vgpuLoads is every GPU of the host with the vGPUs of its other powered-on VMs.
func (h *gpuHost) vgpuLoads(self types.ManagedObjectReference, memoryGB int) []*gpuLoad {
	var loads []*gpuLoad
	byID := map[string]*gpuLoad{}
	for _, s := range h.pci {
		if !s.gpu {
			continue
		}
		l := &gpuLoad{id: s.id, memoryGB: memoryGB, mig: h.mig[s.id]}
		switch t := h.graphicsTypeFor(s.id); t {
		case "direct":
			l.blocked = "is passthrough (DirectPath)"
		case "sharedDirect":
		default:
			l.blocked = fmt.Sprintf("has graphics type %s, not sharedDirect", t)
		}
		loads = append(loads, l)
		byID[s.id] = l
	}
	vgpuMu.Lock()
	defer vgpuMu.Unlock()
	for _, ref := range h.hs.Vm {
		other, ok := simulator.Map.Get(ref).(*simulator.VirtualMachine)
		if ref == self || !ok || other.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
			continue
		}
		for i, name := range vgpuNames(other) {
			p, ok := parseProfile(name)
			if placed := h.vgpus[ref.Value]; ok && i < len(placed) && byID[placed[i]] != nil {
				byID[placed[i]].take(other.Name, p)
			}
		}
	}
	return loads
}

func vgpuNames(vm *simulator.VirtualMachine) []string {
	var names []string
	for _, d := range vm.Config.Hardware.Device {
		if pt, ok := d.(*types.VirtualPCIPassthrough); ok {
			if b, ok := pt.Backing.(*types.VirtualPCIPassthroughVmiopBackingInfo); ok {
				names = append(names, b.Vgpu)
			}
		}
	}
	return names
}

// placeVgpus puts each vGPU on a GPU already running vGPUs it can join, else on
// the first free one, and returns a func recording the placement.
func (g *gpusim) placeVgpus(vm *simulator.VirtualMachine, h *gpuHost, names []string) (func(), types.BaseMethodFault) {
	if len(names) == 0 {
		return func() {}, nil
	}
	loads := h.vgpuLoads(vm.Self, g.gpu.memoryGB)
	placed := make([]string, len(names))
	for i, name := range names {
		p, ok := parseProfile(name)
		if !ok {
			continue // a name gpusim cannot read is not placed
		}
		var best *gpuLoad
		var why []string
		for _, l := range loads {
			if r := l.refusal(p); r != "" {
				why = append(why, shortID(l.id)+" "+r)
			} else if best == nil || (len(best.users) == 0 && len(l.users) > 0) {
				best = l
			}
		}
		if best == nil {
			return nil, vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Could not initialize plugin for vGPU %q: insufficient resources: no graphics device on host %s has room for it (%s).", name, h.hs.Name, strings.Join(why, "; ")))
		}
		best.take(vm.Name, p)
		placed[i] = best.id
	}
	return func() {
		vgpuMu.Lock()
		defer vgpuMu.Unlock()
		if h.vgpus == nil {
			h.vgpus = map[string][]string{}
		}
		h.vgpus[vm.Self.Value] = placed
	}, nil
}

// Minimum VM hardware version per passthrough backing (VMware docs, see
// src/gpuvm/hw_versions.py): DirectPath 7, vGPU 11 (more than one vGPU: 15),
// dynamic DirectPath 17.
func neededVersion(b types.BaseVirtualDeviceBackingInfo, vgpus int) int {
	switch b.(type) {
	case *types.VirtualPCIPassthroughDynamicBackingInfo:
		return 17
	case *types.VirtualPCIPassthroughVmiopBackingInfo:
		if vgpus > 1 {
			return 15
		}
		return 11
	}
	return 7
}

// checkDeviceVersions refuses, like vCenter, a device the VM's hardware version does not support.
func checkDeviceVersions(vm *simulator.VirtualMachine, spec *types.VirtualMachineConfigSpec) types.BaseMethodFault {
	have, err := strconv.Atoi(strings.TrimPrefix(vm.Config.Version, "vmx-"))
	if err != nil {
		return nil
	}
	vgpus := vgpusAfter(vm, spec)
	for i, c := range spec.DeviceChange {
		dc := c.GetVirtualDeviceConfigSpec()
		pt, ok := dc.Device.(*types.VirtualPCIPassthrough)
		if !ok || dc.Operation != types.VirtualDeviceConfigSpecOperationAdd {
			continue
		}
		if need := neededVersion(pt.Backing, vgpus); have < need {
			want := fmt.Sprintf("vmx-%d", need)
			msg := fmt.Sprintf("The device or operation specified at index '%d' is not supported for the current virtual machine version '%s'. A minimum version of '%s' is required for this operation to succeed.", i, vm.Config.Version, want)
			return &types.DeviceUnsupportedForVmVersion{
				InvalidDeviceSpec: types.InvalidDeviceSpec{
					InvalidVmConfig: types.InvalidVmConfig{
						VmConfigFault: types.VmConfigFault{VimFault: types.VimFault{MethodFault: methodFault(msg)}},
						Property:      fmt.Sprintf("virtualDeviceSpec[%d].device.backing", i),
					},
					DeviceIndex: int32(i),
				},
				CurrentVersion: vm.Config.Version, ExpectedVersion: want,
			}
		}
	}
	return nil
}

func isVgpu(d types.BaseVirtualDevice) bool {
	pt, ok := d.(*types.VirtualPCIPassthrough)
	if !ok {
		return false
	}
	_, ok = pt.Backing.(*types.VirtualPCIPassthroughVmiopBackingInfo)
	return ok
}

// vgpusAfter counts the VM's vGPUs once the spec's device changes are made.
func vgpusAfter(vm *simulator.VirtualMachine, spec *types.VirtualMachineConfigSpec) int {
	keys := map[int32]bool{}
	for _, d := range vm.Config.Hardware.Device {
		if isVgpu(d) {
			keys[d.GetVirtualDevice().Key] = true
		}
	}
	for _, c := range spec.DeviceChange {
		dc := c.GetVirtualDeviceConfigSpec()
		switch {
		case dc.Operation == types.VirtualDeviceConfigSpecOperationAdd && isVgpu(dc.Device):
			keys[dc.Device.GetVirtualDevice().Key] = true
		case dc.Operation == types.VirtualDeviceConfigSpecOperationRemove:
			delete(keys, dc.Device.GetVirtualDevice().Key)
		}
	}
	return len(keys)
}

// checkCPUs refuses a power-on with more vCPUs than the host has logical CPUs.
func checkCPUs(vm *simulator.VirtualMachine, h *gpuHost) types.BaseMethodFault {
	threads := int32(h.hs.Hardware.CpuInfo.NumCpuThreads)
	if n := vm.Config.Hardware.NumCPU; n > threads {
		return vmFault(fmt.Sprintf("Virtual machine has %d virtual CPUs, but the host only supports %d. The number of virtual CPUs may be limited by the guest OS selected for the virtual machine or by the licensing for the host.", n, threads))
	}
	return nil
}

// applyMig sets MIG mode from -mig HOST=all|I,J (GPU indices in PCI address
// order, as nvidia-smi numbers them). gpusim has no ESXi shell: MIG mode is
// fixed at start-up.
func (g *gpusim) applyMig(specs []string) error {
	for _, spec := range specs {
		name, list, ok := strings.Cut(spec, "=")
		var h *gpuHost
		for _, x := range g.order {
			if x.hs.Name == name {
				h = x
			}
		}
		if !ok || h == nil {
			return fmt.Errorf("-mig %q: want HOST=all or HOST=0,1 with a host of this simulator", spec)
		}
		var gpus []string
		for _, s := range h.pci {
			if s.gpu {
				gpus = append(gpus, s.id)
			}
		}
		sort.Strings(gpus)
		h.mig = map[string]bool{}
		for _, item := range strings.Split(list, ",") {
			if item == "all" {
				for _, id := range gpus {
					h.mig[id] = true
				}
				continue
			}
			n, err := strconv.Atoi(item)
			if err != nil || n < 0 || n >= len(gpus) {
				return fmt.Errorf("-mig %q: %q is not a GPU index (0-%d) or all", spec, item, len(gpus)-1)
			}
			h.mig[gpus[n]] = true
		}
	}
	return nil
}
