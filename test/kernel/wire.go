package kernel

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// wireProblems is the display filter for what must never appear in a
// capture of a correct server: packets tshark cannot dissect, NFSv4
// replies with NFS4ERR_BADXDR (10036), and RPC replies with accept state
// GARBAGE_ARGS (4). The client is the stock Linux kernel, so such packets
// point at the server's XDR.
const wireProblems = `_ws.malformed || nfs.nfsstat4 == 10036 || rpc.state_accept == 4`

// wireReport is the outcome of dissecting one capture.
type wireReport struct {
	rpcPackets int         // packets matching 'nfs || rpc'
	perPort    map[int]int // of those, per server port (source or destination)
	malformed  int         // summary lines containing [Malformed Packet]
	problems   []string    // summary lines matching wireProblems
}

// tsharkAvailable reports whether the wire check can run.
func tsharkAvailable() bool {
	_, err := exec.LookPath("tshark")
	return err == nil
}

// dissect runs tshark over a capture, decoding each server TCP port as
// ONC RPC (the guest talks to 10.0.2.2:port, so the ports are the ones the
// servers listen on; tshark only recognises 2049 by itself).
func dissect(ctx context.Context, capture string, ports []int) (wireReport, error) {
	rep := wireReport{perPort: map[int]int{}}
	var decode []string
	for _, p := range ports {
		decode = append(decode, "-d", "tcp.port=="+strconv.Itoa(p)+",rpc")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	args := append([]string{"-n", "-r", capture}, decode...)
	args = append(args, "-Y", "nfs || rpc", "-T", "fields", "-E", "separator=/t",
		"-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "_ws.col.Info")
	all, err := exec.CommandContext(ctx, "tshark", args...).Output()
	if err != nil {
		return rep, fmt.Errorf("tshark -r %s: %w", capture, err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(all)))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		rep.rpcPackets++
		f := strings.SplitN(sc.Text(), "\t", 3)
		for _, x := range f[:min(2, len(f))] {
			if p, err := strconv.Atoi(x); err == nil && slices.Contains(ports, p) {
				rep.perPort[p]++
				break
			}
		}
		if strings.Contains(sc.Text(), "[Malformed Packet]") {
			rep.malformed++
		}
	}
	args = append([]string{"-n", "-r", capture}, decode...)
	bad, err := exec.CommandContext(ctx, "tshark", append(args, "-Y", wireProblems)...).Output()
	if err != nil {
		return rep, fmt.Errorf("tshark -Y %q: %w", wireProblems, err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(bad)), "\n") {
		if l != "" {
			rep.problems = append(rep.problems, strings.TrimSpace(l))
		}
	}
	return rep, nil
}
