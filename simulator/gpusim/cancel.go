package main

import (
	"sync"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// Task cancellation as vCenter does it (the stock simulator has no CancelTask): a cancelable task
// that still runs is asked to stop and ends with RequestCanceled; a task that is not cancelable
// answers NotSupported, one that has ended InvalidState.

// cancelSignal is closed when a client cancels the task it belongs to.
type cancelSignal struct {
	once sync.Once
	ch   chan struct{}
}

var cancels sync.Map // task moref value -> *cancelSignal

// cancelable marks a running task as one clients may cancel; the channel closes when one does.
func cancelable(task types.ManagedObjectReference) <-chan struct{} {
	s := &cancelSignal{ch: make(chan struct{})}
	cancels.Store(task.Value, s)
	if t, ok := simulator.Map.Get(task).(*simulator.Task); ok {
		simulator.Map.Update(t, []types.PropertyChange{{Name: "info.cancelable", Val: true}})
	}
	return s.ch
}

// canceledFault is what a canceled task ends with.
func canceledFault() types.BaseMethodFault {
	return &types.RequestCanceled{RuntimeFault: types.RuntimeFault{MethodFault: methodFault("The task was canceled by a user.")}}
}

type taskProxy struct {
	self, real types.ManagedObjectReference
}

func (p *taskProxy) Reference() types.ManagedObjectReference { return p.self }

func (p *taskProxy) CancelTask(req *types.CancelTask) soap.HasFault {
	body := &methods.CancelTaskBody{}
	t, ok := simulator.Map.Get(p.real).(*simulator.Task)
	if !ok {
		body.Fault_ = simulator.Fault("", &types.ManagedObjectNotFound{Obj: p.real})
		return body
	}
	if state := t.Info.State; state == types.TaskInfoStateSuccess || state == types.TaskInfoStateError {
		body.Fault_ = simulator.Fault("The operation is not allowed in the current state.",
			&types.InvalidState{VimFault: types.VimFault{MethodFault: methodFault("The task has already completed.")}})
		return body
	}
	s, ok := cancels.Load(p.real.Value)
	if !ok {
		body.Fault_ = simulator.Fault("The operation is not supported on the object.",
			&types.NotSupported{RuntimeFault: types.RuntimeFault{MethodFault: methodFault("The task cannot be canceled.")}})
		return body
	}
	signal := s.(*cancelSignal)
	signal.once.Do(func() {
		simulator.Map.Update(t, []types.PropertyChange{{Name: "info.cancelled", Val: true}})
		close(signal.ch)
	})
	body.Res = &types.CancelTaskResponse{}
	return body
}
