package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// runRebootHook runs the -on-reboot command for a host, if one was given.
func (g *gpusim) runRebootHook(host string) error {
	if g.onReboot == "" {
		return nil
	}
	cmd := exec.Command("sh", "-c", g.onReboot)
	cmd.Env = append(os.Environ(), "GPUSIM_HOST="+host)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("reboot hook for %s failed: %v: %s", host, err, strings.TrimSpace(string(out)))
	}
	return nil
}
