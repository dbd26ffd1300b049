package main

import (
	"encoding/json"
	"net/http"
	"sync"
)

// requestsPath serves the SOAP requests gpusim has answered, by method name, as JSON
// ({"RetrievePropertiesEx": 1, ...}): benchmarks count what went over the wire, not what a
// client believes it sent. GET reads the counts; DELETE reads them and sets them back to zero.
const requestsPath = "/gpusim/requests"

type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *requestCounter) add(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]int{}
	}
	c.counts[method]++
}

func (c *requestCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = nil
}

func (c *requestCounter) serve(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	counts := c.counts
	if counts == nil {
		counts = map[string]int{}
	}
	if r.Method == http.MethodDelete {
		c.counts = nil
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(counts)
}
