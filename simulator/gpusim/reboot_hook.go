package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// runRebootHook runs the -on-reboot command for a host, if one was given, with
// GPUSIM_HOST (the host) and GPUSIM_VMS (its VMs, space-separated: their
// passed-through devices are power-cycled with the host); its output, for what it tells
// (managerAfterReboot).
func (g *gpusim) runRebootHook(host string, vms []string) (string, error) {
	if g.onReboot == "" {
		return "", nil
	}
	cmd := exec.Command("sh", "-c", g.onReboot)
	cmd.Env = append(os.Environ(), "GPUSIM_HOST="+host, "GPUSIM_VMS="+strings.Join(vms, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("reboot hook for %s failed: %v: %s", host, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
