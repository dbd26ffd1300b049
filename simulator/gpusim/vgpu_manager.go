package main

import (
	"fmt"
	"strings"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// defaultManager is the NVIDIA vGPU manager (ESXi host driver) every host runs unless -vgpu-manager
// says otherwise: vGPU 16.3 (R535, long-term support).
const defaultManager = "535.154.02"

// managerLine is what a reboot hook prints to tell gpusim the vGPU manager the host booted with
// (the ESXi shell's stand-in knows what `esxcli software component apply` installed):
// "GPUSIM_VGPU_MANAGER=535.154.02", or "GPUSIM_VGPU_MANAGER=none" for none.
const managerLine = "GPUSIM_VGPU_MANAGER="

// applyManagers sets the vGPU manager each host runs from -vgpu-manager HOST=VERSION|none.
func (g *gpusim) applyManagers(specs []string) error {
	for _, h := range g.order {
		h.setManager(defaultManager)
	}
	for _, spec := range specs {
		name, version, ok := strings.Cut(spec, "=")
		h := g.byName(name)
		if !ok || h == nil || version == "" {
			return fmt.Errorf("-vgpu-manager %q: want HOST=VERSION or HOST=none with a host of this simulator", spec)
		}
		h.setManager(version)
	}
	return nil
}

func (g *gpusim) byName(name string) *gpuHost {
	for _, h := range g.order {
		if h.hs.Name == name {
			return h
		}
	}
	return nil
}

// setManager records the manager the host runs ("none" or "": none) and publishes the vGPU types
// on offer: ESXi lists them in config.sharedPassthruGpuTypes only while the manager runs.
func (h *gpuHost) setManager(version string) {
	if version == "none" {
		version = ""
	}
	h.manager = version
	var offered []string
	if version != "" {
		offered = append([]string(nil), h.vgpuTypes...)
	}
	simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "config.sharedPassthruGpuTypes", Val: offered}})
	if h.graphics != nil {
		h.graphics.SharedPassthruGpuTypes = offered
	}
}

// managerAfterReboot reads the hook's output for the manager the host booted with; ok false when
// the hook did not say (the host runs what it ran).
func managerAfterReboot(output string) (string, bool) {
	version, ok := "", false
	for _, line := range strings.Split(output, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, managerLine) {
			version, ok = strings.TrimSpace(strings.TrimPrefix(line, managerLine)), true
		}
	}
	return version, ok
}

// noManagerFault is what ESXi says when a vGPU VM powers on where the NVIDIA vGPU manager does not
// run: the VMX cannot load NVIDIA's vGPU plugin.
func noManagerFault(profile, host string) types.BaseMethodFault {
	return vmFault(fmt.Sprintf("Module DevicePowerOn power on failed. Could not initialize plugin "+
		"'/usr/lib64/vmware/plugin/libnvidia-vgx.so' for vGPU '%s'. (No NVIDIA vGPU manager runs on host %s: "+
		"install the NVIDIA host driver and reboot the host.)", profile, host))
}
