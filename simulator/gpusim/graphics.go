package main

import (
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// HostGraphicsManager is the host's configManager.graphicsManager.
type HostGraphicsManager struct {
	mo.HostGraphicsManager

	g    *gpusim
	host *gpuHost
}

func newGraphicsManager(g *gpusim, h *gpuHost) *HostGraphicsManager {
	m := &HostGraphicsManager{g: g, host: h}
	m.Self = types.ManagedObjectReference{Type: "HostGraphicsManager", Value: "graphicsManager-" + h.hs.Self.Value}
	cfg := *h.hs.Config.GraphicsConfig
	m.GraphicsConfig = &cfg
	m.GraphicsInfo = h.hs.Config.GraphicsInfo
	m.SharedPassthruGpuTypes = h.hs.Config.SharedPassthruGpuTypes
	return m
}

// UpdateGraphicsConfig stores the config in the host's config.graphicsConfig
// and in the manager's graphicsConfig. As on ESXi, the GPUs keep running their
// old type (graphicsInfo) until the host reboots.
func (m *HostGraphicsManager) UpdateGraphicsConfig(req *types.UpdateGraphicsConfig) soap.HasFault {
	body := &methods.UpdateGraphicsConfigBody{}
	switch req.Config.HostDefaultGraphicsType {
	case "shared", "sharedDirect":
	default:
		msg := "gpusim: hostDefaultGraphicsType must be shared or sharedDirect, not " + req.Config.HostDefaultGraphicsType
		body.Fault_ = simulator.Fault(msg, &types.InvalidArgument{
			RuntimeFault:    types.RuntimeFault{MethodFault: methodFault(msg)},
			InvalidProperty: "config.hostDefaultGraphicsType",
		})
		return body
	}
	h := m.host
	simulator.Map.WithLock(h.hs, func() {
		hostCfg := req.Config
		ownCfg := req.Config
		simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "config.graphicsConfig", Val: &hostCfg}})
		simulator.Map.Update(m, []types.PropertyChange{{Name: "graphicsConfig", Val: &ownCfg}})
	})
	body.Res = &types.UpdateGraphicsConfigResponse{}
	return body
}

// RefreshGraphicsManager is a no-op.
func (m *HostGraphicsManager) RefreshGraphicsManager(req *types.RefreshGraphicsManager) soap.HasFault {
	return &methods.RefreshGraphicsManagerBody{Res: &types.RefreshGraphicsManagerResponse{}}
}
