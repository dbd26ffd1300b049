package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

const (
	vendorNVIDIA   = 0x10de
	vendorMellanox = 0x15b3
	vendorIntel    = 0x8086
	vendorBroadcom = 0x14e4
	hostMemory     = int64(1) << 40 // 1 TiB
)

// gpuModel describes one GPU kind offered by -gpu, and the server that carries it.
type gpuModel struct {
	key         string
	deviceID    uint16
	subDeviceID uint16 // pci.ids lists no subsystem of the newer parts: made up for them
	name        string // pci.ids' name of the device id
	memoryGB    int
	vgpuTypes   []string
	server      string // the host's hardware model: hostPCI lays out its devices
}

// bar1GB is the GPU's BAR1 size: the next power of two >= its memory.
func (m gpuModel) bar1GB() int {
	n := 1
	for n < m.memoryGB {
		n <<= 1
	}
	return n
}

func profiles(prefix string, timeSliced []string, mig []string) []string {
	var out []string
	for _, s := range timeSliced {
		out = append(out, prefix+"-"+s+"c")
	}
	for _, s := range mig {
		out = append(out, prefix+"-"+s+"c")
	}
	return out
}

// named is prefix-NAME for each name: types whose series is not all C (L40S) or with +me (cme).
func named(prefix string, names ...string) []string {
	var out []string
	for _, n := range names {
		out = append(out, prefix+"-"+n)
	}
	return out
}

const (
	r750xa = "PowerEdge R750xa" // 4 PCIe GPUs (2 per socket), NVLink-bridged in pairs where the card has bridges
	r760xa = "PowerEdge R760xa" // the same layout, for the newer PCIe cards
	xe9680 = "PowerEdge XE9680" // HGX 8-GPU board: 8 SXM GPUs (4 per socket) joined by 4 NVSwitches
)

// The vGPU types of the newer models are those of NVIDIA's tables (NVIDIA AI Enterprise, "NVIDIA vGPU
// Types Reference": Hopper H200 SXM5 141GB, H100 PCIe 94GB (H100 NVL); Ada Lovelace L40S) as vCenter
// names them: lower case, nvidia_ prefix (H200X-1-18CME: nvidia_h200x-1-18cme).
var gpuModels = map[string]gpuModel{
	"a100-80": {"a100-80", 0x20b5, 0x1533, "GA100 [A100 PCIe 80GB]", 80,
		profiles("grid_a100d", []string{"4", "8", "10", "16", "20", "40", "80"}, []string{"1-10", "2-20", "3-40", "4-40", "7-80"}), r750xa},
	"a100-40": {"a100-40", 0x20f1, 0x145f, "GA100 [A100 PCIe 40GB]", 40,
		profiles("grid_a100", []string{"4", "5", "8", "10", "20", "40"}, []string{"1-5", "2-10", "3-20", "4-20", "7-40"}), r750xa},
	"h100-80": {"h100-80", 0x2331, 0x1626, "GH100 [H100 PCIe]", 80,
		profiles("grid_h100", []string{"4", "5", "8", "10", "16", "20", "40", "80"}, []string{"1-10", "2-20", "3-40", "4-40", "7-80"}), r750xa},
	"h100-nvl": {"h100-nvl", 0x2321, 0x1839, "GH100 [H100L 94GB]", 94,
		named("nvidia_h100l", "4c", "6c", "11c", "15c", "23c", "47c", "94c",
			"1-12c", "1-12cme", "1-24c", "2-24c", "3-47c", "4-47c", "7-94c"), r760xa},
	"l40s": {"l40s", 0x26b9, 0x1851, "AD102GL [L40S]", 48,
		named("nvidia_l40s", "1q", "2q", "3q", "4q", "6q", "8q", "12q", "16q", "24q", "48q",
			"4c", "6c", "8c", "12c", "16c", "24c", "48c"), r760xa},
	"h200-hgx": {"h200-hgx", 0x2335, 0x18be, "GH100 [H200 SXM 141GB]", 141,
		named("nvidia_h200x", "4c", "7c", "8c", "14c", "17c", "28c", "35c", "70c", "141c",
			"1-18c", "1-18cme", "1-35c", "2-35c", "3-71c", "4-71c", "7-141c"), xe9680},
}

// gpuModelKeys lists the -gpu values, for help and errors.
const gpuModelKeys = "a100-80, a100-40, h100-80, h100-nvl, l40s or h200-hgx"

// pciSpec is one PCI function of the modelled server.
type pciSpec struct {
	id                string
	classID           uint16
	vendor, device    uint16
	subVendor, subDev uint16
	vendorName        string
	deviceName        string
	capable           bool
	numa              int // -1: not listed in numaInfo
	gpu               bool
}

func hostPCI(gpu gpuModel) []pciSpec {
	nv := func(id string, node int) pciSpec {
		return pciSpec{id, 0x0302, vendorNVIDIA, gpu.deviceID, vendorNVIDIA, gpu.subDeviceID,
			"NVIDIA Corporation", gpu.name, true, node, true}
	}
	cx := func(id string, node int, device uint16, name string) pciSpec {
		return pciSpec{id, 0x0207, vendorMellanox, device, vendorMellanox, 0x0006,
			"Mellanox Technologies", name, true, node, false}
	}
	base := []pciSpec{
		{"0000:00:00.0", 0x0600, vendorIntel, 0x09a2, 0x1028, 0x0a6b, "Intel Corporation", "Ice Lake Memory Map/VT-d", false, 0, false},
		{"0000:00:17.0", 0x0106, vendorIntel, 0xa182, 0x1028, 0x0a6b, "Intel Corporation", "C620 Series Chipset Family SATA Controller [AHCI mode]", false, 0, false},
		{"0000:00:1f.0", 0x0601, vendorIntel, 0xa1cb, 0x1028, 0x0a6b, "Intel Corporation", "C621 Series Chipset LPC/eSPI Controller", false, 0, false},
		{"0000:04:00.0", 0x0200, vendorBroadcom, 0x165f, 0x1028, 0x0a6b, "Broadcom Inc. and subsidiaries", "NetXtreme BCM5720 Gigabit Ethernet PCIe", false, 0, false},
		{"0000:04:00.1", 0x0200, vendorBroadcom, 0x165f, 0x1028, 0x0a6b, "Broadcom Inc. and subsidiaries", "NetXtreme BCM5720 Gigabit Ethernet PCIe", false, 0, false},
	}
	if gpu.server == xe9680 {
		// HGX H200 8-GPU: GPUs 0-3 on NUMA node 0, 4-7 on node 1, a ConnectX-7 per socket, and the
		// board's 4 NVSwitches (pci.ids 10de:22a3 "GH100 [H100 NVSwitch]", class 0680 "other bridge"),
		// which ESXi's NVIDIA driver and Fabric Manager own: never passthrough capable here.
		out := append(base, nv("0000:18:00.0", 0), nv("0000:2a:00.0", 0), nv("0000:3a:00.0", 0), nv("0000:5d:00.0", 0),
			nv("0000:9a:00.0", 1), nv("0000:ab:00.0", 1), nv("0000:ba:00.0", 1), nv("0000:db:00.0", 1),
			cx("0000:1a:00.0", 0, 0x1021, "MT2910 Family [ConnectX-7]"), cx("0000:9c:00.0", 1, 0x1021, "MT2910 Family [ConnectX-7]"))
		for _, bus := range []string{"05", "06", "07", "08"} {
			out = append(out, pciSpec{"0000:" + bus + ":00.0", 0x0680, vendorNVIDIA, 0x22a3, vendorNVIDIA, 0x1796,
				"NVIDIA Corporation", "GH100 [H100 NVSwitch]", false, 0, false})
		}
		return out
	}
	cx6 := func(id string) pciSpec { return cx(id, 0, 0x101b, "MT28908 Family [ConnectX-6]") }
	return append(base, nv("0000:17:00.0", 0), nv("0000:31:00.0", 0), cx6("0000:4b:00.0"), cx6("0000:4b:00.1"),
		nv("0000:b1:00.0", 1), nv("0000:ca:00.0", 1))
}

// s16 converts a PCI id to the API's signed 16-bit form (0x8086 -> -32634).
func s16(v uint16) int16 { return int16(v) }

func parseBDF(id string) (bus, slot, fn byte) {
	// 0000:17:00.0
	parts := strings.Split(id, ":")
	if len(parts) != 3 {
		return
	}
	b, _ := strconv.ParseUint(parts[1], 16, 8)
	sf := strings.Split(parts[2], ".")
	s, _ := strconv.ParseUint(sf[0], 16, 8)
	var f uint64
	if len(sf) > 1 {
		f, _ = strconv.ParseUint(sf[1], 16, 8)
	}
	return byte(b), byte(s), byte(f)
}

// gpuHost is gpusim's state for one simulated ESXi host.
type gpuHost struct {
	hs       *simulator.HostSystem
	pci      []pciSpec
	passthru *HostPciPassthruSystem
	graphics *HostGraphicsManager
	mig      map[string]bool     // GPU id → in MIG mode (-mig)
	vgpus    map[string][]string // VM moref → the GPU each of its vGPUs runs on (capacity.go)
	// manager is the NVIDIA vGPU manager version the host runs ("": none); its vGPU types are
	// offered only while it runs (vgpu_manager.go)
	manager   string
	vgpuTypes []string
	// bootGraphics is the graphics config the host booted with: GPUs run it
	// until the next reboot, whatever UpdateGraphicsConfig stored since.
	bootGraphics types.HostGraphicsConfig
}

func (h *gpuHost) spec(id string) *pciSpec {
	for i := range h.pci {
		if h.pci[i].id == id {
			return &h.pci[i]
		}
	}
	return nil
}

func (h *gpuHost) passthruInfo(id string) *types.HostPciPassthruInfo {
	for _, b := range h.hs.Config.PciPassthruInfo {
		if info := b.GetHostPciPassthruInfo(); info.Id == id {
			return info
		}
	}
	return nil
}

// gpusim holds the whole simulator's extra state.
type gpusim struct {
	gpu    gpuModel
	rebind bool
	faults *faultConfig
	// onReboot is run when a host reboots, so that a test host standing in for the
	// ESXi shell reboots with it (applies pending kernel settings, MIG modes).
	onReboot string
	// onPowerOn is run when a VM with cloud-init data powers on (a test bed boots its guest).
	onPowerOn   string
	datastoreGB int
	cloneDiskGB int
	hostPrefix  string                                  // before every host's name (-host-prefix)
	clones      map[types.ManagedObjectReference]string // cloned VM -> its datastore

	mu    sync.Mutex
	hosts map[string]*gpuHost // by HostSystem moref value
	order []*gpuHost
}

func (g *gpusim) host(ref types.ManagedObjectReference) *gpuHost {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hosts[ref.Value]
}

// buildHosts renames the model's cluster hosts to esx-NN and gives each the
// -gpu model's server (hostPCI) plus its passthrough and graphics managers.
func (g *gpusim) buildHosts() error {
	cluster, ok := simulator.Map.Any("ClusterComputeResource").(*simulator.ClusterComputeResource)
	if !ok {
		return fmt.Errorf("model has no cluster")
	}
	for i, ref := range cluster.Host {
		hs := simulator.Map.Get(ref).(*simulator.HostSystem)
		name := g.hostPrefix + fmt.Sprintf("esx-%02d", i+1)
		g.configureHost(hs, name)
	}
	// remove any standalone hosts the model made (none with Host=0)
	return nil
}

func (g *gpusim) configureHost(hs *simulator.HostSystem, name string) {
	hs.Name = name
	hs.Summary.Config.Name = name
	id := uuid.NewSHA1(uuid.NameSpaceDNS, []byte("gpusim/"+name)).String()

	pci := hostPCI(g.gpu)
	hw := *hs.Hardware
	hw.SystemInfo.Uuid = id
	hw.SystemInfo.Vendor = "Dell Inc."
	hw.SystemInfo.Model = g.gpu.server
	hw.MemorySize = hostMemory
	hw.CpuInfo = types.HostCpuInfo{NumCpuPackages: 2, NumCpuCores: 64, NumCpuThreads: 128, Hz: 2000000000}
	hw.PciDevice = nil
	nodes := [2]types.HostNumaNode{{TypeId: 0}, {TypeId: 1}}
	for n := range nodes {
		for c := 0; c < 64; c++ {
			nodes[n].CpuID = append(nodes[n].CpuID, int16(n*64+c))
		}
		nodes[n].MemoryRangeBegin = int64(n) * (hostMemory / 2)
		nodes[n].MemoryRangeLength = hostMemory / 2
	}
	var infos []types.BaseHostPciPassthruInfo
	var ginfo []types.HostGraphicsInfo
	for _, p := range pci {
		bus, slot, fn := parseBDF(p.id)
		hw.PciDevice = append(hw.PciDevice, types.HostPciDevice{
			Id: p.id, ClassId: s16(p.classID), Bus: bus, Slot: slot, Function: fn,
			VendorId: s16(p.vendor), SubVendorId: s16(p.subVendor), VendorName: p.vendorName,
			DeviceId: s16(p.device), SubDeviceId: s16(p.subDev), DeviceName: p.deviceName,
		})
		if p.numa >= 0 {
			nodes[p.numa].PciId = append(nodes[p.numa].PciId, p.id)
		}
		infos = append(infos, &types.HostPciPassthruInfo{
			Id: p.id, DependentDevice: p.id, PassthruCapable: p.capable,
		})
		if p.gpu {
			ginfo = append(ginfo, types.HostGraphicsInfo{
				DeviceName: p.deviceName, VendorName: p.vendorName, PciId: p.id,
				GraphicsType: "shared", MemorySizeInKB: int64(g.gpu.memoryGB) * 1024 * 1024,
			})
		}
	}
	hw.NumaInfo = &types.HostNumaInfo{Type: "NUMA", NumNodes: 2, NumaNode: nodes[:]}
	hs.Hardware = &hw

	sum := *hs.Summary.Hardware
	sum.Vendor, sum.Model, sum.Uuid = "Dell Inc.", g.gpu.server, id
	sum.MemorySize = hostMemory
	sum.CpuModel = "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
	sum.CpuMhz, sum.NumCpuPkgs, sum.NumCpuCores, sum.NumCpuThreads = 2000, 2, 64, 128
	hs.Summary.Hardware = &sum

	product := hs.Config.Product
	product.Version, product.ApiVersion, product.Build = "7.0.3", "7.0.3.0", "19193900"
	product.FullName = "VMware ESXi 7.0.3 build-19193900"
	hs.Config.Product = product
	if hs.Summary.Config.Product != nil {
		p := product
		hs.Summary.Config.Product = &p
	}

	rebind := g.rebind
	hs.Capability = &types.HostCapability{
		DeviceRebindWithoutRebootSupported: &rebind,
		VmDirectPathGen2Supported:          types.NewBool(true),
		MaintenanceModeSupported:           true,
		RebootSupported:                    true,
		ShutdownSupported:                  true,
	}

	hs.Config.PciPassthruInfo = infos
	hs.Config.SharedPassthruGpuTypes = append([]string(nil), g.gpu.vgpuTypes...)
	hs.Config.GraphicsConfig = &types.HostGraphicsConfig{
		HostDefaultGraphicsType:        "shared",
		SharedPassthruAssignmentPolicy: "performance",
	}
	hs.Config.GraphicsInfo = ginfo

	h := &gpuHost{hs: hs, pci: pci, bootGraphics: *hs.Config.GraphicsConfig, manager: defaultManager,
		vgpuTypes: append([]string(nil), g.gpu.vgpuTypes...)}
	h.passthru = newPassthruSystem(g, h)
	h.graphics = newGraphicsManager(g, h)
	ptRef := simulator.Map.Put(h.passthru).Reference()
	gmRef := simulator.Map.Put(h.graphics).Reference()
	hs.ConfigManager.PciPassthruSystem = &ptRef
	hs.ConfigManager.GraphicsManager = &gmRef

	g.mu.Lock()
	g.hosts[hs.Self.Value] = h
	g.order = append(g.order, h)
	g.mu.Unlock()
}

// graphicsTypeFor is the graphics type a GPU runs: direct while passthrough is
// active, else what the graphics config in force since the last boot says.
func (h *gpuHost) graphicsTypeFor(id string) string {
	if info := h.passthruInfo(id); info != nil && info.PassthruActive {
		return "direct"
	}
	cfg := h.bootGraphics
	for _, d := range cfg.DeviceType {
		if d.DeviceId == id {
			return d.GraphicsType
		}
	}
	return cfg.HostDefaultGraphicsType
}

// anyRunsSharedDirect reports whether some GPU runs Shared Direct (vGPU) now.
func (h *gpuHost) anyRunsSharedDirect() bool {
	for _, p := range h.pci {
		if p.gpu && h.graphicsTypeFor(p.id) == "sharedDirect" {
			return true
		}
	}
	return false
}

// refreshGraphicsInfo recomputes graphicsInfo for host and manager; callers hold the host lock.
func (h *gpuHost) refreshGraphicsInfo() {
	info := make([]types.HostGraphicsInfo, len(h.hs.Config.GraphicsInfo))
	copy(info, h.hs.Config.GraphicsInfo)
	for i := range info {
		info[i].GraphicsType = h.graphicsTypeFor(info[i].PciId)
	}
	simulator.Map.Update(h.hs, []types.PropertyChange{{Name: "config.graphicsInfo", Val: info}})
	simulator.Map.Update(h.graphics, []types.PropertyChange{{Name: "graphicsInfo", Val: info}})
}
