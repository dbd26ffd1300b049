package main

import (
	"fmt"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// HostPciPassthruSystem is the host's configManager.pciPassthruSystem, which
// the stock simulator lacks. Its pciPassthruInfo shares the *HostPciPassthruInfo
// values of the host's config.pciPassthruInfo, so both always agree.
type HostPciPassthruSystem struct {
	mo.HostPciPassthruSystem

	g    *gpusim
	host *gpuHost
}

func newPassthruSystem(g *gpusim, h *gpuHost) *HostPciPassthruSystem {
	s := &HostPciPassthruSystem{g: g, host: h}
	s.Self = types.ManagedObjectReference{Type: "HostPciPassthruSystem", Value: "pciPassthruSystem-" + h.hs.Self.Value}
	s.PciPassthruInfo = h.hs.Config.PciPassthruInfo
	return s
}

// UpdatePassthruConfig enables or disables passthrough per device. The change
// becomes active only at the next host reboot unless -rebind-without-reboot
// is set (and applyNow is not false).
func (s *HostPciPassthruSystem) UpdatePassthruConfig(req *types.UpdatePassthruConfig) soap.HasFault {
	body := &methods.UpdatePassthruConfigBody{}
	h := s.host
	var fault *soap.Fault

	simulator.Map.WithLock(h.hs, func() {
		// validate everything first: the update is all or nothing
		for _, c := range req.Config {
			cfg := c.GetHostPciPassthruConfig()
			info := h.passthruInfo(cfg.Id)
			if info == nil {
				msg := fmt.Sprintf("gpusim: no PCI device with id %q on host %s", cfg.Id, h.hs.Name)
				fault = simulator.Fault(msg, &types.InvalidArgument{
					RuntimeFault:    types.RuntimeFault{MethodFault: methodFault(msg)},
					InvalidProperty: "config.id",
				})
				return
			}
			if cfg.PassthruEnabled && !info.PassthruCapable {
				msg := fmt.Sprintf("Device %s on host %s is not capable of passthrough", cfg.Id, h.hs.Name)
				fault = simulator.Fault(msg, &types.HostConfigFault{VimFault: types.VimFault{MethodFault: methodFault(msg)}})
				return
			}
		}
		for _, c := range req.Config {
			cfg := c.GetHostPciPassthruConfig()
			info := h.passthruInfo(cfg.Id)
			info.PassthruEnabled = cfg.PassthruEnabled
			if s.g.rebind && (cfg.ApplyNow == nil || *cfg.ApplyNow) {
				info.PassthruActive = cfg.PassthruEnabled
			}
		}
		s.publish()
	})
	if fault != nil {
		body.Fault_ = fault
		return body
	}
	body.Res = &types.UpdatePassthruConfigResponse{}
	return body
}

// publish notifies property collectors of the changed pciPassthruInfo; the host lock is held.
func (s *HostPciPassthruSystem) publish() {
	infos := s.host.hs.Config.PciPassthruInfo
	simulator.Map.Update(s.host.hs, []types.PropertyChange{{Name: "config.pciPassthruInfo", Val: infos}})
	simulator.Map.Update(s, []types.PropertyChange{{Name: "pciPassthruInfo", Val: infos}})
	s.host.refreshGraphicsInfo()
}

// Refresh is a no-op: the simulated hardware never changes.
func (s *HostPciPassthruSystem) Refresh(req *types.Refresh) soap.HasFault {
	return &methods.RefreshBody{Res: &types.RefreshResponse{}}
}

// methodFault builds the MethodFault part carrying a human-readable message.
func methodFault(msg string) types.MethodFault {
	return types.MethodFault{FaultMessage: []types.LocalizableMessage{{Key: "com.vmware.gpusim.fault", Message: msg}}}
}
