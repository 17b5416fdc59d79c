package kernel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// images are the boot artifacts prepared by setup.sh.
type images struct {
	kver, kernel, initrd string
}

// kernelRelRE is the major.minor at the start of a kernel release
// (6.1.0-56-amd64, 7.2.13+deb14-amd64).
var kernelRelRE = regexp.MustCompile(`^[0-9]+\.[0-9]+`)

// label names the kernel in subtest names: its major.minor ("6.1",
// "7.2"), or the whole release if it does not start with one.
func (img images) label() string {
	if m := kernelRelRE.FindString(img.kver); m != "" {
		return m
	}
	return img.kver
}

// parseSetup reads setup.sh's KEY=VALUE output.
func parseSetup(out string) (images, error) {
	var img images
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		switch k {
		case "KVER":
			img.kver = v
		case "KERNEL":
			img.kernel = v
		case "INITRD":
			img.initrd = v
		}
	}
	if img.kver == "" || img.kernel == "" || img.initrd == "" {
		return img, fmt.Errorf("setup.sh printed no KVER=/KERNEL=/INITRD= lines:\n%s", out)
	}
	return img, nil
}

// bootConfig is one VM run.
type bootConfig struct {
	img     images
	port    int               // server port on the host (10.0.2.2:port in the guest)
	params  map[string]string // t_* kernel command-line settings
	capture string            // pcap file of the guest's traffic
	console string            // copy of the serial console
	timeout time.Duration     // hard limit for the whole VM run
	logf    func(format string, args ...any)
	// hook, if set, sees every console line; a non-empty return value is
	// typed into the guest's console (the workload reads it with `read`).
	hook func(line string) (reply string)
	// netns and tap, if set, replace user networking: qemu runs under
	// `ip netns exec netns` and the guest's NIC is the tap device tap in
	// that namespace (the test created both).
	netns, tap string
	// memMB is the guest's memory (default 1024).
	memMB int
}

// qemuArgs is the qemu command line that was seen to work on these
// machines: TCG (the /dev/kvm here is too slow to boot a standard guest),
// one vCPU, user networking with the host reachable as 10.0.2.2, and a
// filter-dump of the guest's NIC for the wire check.
func qemuArgs(c bootConfig) []string {
	var keys []string
	for k := range c.params {
		keys = append(keys, k)
	}
	// Deterministic order makes console logs comparable between runs.
	slices.Sort(keys)
	cmdline := []string{"console=ttyS0", "panic=-1", "quiet"}
	for _, k := range keys {
		cmdline = append(cmdline, k+"="+c.params[k])
	}
	mem := 1024
	if c.memMB > 0 {
		mem = c.memMB
	}
	netdev := "user,id=n0,net=10.0.2.0/24,host=10.0.2.2,restrict=off"
	if c.tap != "" {
		netdev = "tap,id=n0,ifname=" + c.tap + ",script=no,downscript=no"
	}
	args := []string{
		"-accel", "tcg,thread=multi", "-cpu", "max", "-m", strconv.Itoa(mem), "-smp", "1",
		"-display", "none", "-no-reboot", "-nodefaults", "-monitor", "none",
		"-serial", "stdio",
		"-kernel", c.img.kernel, "-initrd", c.img.initrd,
		"-append", strings.Join(cmdline, " "),
		"-netdev", netdev,
		"-device", "virtio-net-pci,netdev=n0",
	}
	if c.capture != "" {
		args = append(args, "-object", "filter-dump,id=f0,netdev=n0,file="+c.capture)
	}
	return args
}

// stepResult is one PASS/FAIL line of the workload.
type stepResult struct {
	name   string
	pass   bool
	detail string // elapsed time and detail for PASS, the reason for FAIL
	output []string
}

// runResult is everything learned from one VM run.
type runResult struct {
	steps      []stepResult
	sums       map[string]string // SUM lines (crash test, phase main)
	sumOrder   []string
	crashpoint bool // the workload reached CRASHPOINT
	result     string
	passed     int
	failed     int
	elapsed    time.Duration
	err        error    // qemu failed, timed out or the workload did not finish
	tail       []string // last console lines, for diagnosis
}

var (
	stepRE   = regexp.MustCompile(`^(PASS|FAIL) (\S+) ?(.*)$`)
	resultRE = regexp.MustCompile(`^RESULT (\d+) passed, (\d+) failed`)
	sumRE    = regexp.MustCompile(`^SUM (\S+) ([0-9a-f]{64})$`)
)

// parser turns console lines into a runResult.
type parser struct {
	res     runResult
	pending []string // "  | " lines that precede a FAIL
}

func (p *parser) line(l string) {
	l = strings.TrimRight(l, "\r")
	p.res.tail = append(p.res.tail, l)
	if len(p.res.tail) > 40 {
		p.res.tail = p.res.tail[1:]
	}
	switch {
	case strings.HasPrefix(l, "  | "):
		p.pending = append(p.pending, strings.TrimPrefix(l, "  | "))
	case stepRE.MatchString(l):
		m := stepRE.FindStringSubmatch(l)
		p.res.steps = append(p.res.steps, stepResult{name: m[2], pass: m[1] == "PASS", detail: m[3], output: p.pending})
		p.pending = nil
	case sumRE.MatchString(l):
		m := sumRE.FindStringSubmatch(l)
		if p.res.sums == nil {
			p.res.sums = map[string]string{}
		}
		if _, dup := p.res.sums[m[1]]; !dup {
			p.res.sumOrder = append(p.res.sumOrder, m[1])
		}
		p.res.sums[m[1]] = m[2]
	case l == "CRASHPOINT":
		p.res.crashpoint = true
	case resultRE.MatchString(l):
		m := resultRE.FindStringSubmatch(l)
		p.res.result = l
		p.res.passed, _ = strconv.Atoi(m[1])
		p.res.failed, _ = strconv.Atoi(m[2])
	}
}

// boot runs one VM to completion under `timeout`, streaming the serial
// console to logf and to c.console, and parses the workload's report.
func boot(ctx context.Context, c bootConfig) runResult {
	start := time.Now()
	secs := int(c.timeout / time.Second)
	args := append([]string{"timeout", "--kill-after=10", strconv.Itoa(secs), "qemu-system-x86_64"}, qemuArgs(c)...)
	if c.netns != "" {
		args = append([]string{"ip", "netns", "exec", c.netns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var p parser
	con, err := os.Create(c.console)
	if err != nil {
		p.res.err = fmt.Errorf("create console log: %w", err)
		return p.res
	}
	defer con.Close()
	fmt.Fprintf(con, "# %s\n", strings.Join(args, " "))
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	stdin, err := cmd.StdinPipe()
	if err != nil {
		p.res.err = fmt.Errorf("qemu stdin: %w", err)
		return p.res
	}
	if err := cmd.Start(); err != nil {
		p.res.err = fmt.Errorf("start qemu: %w", err)
		return p.res
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			fmt.Fprintln(con, l)
			c.logf("vm: %s", l)
			p.line(l)
			if c.hook != nil {
				if reply := c.hook(strings.TrimRight(l, "\r")); reply != "" {
					c.logf("driver -> vm: %s", reply)
					if _, err := io.WriteString(stdin, reply+"\n"); err != nil {
						c.logf("write to VM console: %v", err)
					}
				}
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	werr := cmd.Wait()
	stdin.Close()
	pw.Close()
	<-done
	p.res.elapsed = time.Since(start)
	switch {
	case werr != nil && isExit(werr, 124):
		p.res.err = fmt.Errorf("VM hit the %v timeout", c.timeout)
	case werr != nil && isExit(werr, 137):
		p.res.err = fmt.Errorf("VM killed after ignoring the %v timeout", c.timeout)
	case werr != nil:
		p.res.err = fmt.Errorf("qemu: %w", werr)
	case p.res.result == "":
		p.res.err = fmt.Errorf("VM powered off without a RESULT line")
	}
	return p.res
}

func isExit(err error, code int) bool {
	ee, ok := err.(*exec.ExitError)
	return ok && ee.ExitCode() == code
}
