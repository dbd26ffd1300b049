package main

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// addNetworks makes each -network NAME[:HOST,HOST...] a standard port group (vSwitch0) on those
// hosts (default: all), in the datacenter's network folder and in their HostSystem.network, as
// vCenter lists a port group the hosts have. Hosts left out lack it: a clone there with a NIC
// on it fails (CannotAccessNetwork).
func (g *gpusim) addNetworks(ctx context.Context, c *govmomi.Client, specs []string) error {
	for _, spec := range specs {
		name, list, _ := strings.Cut(spec, ":")
		hosts := g.order
		if list != "" {
			hosts = nil
			for _, want := range strings.Split(list, ",") {
				var found *gpuHost
				for _, h := range g.order {
					if h.hs.Name == want {
						found = h
					}
				}
				if found == nil {
					return fmt.Errorf("-network %s: no host %s", spec, want)
				}
				hosts = append(hosts, found)
			}
		}
		ns, err := object.NewHostSystem(c.Client, hosts[0].hs.Self).ConfigManager().NetworkSystem(ctx)
		if err != nil {
			return err
		}
		if err := ns.AddPortGroup(ctx, types.HostPortGroupSpec{Name: name, VswitchName: "vSwitch0"}); err != nil {
			return fmt.Errorf("-network %s: %w", spec, err)
		}
		network := findNetwork(name)
		if network == nil {
			return fmt.Errorf("-network %s: not created", spec)
		}
		for _, h := range hosts {
			hs := h.hs
			simulator.Map.WithLock(hs, func() { // a copy: hosts of a cluster share the stock slice
				hs.Network = append(append([]types.ManagedObjectReference(nil), hs.Network...), network.Self)
			})
			simulator.Map.AddReference(network, &network.Host, hs.Self)
		}
	}
	return nil
}

// findNetwork is the standard network (port group) of that name, or nil.
func findNetwork(name string) *mo.Network {
	for _, obj := range simulator.Map.All("Network") {
		if n, ok := obj.(*mo.Network); ok && n.Name == name {
			return n
		}
	}
	return nil
}

// findPortgroup is the distributed port group of that key, or nil.
func findPortgroup(key string) *simulator.DistributedVirtualPortgroup {
	for _, obj := range simulator.Map.All("DistributedVirtualPortgroup") {
		if pg, ok := obj.(*simulator.DistributedVirtualPortgroup); ok && pg.Key == key {
			return pg
		}
	}
	return nil
}

// cloneNICs gives a clone the source's virtual NICs, with the clone spec's edits of them
// (config.deviceChange, operation edit, by device key) and new MACs (unless set by hand). Each
// NIC's network must exist (else NotFound, or ManagedObjectNotFound for a reference) and be one
// of the target host's (else CannotAccessNetwork, vCenter's "Network interface '...' uses network
// '...', which is not accessible."), checked before anything is created. Other device changes
// are refused (InvalidDeviceSpec): gpuvm makes none.
func cloneNICs(src *simulator.VirtualMachine, req *types.CloneVM_Task, hs *simulator.HostSystem) ([]types.BaseVirtualDeviceConfigSpec, types.BaseMethodFault) {
	nics := map[int32]types.BaseVirtualDevice{}
	for _, d := range src.Config.Hardware.Device {
		if _, ok := d.(types.BaseVirtualEthernetCard); ok {
			nics[d.GetVirtualDevice().Key] = d
		}
	}
	edits := map[int32]types.BaseVirtualDevice{}
	if req.Spec.Config != nil {
		for i, change := range req.Spec.Config.DeviceChange {
			spec := change.GetVirtualDeviceConfigSpec()
			_, card := spec.Device.(types.BaseVirtualEthernetCard)
			key := spec.Device.GetVirtualDevice().Key
			if _, known := nics[key]; !card || !known || spec.Operation != types.VirtualDeviceConfigSpecOperationEdit {
				msg := fmt.Sprintf("Invalid configuration for device '%d'.", i)
				return nil, &types.InvalidDeviceSpec{DeviceIndex: int32(i), InvalidVmConfig: types.InvalidVmConfig{
					VmConfigFault: types.VmConfigFault{VimFault: types.VimFault{MethodFault: methodFault(msg)}}}}
			}
			edits[key] = spec.Device
		}
	}
	var adds []types.BaseVirtualDeviceConfigSpec
	for _, d := range src.Config.Hardware.Device {
		if _, ok := d.(types.BaseVirtualEthernetCard); !ok {
			continue
		}
		if edit, ok := edits[d.GetVirtualDevice().Key]; ok {
			d = edit
		}
		nic := copyNIC(d)
		if fault := checkNetwork(nic, hs); fault != nil {
			return nil, fault
		}
		adds = append(adds, &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationAdd, Device: nic})
	}
	return adds, nil
}

// copyNIC copies a NIC (its backing and connection state too, which the stock code fills in),
// without the generated MAC, which a clone gets anew.
func copyNIC(d types.BaseVirtualDevice) types.BaseVirtualDevice {
	v := reflect.New(reflect.TypeOf(d).Elem())
	v.Elem().Set(reflect.ValueOf(d).Elem())
	nic := v.Interface().(types.BaseVirtualDevice)
	card := nic.(types.BaseVirtualEthernetCard).GetVirtualEthernetCard()
	if card.AddressType != string(types.VirtualEthernetCardMacTypeManual) {
		card.MacAddress = ""
	}
	switch b := card.Backing.(type) {
	case *types.VirtualEthernetCardNetworkBackingInfo:
		c := *b
		card.Backing = &c
	case *types.VirtualEthernetCardDistributedVirtualPortBackingInfo:
		c := *b
		card.Backing = &c
	}
	if card.Connectable != nil {
		c := *card.Connectable
		card.Connectable = &c
	}
	if card.DeviceInfo != nil {
		c := *card.DeviceInfo.GetDescription()
		card.DeviceInfo = &c
	}
	return nic
}

func hasNetwork(hs *simulator.HostSystem, ref types.ManagedObjectReference) bool {
	for _, n := range hs.Network {
		if n == ref {
			return true
		}
	}
	return false
}

// checkNetwork: the NIC's network exists and the host has it (as vCenter checks a clone's NICs
// against its target host). A standard backing's deviceName is set from its network reference.
func checkNetwork(nic types.BaseVirtualDevice, hs *simulator.HostSystem) types.BaseMethodFault {
	card := nic.(types.BaseVirtualEthernetCard).GetVirtualEthernetCard()
	label := "Network adapter"
	if card.DeviceInfo != nil && card.DeviceInfo.GetDescription().Label != "" {
		label = card.DeviceInfo.GetDescription().Label
	}
	notFound := &types.NotFound{VimFault: types.VimFault{MethodFault: methodFault("The object or item referred to could not be found.")}}
	var ref types.ManagedObjectReference
	var name string
	switch b := card.Backing.(type) {
	case *types.VirtualEthernetCardNetworkBackingInfo:
		if b.Network != nil {
			n, ok := simulator.Map.Get(*b.Network).(*mo.Network)
			if !ok {
				msg := fmt.Sprintf("The object 'vim.Network:%s' has already been deleted or has not been completely created", b.Network.Value)
				return &types.ManagedObjectNotFound{RuntimeFault: types.RuntimeFault{MethodFault: methodFault(msg)}, Obj: *b.Network}
			}
			b.DeviceName = n.Name
		}
		n := findNetwork(b.DeviceName)
		if n == nil {
			return notFound
		}
		ref, name = n.Self, n.Name
		b.Network = &ref
	case *types.VirtualEthernetCardDistributedVirtualPortBackingInfo:
		pg := findPortgroup(b.Port.PortgroupKey)
		if pg == nil || pg.Config.DistributedVirtualSwitch == nil {
			return notFound
		}
		dvs, ok := simulator.Map.Get(*pg.Config.DistributedVirtualSwitch).(*simulator.DistributedVirtualSwitch)
		if !ok || dvs.Uuid != b.Port.SwitchUuid {
			return notFound
		}
		ref, name = pg.Self, pg.Name
	default:
		return nil // no network (or a kind gpusim does not model): left as the stock code takes it
	}
	if hasNetwork(hs, ref) {
		return nil
	}
	// vCenter's words for a NIC whose network the host lacks
	msg := fmt.Sprintf("Network interface '%s' uses network '%s', which is not accessible.", label, name)
	return &types.CannotAccessNetwork{Network: &ref, CannotAccessVmDevice: types.CannotAccessVmDevice{
		Device: label, Backing: name, Connected: card.Connectable != nil && card.Connectable.StartConnected,
		CannotAccessVmComponent: types.CannotAccessVmComponent{VmConfigFault: types.VmConfigFault{
			VimFault: types.VimFault{MethodFault: methodFault(msg)}}}}}
}

// markUplinks lists each switch's uplink port group (the stock "<switch>-DVUplinks-N") in its
// config.uplinkPortgroup, as vCenter does: no VM's NIC may join it.
func markUplinks() {
	for _, kind := range []string{"VmwareDistributedVirtualSwitch", "DistributedVirtualSwitch"} {
		for _, obj := range simulator.Map.All(kind) {
			dvs, ok := obj.(*simulator.DistributedVirtualSwitch)
			if !ok {
				continue
			}
			for _, ref := range dvs.Portgroup {
				pg, ok := simulator.Map.Get(ref).(*simulator.DistributedVirtualPortgroup)
				if !ok || !strings.Contains(pg.Name, "-DVUplinks") {
					continue
				}
				simulator.Map.WithLock(dvs, func() {
					cfg := dvs.Config.GetDVSConfigInfo()
					cfg.UplinkPortgroup = append(cfg.UplinkPortgroup, ref)
				})
			}
		}
	}
}
