package main

import (
	"context"
	"fmt"
	"net/url"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// createVMs makes <host>-vm<j> on every host through the simulator's own API,
// so the stock code lays out files, devices and runtime.host as usual.
// Templates (-template) go on the first host: 4 vCPU, 8192 MB, efi, `version`, one vmxnet3 NIC on
// "VM Network" (what a clone's NIC starts on), marked as template.
func (g *gpusim) createVMs(ctx context.Context, u *url.URL, perHost int, powerOn bool, version string, templates, folders, pools, networks []string) error {
	c, err := govmomi.NewClient(ctx, u, true)
	if err != nil {
		return err
	}
	defer func() { _ = c.Logout(context.Background()) }()

	dc, ok := simulator.Map.Any("Datacenter").(*simulator.Datacenter)
	if !ok {
		return fmt.Errorf("no datacenter")
	}
	ds, ok := simulator.Map.Any("Datastore").(*simulator.Datastore)
	if !ok {
		return fmt.Errorf("no datastore")
	}
	markUplinks()
	if err := g.addNetworks(ctx, c, networks); err != nil {
		return err
	}
	folder := object.NewFolder(c.Client, dc.VmFolder)
	for _, name := range folders {
		if _, err := folder.CreateFolder(ctx, name); err != nil {
			return fmt.Errorf("create folder %s: %w", name, err)
		}
	}
	if len(pools) > 0 {
		cr := simulator.Map.Get(*g.order[0].hs.Parent).(*simulator.ClusterComputeResource)
		root := object.NewResourcePool(c.Client, *cr.ResourcePool)
		for _, name := range pools {
			if _, err := root.Create(ctx, name, types.DefaultResourceConfigSpec()); err != nil {
				return fmt.Errorf("create resource pool %s: %w", name, err)
			}
		}
	}
	for _, h := range g.order {
		parent := simulator.Map.Get(*h.hs.Parent)
		cr, ok := parent.(*simulator.ClusterComputeResource)
		if !ok {
			return fmt.Errorf("host %s is not in a cluster", h.hs.Name)
		}
		pool := object.NewResourcePool(c.Client, *cr.ResourcePool)
		host := object.NewHostSystem(c.Client, h.hs.Self)
		for j := 1; j <= perHost; j++ {
			spec := types.VirtualMachineConfigSpec{
				Name:                         fmt.Sprintf("%s-vm%d", h.hs.Name, j),
				GuestId:                      string(types.VirtualMachineGuestOsIdentifierUbuntu64Guest),
				Version:                      version,
				NumCPUs:                      4,
				MemoryMB:                     8192,
				Firmware:                     string(types.GuestOsDescriptorFirmwareTypeBios),
				MemoryReservationLockedToMax: types.NewBool(false),
				Files:                        &types.VirtualMachineFileInfo{VmPathName: fmt.Sprintf("[%s]", ds.Name)},
			}
			task, err := folder.CreateVM(ctx, spec, pool, host)
			if err != nil {
				return err
			}
			info, err := task.WaitForResult(ctx, nil)
			if err != nil {
				return fmt.Errorf("create %s: %w", spec.Name, err)
			}
			if vm, ok := simulator.Map.Get(info.Result.(types.ManagedObjectReference)).(*simulator.VirtualMachine); ok {
				simulator.Map.WithLock(vm, func() { bumpChangeVersion(vm) })
			}
			if powerOn {
				vm := object.NewVirtualMachine(c.Client, info.Result.(types.ManagedObjectReference))
				t, err := vm.PowerOn(ctx)
				if err != nil {
					return err
				}
				if err := t.Wait(ctx); err != nil {
					return fmt.Errorf("power on %s: %w", spec.Name, err)
				}
			}
		}
	}
	for _, name := range templates {
		h := g.order[0]
		pool := object.NewResourcePool(c.Client, *simulator.Map.Get(*h.hs.Parent).(*simulator.ClusterComputeResource).ResourcePool)
		spec := types.VirtualMachineConfigSpec{
			Name: name, GuestId: string(types.VirtualMachineGuestOsIdentifierUbuntu64Guest), Version: version,
			NumCPUs: 4, MemoryMB: 8192, Firmware: string(types.GuestOsDescriptorFirmwareTypeEfi),
			MemoryReservationLockedToMax: types.NewBool(false),
			Files:                        &types.VirtualMachineFileInfo{VmPathName: fmt.Sprintf("[%s]", ds.Name)},
			DeviceChange: []types.BaseVirtualDeviceConfigSpec{&types.VirtualDeviceConfigSpec{
				Operation: types.VirtualDeviceConfigSpecOperationAdd,
				Device: &types.VirtualVmxnet3{VirtualVmxnet: types.VirtualVmxnet{VirtualEthernetCard: types.VirtualEthernetCard{
					VirtualDevice: types.VirtualDevice{Key: 4000, DeviceInfo: &types.Description{Label: "Network adapter 1"}, Backing: &types.VirtualEthernetCardNetworkBackingInfo{
						VirtualDeviceDeviceBackingInfo: types.VirtualDeviceDeviceBackingInfo{DeviceName: "VM Network"}}},
					AddressType: string(types.VirtualEthernetCardMacTypeGenerated)}}},
			}},
		}
		task, err := folder.CreateVM(ctx, spec, pool, object.NewHostSystem(c.Client, h.hs.Self))
		if err != nil {
			return err
		}
		info, err := task.WaitForResult(ctx, nil)
		if err != nil {
			return fmt.Errorf("create template %s: %w", name, err)
		}
		if err := object.NewVirtualMachine(c.Client, info.Result.(types.ManagedObjectReference)).MarkAsTemplate(ctx); err != nil {
			return fmt.Errorf("mark %s as template: %w", name, err)
		}
		if vm, ok := simulator.Map.Get(info.Result.(types.ManagedObjectReference)).(*simulator.VirtualMachine); ok {
			g.diskSize(vm)
		}
	}
	g.publishSpace()
	return nil
}
