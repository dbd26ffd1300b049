package main

import (
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// CloneVMTask clones a VM or template onto the host, resource pool and datastore the spec's
// location names (the stock simulator keeps the source's host), copying what a clone keeps:
// hardware version, firmware, CPUs, memory, reservation and extraConfig, plus the spec's
// extraConfig (cloud-init's guestinfo.*), and the source's virtual NICs with the spec's edits of
// them (cloneNICs: a network the target host lacks fails the clone). The datastore must have room for the clone's disk
// (-clone-disk-gb of -datastore-gb), else NoDiskSpace as vSphere words it. As vCenter, it refuses
// (DuplicateName) a name the destination folder has, or is cloning into it (the stock simulator
// made a second VM of that name).
func (p *vmProxy) CloneVMTask(ctx *simulator.Context, req *types.CloneVM_Task) soap.HasFault {
	src := p.vm()
	if src == nil {
		return &methods.CloneVM_TaskBody{Fault_: notFound(p.real)}
	}
	duplicate := !inFlight.claim(req.Folder, req.Name)
	ref := p.g.startTask(src, "cloneVm", "CloneVM_Task", func() (types.AnyType, types.BaseMethodFault) {
		if duplicate {
			return nil, duplicateName(req.Name, req.Folder)
		}
		defer inFlight.release(req.Folder, req.Name)
		if reason, fail := p.g.faults.takeCloneFault(req.Name); fail {
			return nil, injectedFault(reason)
		}
		loc := req.Spec.Location
		hostRef := src.Runtime.Host
		if loc.Host != nil {
			hostRef = loc.Host
		}
		if hostRef == nil || p.g.host(*hostRef) == nil {
			return nil, &types.InvalidArgument{InvalidProperty: "spec.location.host"}
		}
		hs := p.g.host(*hostRef).hs
		pool := loc.Pool
		if pool != nil {
			// vCenter places a clone only in a pool of the host's own cluster
			if rp, ok := simulator.Map.Get(*pool).(*simulator.ResourcePool); !ok || rp.Owner != *hs.Parent {
				return nil, &types.InvalidArgument{InvalidProperty: "spec.location.pool",
					RuntimeFault: types.RuntimeFault{MethodFault: methodFault("A specified parameter was not correct: spec.location.pool")}}
			}
		}
		if pool == nil {
			cr, ok := simulator.Map.Get(*hs.Parent).(*simulator.ClusterComputeResource)
			if !ok {
				return nil, &types.InvalidArgument{InvalidProperty: "spec.location.pool"}
			}
			pool = cr.ResourcePool
		}
		dsRef := loc.Datastore
		if dsRef == nil && len(src.Datastore) > 0 {
			dsRef = &src.Datastore[0]
		}
		ds, ok := simulator.Map.Get(*dsRef).(*simulator.Datastore)
		if dsRef == nil || !ok {
			return nil, &types.InvalidArgument{InvalidProperty: "spec.location.datastore"}
		}
		if fault := p.g.checkSpace(ds.Name); fault != nil {
			return nil, fault
		}
		folder, ok := simulator.Map.Get(req.Folder).(*simulator.Folder)
		if !ok {
			return nil, &types.InvalidArgument{InvalidProperty: "folder"}
		}
		nics, fault := cloneNICs(src, req, hs)
		if fault != nil {
			return nil, fault
		}
		config := types.VirtualMachineConfigSpec{
			Name:                         req.Name,
			GuestId:                      src.Config.GuestId,
			Version:                      src.Config.Version,
			NumCPUs:                      src.Config.Hardware.NumCPU,
			MemoryMB:                     int64(src.Config.Hardware.MemoryMB),
			Firmware:                     src.Config.Firmware,
			MemoryReservationLockedToMax: src.Config.MemoryReservationLockedToMax,
			Files:                        &types.VirtualMachineFileInfo{VmPathName: fmt.Sprintf("[%s]", ds.Name)},
			DeviceChange:                 nics,
		}
		create := &types.CreateVM_Task{This: folder.Self, Config: config, Pool: *pool, Host: hostRef}
		res, err := p.g.stockTaskResult(p.real, func() soap.HasFault { return folder.CreateVMTask(ctx, create) })
		if err != nil {
			return nil, err
		}
		clone := simulator.Map.Get(res.(types.ManagedObjectReference)).(*simulator.VirtualMachine)
		extra := append(append([]types.BaseOptionValue(nil), src.Config.ExtraConfig...), cloneExtraConfig(req)...)
		simulator.Map.WithLock(clone, func() {
			mergeExtraConfig(clone, extra)
			bumpChangeVersion(clone)
		})
		p.g.recordClone(clone.Self, ds.Name)
		return clone.Self, nil
	})
	return &methods.CloneVM_TaskBody{Res: &types.CloneVM_TaskResponse{Returnval: ref}}
}

// inFlight holds the names being cloned into each folder, from the call until the task ends.
var inFlight = clonesInFlight{names: map[string]bool{}}

type clonesInFlight struct {
	mu    sync.Mutex
	names map[string]bool // folder moid + "/" + VM name
}

// claim reserves `name` in `folder` for a clone; false when the folder has a child of that name or
// a clone to it runs.
func (c *clonesInFlight) claim(folder types.ManagedObjectReference, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := folder.Value + "/" + name
	if c.names[key] || childNamed(folder, name) {
		return false
	}
	c.names[key] = true
	return true
}

func (c *clonesInFlight) release(folder types.ManagedObjectReference, name string) {
	c.mu.Lock()
	delete(c.names, folder.Value+"/"+name)
	c.mu.Unlock()
}

func childNamed(folder types.ManagedObjectReference, name string) bool {
	f, ok := simulator.Map.Get(folder).(*simulator.Folder)
	if !ok {
		return false
	}
	for _, child := range f.ChildEntity {
		if e, ok := simulator.Map.Get(child).(mo.Entity); ok && e.Entity().Name == name {
			return true
		}
	}
	return false
}

// duplicateName is vCenter's fault for a second object of one name in a folder.
func duplicateName(name string, folder types.ManagedObjectReference) types.BaseMethodFault {
	return &types.DuplicateName{VimFault: types.VimFault{MethodFault: methodFault(
		fmt.Sprintf("The name '%s' already exists.", name))}, Name: name, Object: folder}
}

func cloneExtraConfig(req *types.CloneVM_Task) []types.BaseOptionValue {
	if req.Spec.Config == nil {
		return nil
	}
	return req.Spec.Config.ExtraConfig
}

// usedGB is what the clones that still exist take on datastore ds (-clone-disk-gb each); g.mu held.
func (g *gpusim) usedGB(ds string) int {
	used := 0
	for ref, name := range g.clones {
		if _, alive := simulator.Map.Get(ref).(*simulator.VirtualMachine); !alive {
			delete(g.clones, ref)
		} else if name == ds {
			used += g.cloneDiskGB
		}
	}
	return used
}

// checkSpace refuses a clone that does not fit on the datastore: every clone that still exists
// takes -clone-disk-gb of its datastore's -datastore-gb.
func (g *gpusim) checkSpace(ds string) types.BaseMethodFault {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.usedGB(ds)+g.cloneDiskGB <= g.datastoreGB {
		return nil
	}
	// The words vCenter uses (terraform-vsphere-vm issue #130, vmware_rest PR #299).
	msg := fmt.Sprintf("Insufficient disk space on datastore '%s'.", ds)
	return &types.NoDiskSpace{FileFault: types.FileFault{VimFault: types.VimFault{MethodFault: methodFault(msg)}}, Datastore: ds}
}

func (g *gpusim) recordClone(ref types.ManagedObjectReference, ds string) {
	g.mu.Lock()
	g.clones[ref] = ds
	g.mu.Unlock()
	g.publishSpace()
}

// publishSpace shows the clone room as each datastore's summary.capacity (-datastore-gb) and
// summary.freeSpace (less what the clones take), as vCenter reports a datastore's space.
func (g *gpusim) publishSpace() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, obj := range simulator.Map.All("Datastore") {
		ds, ok := obj.(*simulator.Datastore)
		if !ok {
			continue
		}
		free := int64(g.datastoreGB-g.usedGB(ds.Name)) << 30
		simulator.Map.Update(ds, []types.PropertyChange{
			{Name: "summary.capacity", Val: int64(g.datastoreGB) << 30},
			{Name: "summary.freeSpace", Val: free},
		})
	}
}

// diskSize gives a template what its clones take (-clone-disk-gb) as summary.storage.committed,
// the space its files use, which vCenter reports and a full clone copies.
func (g *gpusim) diskSize(vm *simulator.VirtualMachine) {
	simulator.Map.WithLock(vm, func() {
		vm.Summary.Storage = &types.VirtualMachineStorageSummary{Committed: int64(g.cloneDiskGB) << 30, Timestamp: time.Now()}
		simulator.Map.Update(vm, []types.PropertyChange{{Name: "summary.storage", Val: vm.Summary.Storage}})
	})
}

// DestroyTask is the stock Destroy_Task; the datastore gets the clone's room back.
func (p *vmProxy) DestroyTask(ctx *simulator.Context, req *types.Destroy_Task) soap.HasFault {
	vm := p.vm()
	if vm == nil {
		return &methods.Destroy_TaskBody{Fault_: notFound(p.real)}
	}
	ref := p.g.startTask(vm, "destroy", "Destroy_Task", func() (types.AnyType, types.BaseMethodFault) {
		stock := *req
		stock.This = p.real
		res, err := p.g.stockTaskResult(p.real, func() soap.HasFault { return vm.DestroyTask(ctx, &stock) })
		p.g.publishSpace()
		return res, err
	})
	return &methods.Destroy_TaskBody{Res: &types.Destroy_TaskResponse{Returnval: ref}}
}

// runPowerOnHook runs the -on-power-on command when a VM that carries cloud-init's
// guestinfo.metadata powers on, with GPUSIM_VM and the guestinfo values (as set, base64 when
// their .encoding says so) in GPUSIM_METADATA / GPUSIM_USERDATA, so that a test bed can boot a
// guest with that identity. A failing hook is logged: the guest just never answers.
func (g *gpusim) runPowerOnHook(vm *simulator.VirtualMachine) {
	metadata, ok := extraConfigValue(vm, "guestinfo.metadata")
	if g.onPowerOn == "" || !ok {
		return
	}
	userdata, _ := extraConfigValue(vm, "guestinfo.userdata")
	cmd := exec.Command("sh", "-c", g.onPowerOn)
	cmd.Env = append(os.Environ(), "GPUSIM_VM="+vm.Name, "GPUSIM_METADATA="+metadata, "GPUSIM_USERDATA="+userdata)
	if out, err := cmd.CombinedOutput(); err != nil {
		log.Printf("power-on hook for %s failed: %v: %s", vm.Name, err, strings.TrimSpace(string(out)))
	}
}
