package server

import (
	"time"

	"github.com/grpc-resilience/resilience/internal/cpuusage"
	"github.com/grpc-resilience/resilience/internal/limit"
)

// CPUShedding configures CPU-aware load shedding (Limits.CPU; see the
// package documentation, "CPU-aware shedding"). Zero fields take their
// defaults.
type CPUShedding struct {
	// CPUThreshold is the CPU use, in (0, 1], from which the server limits
	// the calls in flight; 0 means 0.8.
	CPUThreshold float64
	// Window is the window of the pass rate and the minimum latency; 0
	// means 5s.
	Window time.Duration
	// CoolOff keeps the limit on for this long after a call was shed,
	// whatever the CPU; 0 means 1s.
	CoolOff time.Duration
	// CPU returns the CPU use in [0, 1]. nil means the process's own,
	// cgroup-aware on Linux (cgroup v2, then v1, then /proc/stat; sampled at
	// most every 250ms, on the calls, without a goroutine), and 0 where it
	// cannot be read, which never sheds. It is called on every call and
	// must be cheap and safe for concurrent use.
	CPU func() float64
}

// Validate reports what is wrong with c, if anything.
func (c CPUShedding) Validate() error {
	return (limit.BBRConfig{CPUThreshold: c.CPUThreshold, Window: c.Window, CoolOff: c.CoolOff}).Validate()
}

// srvCPU is the server's CPU-aware shedder.
type srvCPU struct {
	bbr *limit.BBR
	cpu func() float64
}

func newSrvCPU(cfg *CPUShedding) (*srvCPU, error) {
	if cfg == nil {
		return nil, nil
	}
	b, err := limit.NewBBR(limit.BBRConfig{CPUThreshold: cfg.CPUThreshold, Window: cfg.Window, CoolOff: cfg.CoolOff})
	if err != nil {
		return nil, errorf("Limits.CPU: %v", err)
	}
	cpu := cfg.CPU
	if cpu == nil {
		r := cpuusage.New(0)
		cpu = func() float64 { return r.Usage(time.Now()) }
	}
	return &srvCPU{bbr: b, cpu: cpu}, nil
}
