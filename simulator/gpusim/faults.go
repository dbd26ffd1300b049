package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// faultConfig holds the injected faults and latencies given on the command line.
type faultConfig struct {
	mu          sync.Mutex
	reconfigure map[string]int           // VM name -> failures left
	clone       map[string]int           // clone name -> failures left
	failTask    int                      // the Nth task fails (0: never)
	taskCount   int                      // tasks created since startup
	injected    map[string]string        // task moref value -> fault reason
	stockFailed map[string]string        // same, for message fix-up of stock tasks
	suppress    map[string]int           // entity moref value -> nested stock calls in progress
	latency     map[string]time.Duration // SOAP method -> task duration
	armed       bool
}

func parseFaults(reconf, clone []string, failTask int, latency []string) (*faultConfig, error) {
	f := &faultConfig{
		reconfigure: map[string]int{},
		clone:       map[string]int{},
		failTask:    failTask,
		injected:    map[string]string{},
		stockFailed: map[string]string{},
		suppress:    map[string]int{},
		latency:     map[string]time.Duration{},
	}
	for flag, specs := range map[string][]string{"fail-reconfigure": reconf, "fail-clone": clone} {
		counts := map[string]map[string]int{"fail-reconfigure": f.reconfigure, "fail-clone": f.clone}[flag]
		for _, r := range specs {
			name, count := r, 1
			if i := strings.LastIndex(r, ":"); i > 0 {
				n, err := strconv.Atoi(r[i+1:])
				if err != nil || n < 0 {
					return nil, fmt.Errorf("-%s %q: COUNT must be a number >= 0", flag, r)
				}
				name, count = r[:i], n
			}
			counts[name] += count
		}
	}
	for _, l := range latency {
		i := strings.Index(l, "=")
		if i <= 0 {
			return nil, fmt.Errorf("-latency %q: want METHOD=DURATION", l)
		}
		d, err := time.ParseDuration(l[i+1:])
		if err != nil || d < 0 {
			return nil, fmt.Errorf("-latency %q: bad duration", l)
		}
		f.latency[l[:i]] = d
	}
	return f, nil
}

// injectedFault is the SystemError every injected failure reports.
func injectedFault(reason string) types.BaseMethodFault {
	return &types.SystemError{
		RuntimeFault: types.RuntimeFault{MethodFault: methodFault(reason)},
		Reason:       reason,
	}
}

// takeCloneFault reports whether this clone (by the new VM's name) must fail.
func (f *faultConfig) takeCloneFault(name string) (string, bool) {
	return f.take(f.clone, name, "clone to ")
}

// takeReconfigureFault reports whether this reconfigure of vmName must fail.
func (f *faultConfig) takeReconfigureFault(vmName string) (string, bool) {
	return f.take(f.reconfigure, vmName, "reconfigure of ")
}

// take counts one failure of name off counts (a -fail-* flag's), once the faults are armed.
func (f *faultConfig) take(counts map[string]int, name, what string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.armed || counts[name] <= 0 {
		return "", false
	}
	counts[name]--
	return "gpusim injected fault: " + what + name, true
}

// takeInjected reports (once) whether the task was picked by -fail-task.
func (f *faultConfig) takeInjected(task types.ManagedObjectReference) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	msg, ok := f.injected[task.Value]
	delete(f.injected, task.Value)
	return msg, ok
}

func (f *faultConfig) latencyOf(method string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.armed {
		return 0
	}
	return f.latency[method]
}

// nested marks calls of stock methods made inside gpusim's own tasks, so the
// stock task they create is not counted by -fail-task.
func (f *faultConfig) nested(entity types.ManagedObjectReference, fn func()) {
	f.mu.Lock()
	f.suppress[entity.Value]++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.suppress[entity.Value]--
		f.mu.Unlock()
	}()
	fn()
}

// taskHook is a simulator registry handler that sees every new Task.
type taskHook struct{ f *faultConfig }

func (h *taskHook) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "GpusimTaskHook", Value: "gpusim-task-hook"}
}

func (h *taskHook) PutObject(obj mo.Reference) {
	t, ok := obj.(*simulator.Task)
	if !ok {
		return
	}
	f := h.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.armed {
		return
	}
	if e := t.Info.Entity; e != nil && f.suppress[e.Value] > 0 {
		return
	}
	f.taskCount++
	if f.taskCount != f.failTask {
		return
	}
	reason := fmt.Sprintf("gpusim injected fault: task %d (%s)", f.taskCount, t.Info.DescriptionId)
	f.injected[t.Self.Value] = reason
	f.stockFailed[t.Self.Value] = reason
	// Stock tasks run Execute synchronously right after CreateTask returns.
	t.Execute = func(*simulator.Task) (types.AnyType, types.BaseMethodFault) {
		return nil, injectedFault(reason)
	}
}

// UpdateObject gives a stock task failed by -fail-task a readable
// localizedMessage (the stock runner writes the Go type name there).
func (h *taskHook) UpdateObject(obj mo.Reference, _ []types.PropertyChange) {
	t, ok := obj.(*mo.Task)
	if !ok || t.Info.Error == nil {
		return
	}
	h.f.mu.Lock()
	reason, hit := h.f.stockFailed[t.Self.Value]
	delete(h.f.stockFailed, t.Self.Value)
	h.f.mu.Unlock()
	if hit {
		t.Info.Error.LocalizedMessage = reason
	}
}
func (h *taskHook) RemoveObject(types.ManagedObjectReference) {}

// installFaults arms the faults once the inventory is built.
func (g *gpusim) installFaults(model *simulator.Model) {
	f := g.faults
	simulator.Map.AddHandler(&taskHook{f: f})
	// Methods gpusim does not proxy get a plain (blocking) call delay.
	if model.DelayConfig.MethodDelay == nil {
		model.DelayConfig.MethodDelay = map[string]int{}
	}
	for method, d := range f.latency {
		if !proxiedMethods[method] {
			model.DelayConfig.MethodDelay[method] = int(d / time.Millisecond)
		}
	}
	f.mu.Lock()
	f.armed = true
	f.mu.Unlock()
}

func (f *faultConfig) forgetStock(task types.ManagedObjectReference) {
	f.mu.Lock()
	delete(f.stockFailed, task.Value)
	f.mu.Unlock()
}
