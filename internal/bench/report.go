package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Machine describes where a run happened.
type Machine struct {
	Hostname string `json:"hostname"`
	NumCPU   int    `json:"nproc"`
	CPUModel string `json:"cpu_model"`
	Kernel   string `json:"kernel"`
	Go       string `json:"go_version"`
	MemTotal string `json:"mem_total,omitempty"`
	// SyncMicros is the median fdatasync of a 4 KiB overwrite in the
	// temporary directory, in µs (syncLatency): what one durable
	// metadata change costs at least on this disk.
	SyncMicros float64 `json:"fdatasync_us,omitempty"`
}

// MachineInfo reads the machine description from the runtime and /proc.
// Fields it cannot read are left empty.
func MachineInfo() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), Go: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	m.Kernel = strings.TrimSpace(readFile("/proc/sys/kernel/osrelease"))
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	m.MemTotal = procField("/proc/meminfo", "MemTotal")
	m.SyncMicros = float64(syncLatency(os.TempDir()).Nanoseconds()) / 1e3
	return m
}

// procField returns the value of the first "key: value" line with key.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 0; sc.Scan() && i < 100000; i++ {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// LoadAvg returns the 1, 5 and 15 minute load averages, or zeros.
func LoadAvg() [3]float64 {
	var l [3]float64
	f := strings.Fields(readFile("/proc/loadavg"))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat; it
// is 100 on every Linux architecture Go supports.
const clockTick = 100

// procCPU returns the user+system CPU time of process pid so far.
func procCPU(pid int) (time.Duration, bool) {
	if pid <= 0 {
		return 0, false
	}
	s := readFile(fmt.Sprintf("/proc/%d/stat", pid))
	// The command name (field 2) may contain spaces; fields after it are
	// counted from the closing parenthesis.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * time.Second / clockTick, true
}

// Summary is the median, minimum and maximum of a set of samples.
type Summary struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Summarize computes a Summary; the median of an even count is the mean of
// the middle two.
func Summarize(samples []float64) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{Median: med, Min: s[0], Max: s[n-1]}
}

// Result is one workload on one target, over all repetitions.
type Result struct {
	Workload string `json:"workload"`
	// Unit is "MB/s" (10^6 bytes per second) or "ops/s".
	Unit    string    `json:"unit"`
	Samples []float64 `json:"samples"`
	Summary
	// Seconds is the wall time of each repetition.
	Seconds []float64 `json:"seconds"`
	// ServerCPU is the server's CPU time (user+system) in each repetition,
	// in seconds; absent when the server is not a separate process.
	ServerCPU []float64 `json:"server_cpu_seconds,omitempty"`
	// CommitSeconds is, for seq-write, how long the final COMMIT took in
	// each repetition (part of Seconds).
	CommitSeconds []float64 `json:"commit_seconds,omitempty"`
}

// ServerCores is the server's median CPU use during the workload, in cores
// (CPU seconds per wall second), or -1 if unknown.
func (r *Result) ServerCores() float64 {
	if len(r.ServerCPU) == 0 || len(r.ServerCPU) != len(r.Seconds) {
		return -1
	}
	c := make([]float64, len(r.Seconds))
	for i := range c {
		if r.Seconds[i] > 0 {
			c[i] = r.ServerCPU[i] / r.Seconds[i]
		}
	}
	return Summarize(c).Median
}

// TargetReport is everything measured on one target.
type TargetReport struct {
	Name string `json:"name"`
	Addr string `json:"addr,omitempty"`
	Root string `json:"root,omitempty"`
	// Skipped says why the target did not run (not installed, ...).
	Skipped string `json:"skipped,omitempty"`
	// Error is the failure that ended the target's run early.
	Error   string   `json:"error,omitempty"`
	Results []Result `json:"results"`
	// Profile is the server's CPU profile, if one was taken.
	Profile string `json:"cpu_profile,omitempty"`
	// MaxRead and MaxWrite are the server's limits as the client saw them.
	MaxRead  uint32 `json:"maxread,omitempty"`
	MaxWrite uint32 `json:"maxwrite,omitempty"`
}

// Report is the outcome of a whole run.
type Report struct {
	Start      time.Time      `json:"start"`
	Elapsed    float64        `json:"elapsed_seconds"`
	Config     Config         `json:"config"`
	Machine    Machine        `json:"machine"`
	LoadBefore [3]float64     `json:"loadavg_before"`
	LoadAfter  [3]float64     `json:"loadavg_after"`
	Targets    []TargetReport `json:"targets"`
	// Ratios are each target's medians over NFS-Ganesha's, when Ganesha
	// ran in the same run.
	Ratios []Ratio  `json:"ratios_to_baseline,omitempty"`
	Notes  []string `json:"notes"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for a terminal: a header with the machine
// and configuration, then one row per target and workload.
func (r *Report) WriteTable(w io.Writer) error {
	m := r.Machine
	c := r.Config
	fmt.Fprintf(w, "machine: %d CPUs (%s), kernel %s, %s\n", m.NumCPU, m.CPUModel, m.Kernel, m.Go)
	if m.SyncMicros > 0 {
		fmt.Fprintf(w, "disk: fdatasync of a 4 KiB overwrite takes %.0f µs (median): the least one durable metadata change costs\n", m.SyncMicros)
	}
	fmt.Fprintf(w, "load average: before %.2f %.2f %.2f, after %.2f %.2f %.2f\n",
		r.LoadBefore[0], r.LoadBefore[1], r.LoadBefore[2], r.LoadAfter[0], r.LoadAfter[1], r.LoadAfter[2])
	fmt.Fprintf(w, "config: size %s, block %s, depth %d, files %d, streams %d, reps %d; median [min-max]\n",
		FormatSize(c.Size), FormatSize(int64(c.Block)), c.Depth, c.Files, max(c.Streams, 1), c.Reps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if r.measured() {
		fmt.Fprintln(tw, "target\tworkload\tmedian\t[min-max]\tunit\tserver CPU")
	}
	for _, t := range r.Targets {
		for _, res := range t.Results {
			if len(res.Samples) == 0 {
				continue // the run stopped before this workload
			}
			cores := "-"
			if c := res.ServerCores(); c >= 0 {
				cores = fmt.Sprintf("%.2f cores", c)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t[%s-%s]\t%s\t%s\n", t.Name, res.Workload,
				FormatRate(res.Median), FormatRate(res.Min), FormatRate(res.Max), res.Unit, cores)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeRatios(w, r.Ratios); err != nil {
		return err
	}
	// Skips and failures are long sentences; they follow the table rather
	// than stretch its columns.
	for _, t := range r.Targets {
		if t.Skipped != "" {
			fmt.Fprintf(w, "%s: skipped: %s\n", t.Name, t.Skipped)
		}
		if t.Error != "" {
			fmt.Fprintf(w, "%s: FAILED: %s\n", t.Name, t.Error)
		}
	}
	for _, t := range r.Targets {
		for _, res := range t.Results {
			if len(res.CommitSeconds) > 0 {
				fmt.Fprintf(w, "%s: %s: the final COMMIT took %.2fs (median) of %.2fs\n", t.Name, res.Workload,
					Summarize(res.CommitSeconds).Median, Summarize(res.Seconds).Median)
			}
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, t := range r.Targets {
		if t.Profile != "" {
			fmt.Fprintf(w, "%s server CPU profile: %s (go tool pprof -top %s)\n", t.Name, t.Profile, t.Profile)
		}
	}
	return nil
}

// measured reports whether any workload produced a sample.
func (r *Report) measured() bool {
	for _, t := range r.Targets {
		for _, res := range t.Results {
			if len(res.Samples) > 0 {
				return true
			}
		}
	}
	return false
}

// FormatRate prints a rate (MB/s, operations per second) with three
// significant digits or more, as the tables and plots show it.
func FormatRate(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// cpuTimes is the machine-wide CPU time from /proc/stat, in ticks.
type cpuTimes struct{ busy, total uint64 }

// machineCPU reads the aggregate "cpu" line of /proc/stat.
func machineCPU() (cpuTimes, bool) {
	line, _, _ := strings.Cut(readFile("/proc/stat"), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		// Fields: user nice system idle iowait irq softirq steal guest
		// guest_nice; guest time is already counted in user.
		if i >= 8 {
			break
		}
		t.total += v
		if i != 3 && i != 4 {
			t.busy += v
		}
	}
	return t, true
}

// since is the share of CPU time that was busy between then and t.
func (t cpuTimes) since(then cpuTimes) float64 {
	if t.total <= then.total {
		return -1
	}
	return float64(t.busy-then.busy) / float64(t.total-then.total)
}
