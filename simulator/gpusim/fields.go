package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// Custom attributes as vCenter keeps them (the stock simulator differs in three ways gpuvm relies on):
// a field definition's type is "string" (a global field's was empty, which pyVmomi refuses);
// SetField replaces the entity's value for that key (the stock one appended a value per call);
// RemoveCustomFieldDef of a key that does not exist is InvalidArgument, not NotFound; and the
// faults carry vCenter's messages (DuplicateName: "The name 'x' already exists.", SetField or
// RemoveCustomFieldDef of a missing key: "A specified parameter was not correct: key").
//
// -latency applies to AddCustomFieldDef, RemoveCustomFieldDef and SetField too: the call takes
// effect (and answers) only after the delay, and other calls go on meanwhile (a slow vCenter, a
// slow network), so a value being set is not there yet for another client to read.

type fieldsProxy struct {
	self, real types.ManagedObjectReference
	g          *gpusim
	mu         sync.Mutex // the manager's state; held only while a call takes effect, not while it is delayed
}

func (p *fieldsProxy) Reference() types.ManagedObjectReference { return p.self }

// Lock and Unlock make the proxy its own sync.Locker, so the simulator does not hold a lock on it
// for a whole (delayed) call: calls overlap as on vCenter.
func (p *fieldsProxy) Lock()   {}
func (p *fieldsProxy) Unlock() {}

// delayed waits the method's -latency, then runs it under the manager's lock.
func (p *fieldsProxy) delayed(method string, call func() soap.HasFault) soap.HasFault {
	if d := p.g.faults.latencyOf(method); d > 0 {
		time.Sleep(d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return call()
}

func (p *fieldsProxy) AddCustomFieldDef(req *types.AddCustomFieldDef) soap.HasFault {
	return p.delayed("AddCustomFieldDef", func() soap.HasFault { return p.addCustomFieldDef(req) })
}

func (p *fieldsProxy) RemoveCustomFieldDef(req *types.RemoveCustomFieldDef) soap.HasFault {
	return p.delayed("RemoveCustomFieldDef", func() soap.HasFault { return p.removeCustomFieldDef(req) })
}

func (p *fieldsProxy) SetField(ctx *simulator.Context, req *types.SetField) soap.HasFault {
	return p.delayed("SetField", func() soap.HasFault { return p.setField(ctx, req) })
}

func (p *fieldsProxy) addCustomFieldDef(req *types.AddCustomFieldDef) soap.HasFault {
	m := simulator.Map.CustomFieldsManager()
	body := m.AddCustomFieldDef(req).(*methods.AddCustomFieldDefBody)
	if body.Fault_ != nil {
		if dup, ok := body.Fault_.Detail.Fault.(*types.DuplicateName); ok { // vCenter's words, not the stock empty message
			body.Fault_ = simulator.Fault(fmt.Sprintf("The name '%s' already exists.", req.Name), dup)
		}
		return body
	}
	if body.Res != nil {
		body.Res.Returnval.Type = "string"
		for i := range m.Field {
			if m.Field[i].Key == body.Res.Returnval.Key {
				m.Field[i].Type = "string"
			}
		}
	}
	return body
}

func (p *fieldsProxy) removeCustomFieldDef(req *types.RemoveCustomFieldDef) soap.HasFault {
	m := simulator.Map.CustomFieldsManager()
	body := m.RemoveCustomFieldDef(req).(*methods.RemoveCustomFieldDefBody)
	if body.Fault_ != nil {
		if _, missing := body.Fault_.Detail.Fault.(*types.NotFound); missing {
			body.Fault_ = simulator.Fault("A specified parameter was not correct: key", &types.InvalidArgument{InvalidProperty: "key"})
		}
	}
	return body
}

func (p *fieldsProxy) setField(ctx *simulator.Context, req *types.SetField) soap.HasFault {
	m := simulator.Map.CustomFieldsManager()
	body := m.SetField(ctx, req).(*methods.SetFieldBody)
	if body.Fault_ != nil {
		if bad, ok := body.Fault_.Detail.Fault.(*types.InvalidArgument); ok { // a key that does not exist
			body.Fault_ = simulator.Fault("A specified parameter was not correct: key", bad)
		}
		return body
	}
	entity := simulator.Map.Get(req.Entity).(mo.Entity).Entity()
	ctx.WithLock(entity, func() {
		entity.CustomValue = lastPerKey(entity.CustomValue)
		entity.Value = lastPerKey(entity.Value)
	})
	return body
}

// lastPerKey keeps one value per key, the last set, where it was first set.
func lastPerKey(values []types.BaseCustomFieldValue) []types.BaseCustomFieldValue {
	last := map[int32]types.BaseCustomFieldValue{}
	for _, v := range values {
		last[v.GetCustomFieldValue().Key] = v
	}
	var out []types.BaseCustomFieldValue
	seen := map[int32]bool{}
	for _, v := range values {
		key := v.GetCustomFieldValue().Key
		if !seen[key] {
			seen[key] = true
			out = append(out, last[key])
		}
	}
	return out
}
