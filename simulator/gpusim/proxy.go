package main

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// The stock simulator code asserts Map objects to *simulator.HostSystem and
// *simulator.VirtualMachine in many places, so wrapping those objects in the
// Map (as example_extend_test.go does) would break it. Instead the router
// rewrites the _this reference of the few overridden methods to a proxy type
// ("GpusimVirtualMachine"/"GpusimHostSystem", same moref value). The proxy
// gets the call, with the stock session checks and SOAP encoding, and works
// on the real object. Nothing else sees the proxies.

const proxyPrefix = "Gpusim"

var proxiedMethods = map[string]bool{
	"ReconfigVM_Task":           true,
	"PowerOnVM_Task":            true,
	"CloneVM_Task":              true,
	"UpgradeVM_Task":            true,
	"Destroy_Task":              true,
	"PowerOffVM_Task":           true,
	"EnterMaintenanceMode_Task": true,
	"RebootHost_Task":           true,
	"AddCustomFieldDef":         true,
	"RemoveCustomFieldDef":      true,
	"SetField":                  true,
	"CancelTask":                true,
}

var (
	methodRe = regexp.MustCompile(`<(?:[A-Za-z0-9_.-]+:)?Body[^>]*>\s*<(?:[A-Za-z0-9_.-]+:)?([A-Za-z0-9_]+)[\s>/]`)
	thisRe   = regexp.MustCompile(`(<(?:[A-Za-z0-9_.-]+:)?_this\b[^>]*\btype=")(VirtualMachine|HostSystem|CustomFieldsManager|Task)("[^>]*>)\s*([^<\s]+)\s*<`)
)

type router struct {
	next     http.Handler
	g        *gpusim
	mu       sync.Mutex
	requests requestCounter
}

func (rt *router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == requestsPath {
		rt.requests.serve(w, r)
		return
	}
	if r.Method == http.MethodPost && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		proxied := false
		m := methodRe.FindSubmatch(body)
		if m != nil {
			rt.requests.add(string(m[1]))
		}
		if m != nil && string(m[1]) == "Fetch" {
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			rt.serveFetch(w, r)
			return
		}
		if m != nil && proxiedMethods[string(m[1])] {
			if t := thisRe.FindSubmatch(body); t != nil && rt.ensureProxy(string(t[2]), string(t[4])) {
				body = thisRe.ReplaceAll(body, []byte("${1}"+proxyPrefix+"${2}${3}${4}<"))
				proxied = true
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		if proxied {
			rt.serveUnproxied(w, r)
			return
		}
	}
	rt.next.ServeHTTP(w, r)
}

// serveUnproxied serves a proxied call and turns the proxy types back into the real ones in the
// answer: a fault (NotAuthenticated, say) names the object it was called on.
func (rt *router) serveUnproxied(w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	rt.next.ServeHTTP(rec, r)
	body := rec.Body.Bytes()
	for _, kind := range []string{"VirtualMachine", "HostSystem", "CustomFieldsManager", "Task"} {
		body = bytes.ReplaceAll(body, []byte(`"`+proxyPrefix+kind+`"`), []byte(`"`+kind+`"`))
		body = bytes.ReplaceAll(body, []byte(`>`+proxyPrefix+kind+`<`), []byte(`>`+kind+`<`))
	}
	answer(w, rec, body)
}

// emptyFetch is vCenter's answer to Fetch of a property that is unset: no value.
const emptyFetch = `<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body><FetchResponse xmlns="urn:vim25"></FetchResponse></soapenv:Body></soapenv:Envelope>`

// serveFetch serves PropertyCollector.Fetch, what pyVmomi reads one property with. The stock Fetch
// panics (index out of range) on a property that is unset, a template's resourcePool for one, and
// the client's connection drops; vCenter answers it with no value (None), and so does gpusim.
func (rt *router) serveFetch(w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	if panicked := served(rt.next, rec, r); panicked != nil {
		log.Printf("Fetch: %v: answered with no value (an unset property, as vCenter does)", panicked)
		w.Header().Set("Content-Type", "text/xml; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, emptyFetch)
		return
	}
	answer(w, rec, rec.Body.Bytes())
}

// served runs the handler; what it panicked with, if it did.
func served(h http.Handler, w http.ResponseWriter, r *http.Request) (panicked any) {
	defer func() { panicked = recover() }()
	h.ServeHTTP(w, r)
	return nil
}

// answer writes a recorded answer, with `body` in place of its own.
func answer(w http.ResponseWriter, rec *httptest.ResponseRecorder, body []byte) {
	for key, values := range rec.Header() {
		w.Header()[key] = values
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(rec.Code)
	_, _ = w.Write(body)
}

// ensureProxy registers the proxy for a VM or host the first time it is needed.
func (rt *router) ensureProxy(kind, value string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	real := types.ManagedObjectReference{Type: kind, Value: value}
	pref := types.ManagedObjectReference{Type: proxyPrefix + kind, Value: value}
	if simulator.Map.Get(pref) != nil {
		return true
	}
	switch simulator.Map.Get(real).(type) {
	case *simulator.VirtualMachine:
		simulator.Map.Put(&vmProxy{self: pref, real: real, g: rt.g})
	case *simulator.HostSystem:
		if rt.g.host(real) == nil {
			return false
		}
		simulator.Map.Put(&hostProxy{self: pref, real: real, g: rt.g})
	case *simulator.CustomFieldsManager:
		simulator.Map.Put(&fieldsProxy{self: pref, real: real, g: rt.g})
	case *simulator.Task:
		simulator.Map.Put(&taskProxy{self: pref, real: real})
	default:
		return false // let the stock code report the unknown object
	}
	return true
}

type vmProxy struct {
	self, real types.ManagedObjectReference
	g          *gpusim
}

func (p *vmProxy) Reference() types.ManagedObjectReference { return p.self }

func (p *vmProxy) vm() *simulator.VirtualMachine {
	vm, _ := simulator.Map.Get(p.real).(*simulator.VirtualMachine)
	return vm
}

type hostProxy struct {
	self, real types.ManagedObjectReference
	g          *gpusim
}

func (p *hostProxy) Reference() types.ManagedObjectReference { return p.self }
