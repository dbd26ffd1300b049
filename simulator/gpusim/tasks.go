package main

import (
	"fmt"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// taskFunc does a task's work; it runs with the entity's lock held.
type taskFunc func() (types.AnyType, types.BaseMethodFault)

// startTask creates a task on entity and runs fn. Without latency it runs
// before the SOAP call returns, like the stock simulator. With -latency for
// method the task is returned "running" and completes after the delay in
// its own goroutine, so tasks on different entities overlap.
func (g *gpusim) startTask(entity mo.Reference, name, method string, fn taskFunc) types.ManagedObjectReference {
	t := simulator.CreateTask(entity.Reference(), name, nil)
	simulator.Map.Update(t, []types.PropertyChange{
		{Name: "info.startTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateRunning},
	})
	exec := func() {
		var res types.AnyType
		var err types.BaseMethodFault
		if reason, ok := g.faults.takeInjected(t.Self); ok {
			g.faults.forgetStock(t.Self)
			err = injectedFault(reason)
		} else {
			simulator.Map.WithLock(entity, func() { res, err = fn() })
		}
		completeTask(t, res, err)
	}
	if d := g.faults.latencyOf(method); d > 0 {
		go func() {
			time.Sleep(d)
			exec()
		}()
	} else {
		exec()
	}
	return t.Self
}

// completeTask records the result, with a readable localizedMessage.
func completeTask(t *simulator.Task, res types.AnyType, err types.BaseMethodFault) {
	state := types.TaskInfoStateSuccess
	var fault interface{}
	if err != nil {
		state = types.TaskInfoStateError
		fault = types.LocalizedMethodFault{Fault: err, LocalizedMessage: faultText(err)}
	}
	simulator.Map.Update(t, []types.PropertyChange{
		{Name: "info.completeTime", Val: time.Now()},
		{Name: "info.state", Val: state},
		{Name: "info.result", Val: res},
		{Name: "info.error", Val: fault},
	})
}

func faultText(err types.BaseMethodFault) string {
	if m := err.GetMethodFault(); m != nil && len(m.FaultMessage) > 0 {
		return m.FaultMessage[0].Message
	}
	return fmt.Sprintf("%T", err)
}

// stockTaskResult runs a stock simulator task method (which completes its
// task synchronously) and returns that task's outcome.
func (g *gpusim) stockTaskResult(entity types.ManagedObjectReference, call func() soap.HasFault) (types.AnyType, types.BaseMethodFault) {
	var body soap.HasFault
	g.faults.nested(entity, func() { body = call() })
	if f := body.Fault(); f != nil {
		if mf, ok := f.VimFault().(types.BaseMethodFault); ok {
			return nil, mf
		}
		return nil, &types.SystemError{Reason: f.String}
	}
	var ref types.ManagedObjectReference
	switch b := body.(type) {
	case *methods.ReconfigVM_TaskBody:
		ref = b.Res.Returnval
	case *methods.PowerOnVM_TaskBody:
		ref = b.Res.Returnval
	case *methods.PowerOffVM_TaskBody:
		ref = b.Res.Returnval
	case *methods.CreateVM_TaskBody:
		ref = b.Res.Returnval
	case *methods.Destroy_TaskBody:
		ref = b.Res.Returnval
	default:
		return nil, &types.SystemError{Reason: fmt.Sprintf("gpusim: unexpected body %T", body)}
	}
	t, ok := simulator.Map.Get(ref).(*simulator.Task)
	if !ok {
		return nil, &types.SystemError{Reason: "gpusim: stock task vanished"}
	}
	if t.Info.Error != nil {
		err := t.Info.Error.Fault
		if m := err.GetMethodFault(); m != nil && len(m.FaultMessage) == 0 && t.Info.Error.LocalizedMessage != "" {
			m.FaultMessage = []types.LocalizableMessage{{Key: "com.vmware.gpusim.fault", Message: t.Info.Error.LocalizedMessage}}
		}
		return nil, err
	}
	return t.Info.Result, nil
}
