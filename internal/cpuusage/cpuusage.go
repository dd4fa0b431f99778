// Package cpuusage reads the CPU use of the process's container or machine,
// as a share in [0, 1] of what it may use, for CPU-aware load shedding.
//
// On Linux it reads, in order of preference, cgroup v2 (cpu.stat usage_usec
// against cpu.max, or the machine's cores when unlimited), cgroup v1
// (cpuacct.usage against cpu.cfs_quota_us / cpu.cfs_period_us), and the
// machine-wide /proc/stat (1 − idle/total). Elsewhere, or when none is
// readable, the use reads as 0, which never sheds.
//
// A [Reader] samples lazily: a call at least Interval (250ms by default)
// after the last sample takes a new one (one file read, by one caller at a
// time; the others get the last value without waiting), and the use is
// that of the interval between the two samples. There is no goroutine.
// Reader is safe for concurrent use; Usage allocates only when it samples.
package cpuusage

import (
	"bytes"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// source reads a cumulative CPU time and the capacity it is measured
// against: busy and total in the same unit (total is wall time × cores for
// cgroups, all jiffies for /proc/stat).
type source interface {
	read() (busy float64, ok bool)
	// cores is the number of cores the busy time is divided by; 0 when busy
	// is already a share of total (procStat).
	cores() float64
}

// Reader is a lazily sampled CPU use. Use [New]; the zero value reads 0.
type Reader struct {
	src      source
	interval time.Duration
	sampling sync.Mutex // held by the caller taking a sample
	last     struct {
		at   time.Time
		busy float64
		wall float64 // for procStat: total jiffies
	}
	usage atomic.Uint64 // float64 bits of the last use
	// due is last.at + interval in Unix nanoseconds, 0 before the first
	// sample: Usage takes the lock only from then on, so that the calls
	// between two samples share a read-only cache line rather than all
	// writing the mutex's.
	due atomic.Int64
}

// New returns a Reader of this process's CPU use, sampled at most every
// interval (0 means 250ms).
func New(interval time.Duration) *Reader {
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	return &Reader{src: detect(), interval: interval}
}

// Usage returns the CPU use at now, in [0, 1].
func (r *Reader) Usage(now time.Time) float64 {
	if r.src != nil && now.UnixNano() >= r.due.Load() && r.sampling.TryLock() {
		if r.last.at.IsZero() || now.Sub(r.last.at) >= r.interval {
			r.sample(now)
			if !r.last.at.IsZero() {
				r.due.Store(r.last.at.Add(r.interval).UnixNano())
			}
		}
		r.sampling.Unlock()
	}
	return math.Float64frombits(r.usage.Load())
}

// sample reads the source and updates the use; r.sampling is held.
func (r *Reader) sample(now time.Time) {
	busy, ok := r.src.read()
	if !ok {
		return
	}
	if ps, isProc := r.src.(*procStat); isProc {
		total := ps.total
		if !r.last.at.IsZero() && total > r.last.wall {
			r.store((busy - r.last.busy) / (total - r.last.wall))
		}
		r.last.at, r.last.busy, r.last.wall = now, busy, total
		return
	}
	if !r.last.at.IsZero() {
		wall := now.Sub(r.last.at).Seconds() * r.src.cores()
		if wall > 0 {
			r.store((busy - r.last.busy) / wall)
		}
	}
	r.last.at, r.last.busy = now, busy
}

func (r *Reader) store(u float64) {
	if math.IsNaN(u) {
		u = 0
	}
	r.usage.Store(math.Float64bits(min(1, max(0, u))))
}

// detect picks the first readable source.
func detect() source {
	if runtime.GOOS != "linux" {
		return nil
	}
	for _, s := range []source{cgroup2(), cgroup1(), &procStat{}} {
		if s == nil {
			continue
		}
		if _, ok := s.read(); ok {
			return s
		}
	}
	return nil
}

// cgroupV2 reads usage_usec from cpu.stat; busy is in seconds.
type cgroupV2 struct {
	dir string
	n   float64
}

func cgroup2() source {
	const dir = "/sys/fs/cgroup"
	if _, err := os.Stat(dir + "/cpu.stat"); err != nil {
		return nil
	}
	n := float64(runtime.NumCPU())
	if b, err := os.ReadFile(dir + "/cpu.max"); err == nil {
		if f := bytes.Fields(b); len(f) == 2 && string(f[0]) != "max" {
			q, e1 := strconv.ParseFloat(string(f[0]), 64)
			p, e2 := strconv.ParseFloat(string(f[1]), 64)
			if e1 == nil && e2 == nil && q > 0 && p > 0 {
				n = q / p
			}
		}
	}
	return &cgroupV2{dir: dir, n: n}
}

func (c *cgroupV2) read() (float64, bool) {
	b, err := os.ReadFile(c.dir + "/cpu.stat")
	if err != nil {
		return 0, false
	}
	return parseUsageUsec(b)
}

func (c *cgroupV2) cores() float64 { return c.n }

// parseUsageUsec reads the usage_usec line of a cgroup v2 cpu.stat, in
// seconds.
func parseUsageUsec(b []byte) (float64, bool) {
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("usage_usec ")); ok {
			us, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
			return us / 1e6, err == nil
		}
	}
	return 0, false
}

// cgroupV1 reads cpuacct.usage (nanoseconds); busy is in seconds.
type cgroupV1 struct{ n float64 }

func cgroup1() source {
	if _, err := os.Stat("/sys/fs/cgroup/cpuacct/cpuacct.usage"); err != nil {
		return nil
	}
	n := float64(runtime.NumCPU())
	q, e1 := readFloat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
	p, e2 := readFloat("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
	if e1 == nil && e2 == nil && q > 0 && p > 0 {
		n = q / p
	}
	return &cgroupV1{n: n}
}

func (c *cgroupV1) read() (float64, bool) {
	ns, err := readFloat("/sys/fs/cgroup/cpuacct/cpuacct.usage")
	return ns / 1e9, err == nil
}

func (c *cgroupV1) cores() float64 { return c.n }

func readFloat(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(string(bytes.TrimSpace(b)), 64)
}

// procStat reads the machine-wide "cpu" line of /proc/stat: busy and total
// in jiffies; total is kept for the Reader.
type procStat struct{ total float64 }

func (p *procStat) read() (float64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	busy, total, ok := parseProcStat(b)
	if ok {
		p.total = total
	}
	return busy, ok
}

func (p *procStat) cores() float64 { return 0 }

// parseProcStat reads the first line, "cpu user nice system idle iowait
// irq softirq steal ...": busy is total minus idle and iowait.
func parseProcStat(b []byte) (busy, total float64, ok bool) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 5 || string(f[0]) != "cpu" {
		return 0, 0, false
	}
	var idle float64
	for i, v := range f[1:] {
		x, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return 0, 0, false
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		total += x
		if i == 3 || i == 4 {
			idle += x
		}
	}
	return total - idle, total, true
}
