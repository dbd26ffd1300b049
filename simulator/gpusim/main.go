// Command gpusim is a vCenter simulator with a GPU host model, built on the
// govmomi simulator (vcsim). See ../README.md for flags, model and faults.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type options struct {
	hosts, vmsPerHost int
	gpu               string
	listen            string
	tls               bool
	certOut           string
	username          string
	password          string
	vmPower           string
	rebind            bool
	failReconfigure   multiFlag
	failClone         multiFlag
	templates         multiFlag
	vmFolders         multiFlag
	pools             multiFlag
	networks          multiFlag
	datastoreGB       int
	cloneDiskGB       int
	onPowerOn         string
	failTask          int
	latency           multiFlag
	onReboot          string
	mig               multiFlag
	vgpuManager       multiFlag
	vmVersion         string
	hostPrefix        string
}

func parseFlags() *options {
	o := &options{}
	flag.IntVar(&o.hosts, "hosts", 2, "number of GPU hosts (esx-01, esx-02, ...)")
	flag.IntVar(&o.vmsPerHost, "vms-per-host", 2, "VMs per host (<host>-vm1, ...)")
	flag.StringVar(&o.gpu, "gpu", "a100-80", "GPU model: "+gpuModelKeys)
	flag.StringVar(&o.listen, "listen", "127.0.0.1:0", "listen address (port 0 picks a free port)")
	flag.BoolVar(&o.tls, "tls", true, "serve https")
	flag.StringVar(&o.certOut, "cert-out", "", "write the server's TLS certificate (PEM) to this file")
	flag.StringVar(&o.username, "username", "administrator@vsphere.local", "login user")
	flag.StringVar(&o.password, "password", "gpusim-pass", "login password")
	flag.StringVar(&o.vmPower, "vm-power", "off", "initial VM power state: on or off")
	flag.BoolVar(&o.rebind, "rebind-without-reboot", false, "passthrough changes become active without a host reboot")
	flag.Var(&o.failReconfigure, "fail-reconfigure", "VMNAME[:COUNT]: ReconfigVM_Task on VMNAME fails COUNT times (repeatable)")
	flag.Var(&o.failClone, "fail-clone", "VMNAME[:COUNT]: CloneVM_Task to a VM of that name fails COUNT times (repeatable)")
	flag.Var(&o.templates, "template", "NAME: a VM template on the first host (repeatable), to clone VMs from")
	flag.Var(&o.vmFolders, "vm-folder", "NAME: a VM folder in the datacenter (repeatable), to clone VMs into")
	flag.Var(&o.networks, "network", "NAME[:HOST,HOST...]: a standard port group on those hosts (default all; repeatable), for clones' NICs")
	flag.Var(&o.pools, "resource-pool", "NAME: a resource pool in the cluster's root pool (repeatable), to clone VMs into")
	flag.IntVar(&o.datastoreGB, "datastore-gb", 10240, "room on each datastore for clones, in GB")
	flag.IntVar(&o.cloneDiskGB, "clone-disk-gb", 40, "what each clone takes on its datastore, in GB")
	flag.StringVar(&o.onPowerOn, "on-power-on", "", "command run (via sh -c) when a VM with cloud-init's guestinfo.metadata powers on, with GPUSIM_VM, GPUSIM_METADATA and GPUSIM_USERDATA set")
	flag.IntVar(&o.failTask, "fail-task", 0, "the Nth task created (after startup) fails once")
	flag.Var(&o.latency, "latency", "METHOD=DURATION, e.g. ReconfigVM_Task=1s (repeatable)")
	flag.StringVar(&o.onReboot, "on-reboot", "", "command run (via sh -c, with GPUSIM_HOST set) when a host reboots, e.g. to reboot a test host's ESXi shell")
	flag.Var(&o.mig, "mig", "HOST=all or HOST=0,1: GPUs (by index in PCI order) in MIG mode, for MIG-backed vGPU (repeatable)")
	flag.Var(&o.vgpuManager, "vgpu-manager", "HOST=VERSION or HOST=none: the NVIDIA vGPU manager the host runs (default "+defaultManager+"; none: no vGPU types, vGPU VMs do not power on; repeatable)")
	flag.StringVar(&o.hostPrefix, "host-prefix", "", "put before every host's name (and so its VMs'): several simulators standing for the vCenters of one fleet")
	flag.StringVar(&o.vmVersion, "vm-version", "vmx-19", "hardware version of the VMs created (ESXi 7.0 U2 and later: vmx-19)")
	flag.Parse()
	return o
}

func main() {
	log.SetPrefix("gpusim: ")
	o := parseFlags()
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func run(o *options) error {
	gpu, ok := gpuModels[o.gpu]
	if !ok {
		return fmt.Errorf("unknown -gpu %q (want %s)", o.gpu, gpuModelKeys)
	}
	if o.hosts < 1 || o.vmsPerHost < 0 {
		return fmt.Errorf("-hosts must be >= 1 and -vms-per-host >= 0")
	}
	if o.vmPower != "on" && o.vmPower != "off" {
		return fmt.Errorf("-vm-power must be on or off")
	}
	faults, err := parseFaults(o.failReconfigure, o.failClone, o.failTask, o.latency)
	if err != nil {
		return err
	}

	model := simulator.VPX()
	model.Datacenter = 1
	model.Cluster = 1
	model.ClusterHost = o.hosts
	model.Host = 0
	model.Machine = 0
	model.Autostart = false
	// Advertise vSphere 7.0U3: clients such as pyvmomi serialize newer types
	// (dynamic DirectPath backings, vGPU) as their base type for older APIs.
	about := &model.ServiceContent.About
	about.Version, about.ApiVersion, about.Build = "7.0.3", "7.0.3.0", "19234570"
	about.FullName = "VMware vCenter Server 7.0.3 build-19234570 (gpusim)"
	// Each vCenter has its own instance UUID (govmomi's model gives every simulator the same one):
	// gpuvm tells two runbook entries that reach one vCenter by it.
	about.InstanceUuid = uuid.New().String()
	if err := model.Create(); err != nil {
		return fmt.Errorf("create model: %w", err)
	}
	defer model.Remove()

	g := &gpusim{gpu: gpu, rebind: o.rebind, faults: faults, hosts: map[string]*gpuHost{}, onReboot: o.onReboot,
		onPowerOn: o.onPowerOn, datastoreGB: o.datastoreGB, cloneDiskGB: o.cloneDiskGB, clones: map[types.ManagedObjectReference]string{},
		hostPrefix: o.hostPrefix}
	if err := g.buildHosts(); err != nil {
		return err
	}
	if err := g.applyMig(o.mig); err != nil {
		return err
	}
	if err := g.applyManagers(o.vgpuManager); err != nil {
		return err
	}

	if o.tls {
		cert, err := selfSignedCert(o.listen)
		if err != nil {
			return err
		}
		model.Service.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	model.Service.Listen = &url.URL{Host: o.listen, User: url.UserPassword(o.username, o.password)}
	server := model.Service.NewServer()
	defer server.Close()
	// Route the methods gpusim overrides to its proxy objects (see proxy.go).
	rt := &router{next: server.Server.Config.Handler, g: g}
	server.Server.Config.Handler = rt

	if o.tls && o.certOut != "" {
		if err := writeCertPEM(o.certOut, server.Server.TLS.Certificates[0].Certificate[0]); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(60+o.hosts*o.vmsPerHost/20)*time.Second)
	err = g.createVMs(ctx, server.URL, o.vmsPerHost, o.vmPower == "on", o.vmVersion, o.templates, o.vmFolders, o.pools, o.networks)
	cancel()
	if err != nil {
		return fmt.Errorf("create VMs: %w", err)
	}

	// Fault injection and latency start only now, so that setup tasks do not count.
	g.installFaults(model)
	rt.requests.reset() // nor do the requests that created the VMs

	u := *server.URL
	u.User = nil
	host, port, _ := net.SplitHostPort(u.Host)
	if host == "" {
		host = "127.0.0.1"
	}
	u.Host = net.JoinHostPort(host, port)
	fmt.Printf("GPUSIM_URL=%s\n", u.String())
	_ = os.Stdout.Sync()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	log.Printf("shutting down")
	return nil
}
