package crash

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// images are what setup.sh prepared, plus the initramfs with the shoal
// binary appended (withBinary).
type images struct {
	kver, kernel, initrd string
}

// withBinary writes base followed by a cpio archive holding bin as
// /bin/shoal: the kernel unpacks concatenated archives one after the
// other, so the binary needs no rebuild of the base image.
func withBinary(base, bin, dir string) (string, error) {
	stage := filepath.Join(dir, "stage")
	if err := os.MkdirAll(filepath.Join(stage, "bin"), 0o755); err != nil {
		return "", err
	}
	if err := exec.Command("cp", bin, filepath.Join(stage, "bin", "shoal")).Run(); err != nil {
		return "", fmt.Errorf("copy shoal: %w", err)
	}
	out := filepath.Join(dir, "initrd")
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := os.Open(base)
	if err != nil {
		return "", err
	}
	defer b.Close()
	n, err := io.Copy(f, b)
	if err != nil {
		return "", err
	}
	// The kernel looks for the next archive's magic only at 4-byte
	// offsets, and skips zeros up to it.
	if pad := (4 - n%4) % 4; pad > 0 {
		if _, err := f.Write(make([]byte, pad)); err != nil {
			return "", err
		}
	}
	cmd := exec.Command("cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0")
	cmd.Dir = stage
	cmd.Stdin = strings.NewReader("bin\nbin/shoal\n")
	cmd.Stdout = f
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("cpio: %v: %s", err, stderr.String())
	}
	return out, f.Close()
}

// vmConfig is one boot of the VM.
type vmConfig struct {
	img      images
	disk     string // raw ext4 image, the guest's /dev/vda
	port     int    // host 127.0.0.1:port → guest :2049
	params   map[string]string
	console  string // console log file (appended)
	logf     func(format string, args ...any)
	deadline time.Duration // hard limit for this boot
}

// vm is a running qemu process.
type vm struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when qemu has exited and its output is read

	mu       sync.Mutex
	fsckJSON string
	fsckRC   int // -1 until seen
	serving  bool
	tail     []string
	events   chan string // FSCK-RC, SERVE-START, SERVE-EXIT lines
	killed   bool
	timer    *time.Timer
	// swept: the server reported a complete sweep of data objects no
	// file owns (SWEEP-DONE) in this boot.
	swept bool
}

// fsckReport is `shoal admin fsck --json` as the guest printed it.
type fsckReport struct {
	OK          bool     `json:"ok"`
	Inodes      uint64   `json:"inodes"`
	Directories uint64   `json:"directories"`
	Entries     uint64   `json:"entries"`
	Orphans     uint64   `json:"orphans"`
	DataObjects uint64   `json:"data_objects"`
	Problems    []string `json:"problems"`
}

// qemuArgs: TCG (the machine's /dev/kvm is too slow for a standard
// guest), one vCPU, the disk as virtio-blk with cache=writeback, user
// networking whose only way in is a forward from 127.0.0.1.
//
// cache=writeback: the guest sees a disk with a volatile write cache, so
// ext4 sends flushes (fdatasync ends in one) and qemu answers a flush
// only after an fdatasync of the image file on the host. What the guest
// was told is durable therefore is, even against a crash of the host.
// What a kill -9 of qemu takes is what a power loss takes from the
// guest: its page cache and every write it had not yet handed to the
// disk. (cache=unsafe would ignore flushes; cache=none and directsync
// would also be correct, only slower.) One thing a real power loss can
// do is not modelled: a disk losing writes it had acknowledged but not
// flushed (here, they sit in the host's page cache and survive the
// kill). Shoal's log never relies on those: a record counts as durable
// only after an fdatasync, which is a flush.
func qemuArgs(c vmConfig) []string {
	var cmdline []string
	cmdline = append(cmdline, "console=ttyS0", "panic=-1", "quiet")
	for _, k := range sortedKeys(c.params) {
		cmdline = append(cmdline, k+"="+c.params[k])
	}
	return []string{
		"-accel", "tcg,thread=multi", "-cpu", "max", "-m", "1024", "-smp", "1",
		"-display", "none", "-no-reboot", "-nodefaults", "-monitor", "none",
		"-serial", "stdio",
		"-kernel", c.img.kernel, "-initrd", c.img.initrd,
		"-append", strings.Join(cmdline, " "),
		"-drive", "file=" + c.disk + ",format=raw,if=virtio,cache=writeback",
		"-netdev", "user,id=n0,net=10.0.2.0/24,host=10.0.2.2,restrict=on,hostfwd=tcp:127.0.0.1:" + strconv.Itoa(c.port) + "-10.0.2.15:2049",
		"-device", "virtio-net-pci,netdev=n0",
	}
}

func sortedKeys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	for i := range ks {
		for j := i + 1; j < len(ks); j++ {
			if ks[j] < ks[i] {
				ks[i], ks[j] = ks[j], ks[i]
			}
		}
	}
	return ks
}

// startVM boots qemu directly (not under timeout(1): the harness must
// kill the qemu process itself, and knows its pid).
func startVM(c vmConfig) (*vm, error) {
	con, err := os.OpenFile(c.console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := qemuArgs(c)
	fmt.Fprintf(con, "# qemu-system-x86_64 %s\n", strings.Join(args, " "))
	cmd := exec.Command("qemu-system-x86_64", args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.Stdin = nil
	if err := cmd.Start(); err != nil {
		con.Close()
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	v := &vm{cmd: cmd, done: make(chan struct{}), fsckRC: -1, events: make(chan string, 16)}
	v.timer = time.AfterFunc(c.deadline, func() {
		c.logf("VM still running after %v: killing it", c.deadline)
		v.kill()
	})
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			l := strings.TrimRight(sc.Text(), "\r")
			fmt.Fprintln(con, l)
			v.line(l)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait()
		pw.Close()
		<-read
		con.Close()
		v.timer.Stop()
		close(v.events)
		close(v.done)
	}()
	return v, nil
}

func (v *vm) line(l string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.tail = append(v.tail, l)
	if len(v.tail) > 30 {
		v.tail = v.tail[1:]
	}
	switch {
	case strings.HasPrefix(l, "FSCK-JSON "):
		v.fsckJSON = strings.TrimPrefix(l, "FSCK-JSON ")
	case strings.HasPrefix(l, "FSCK-RC "):
		v.fsckRC, _ = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(l, "FSCK-RC ")))
		v.events <- l
	case strings.HasPrefix(l, "SWEEP-DONE"):
		v.swept = true
	case l == "SERVE-START":
		v.serving = true
		v.events <- l
	case strings.HasPrefix(l, "SERVE-EXIT"), strings.HasPrefix(l, "init: mount"):
		select {
		case v.events <- l:
		default:
		}
	}
}

// waitServe waits for SERVE-START (after the fsck, if any) or the VM's
// end.
func (v *vm) waitServe(limit time.Duration) error {
	to := time.After(limit)
	for {
		select {
		case ev, ok := <-v.events:
			if !ok {
				return fmt.Errorf("VM exited before serving; last console lines:\n%s", v.lastLines())
			}
			if ev == "SERVE-START" {
				return nil
			}
		case <-to:
			return fmt.Errorf("VM did not start serving within %v; last console lines:\n%s", limit, v.lastLines())
		}
	}
}

// sweptDone reports whether the server completed its sweep of data
// objects no file owns in this boot.
func (v *vm) sweptDone() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.swept
}

// waitSwept waits for SWEEP-DONE, polling, at most limit.
func (v *vm) waitSwept(limit time.Duration) error {
	for end := time.Now().Add(limit); !v.sweptDone(); {
		if time.Now().After(end) {
			return fmt.Errorf("no complete sweep of unowned data objects within %v; last console lines:\n%s", limit, v.lastLines())
		}
		select {
		case <-v.done:
			return fmt.Errorf("VM exited before its sweep completed; last console lines:\n%s", v.lastLines())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func (v *vm) lastLines() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return strings.Join(v.tail, "\n")
}

// fsck returns the fsck the guest ran at boot: its report and exit
// status, or ok=false if it ran none (first boot).
func (v *vm) fsck() (rep fsckReport, rc int, ran bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.fsckRC < 0 {
		return rep, 0, false, nil
	}
	if v.fsckJSON != "" {
		if err := json.Unmarshal([]byte(v.fsckJSON), &rep); err != nil {
			return rep, v.fsckRC, true, fmt.Errorf("fsck output %q: %w", v.fsckJSON, err)
		}
	}
	return rep, v.fsckRC, true, nil
}

// kill is the power cut: SIGKILL to qemu, then wait for it. It returns
// the moment just before the signal, on the host's clock.
func (v *vm) kill() time.Time {
	v.mu.Lock()
	v.killed = true
	v.mu.Unlock()
	at := time.Now()
	_ = v.cmd.Process.Signal(syscall.SIGKILL)
	<-v.done
	return at
}
