package kernel

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What the capture of the guest's traffic with the service address shows
// around a fault: the TCP connections the client opened and the resets it
// got, the gratuitous ARPs that moved the address, the NFS error statuses
// it was answered, and every RPC the client sent more than once (the same
// XID again) with how long after the first sending: that is what the
// mount's timeo/retrans did to a request the old leader had taken but
// never answered.

// rpcEvent is one frame of the capture.
type rpcEvent struct {
	t                  time.Time
	stream             int
	fromGuest          bool
	syn, ack, rst, fin bool
	arpFrom            string // sender MAC of an ARP for the service address
	xids               []string
	msgtypes           []string // 0 call, 1 reply, per xid
	statuses           []int    // NFS statuses in the frame
}

// rpcEvents dissects the capture (tshark: the frames, the RPC headers and
// the NFS statuses).
func rpcEvents(ctx context.Context, capture string) ([]rpcEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "tshark", "-n", "-r", capture,
		"-T", "fields", "-E", "separator=/t",
		"-e", "frame.time_epoch", "-e", "tcp.stream", "-e", "tcp.dstport",
		"-e", "tcp.flags.syn", "-e", "tcp.flags.ack", "-e", "tcp.flags.reset", "-e", "tcp.flags.fin",
		"-e", "rpc.xid", "-e", "rpc.msgtyp", "-e", "nfs.nfsstat4",
		"-e", "arp.src.proto_ipv4", "-e", "arp.src.hw_mac").Output()
	if err != nil {
		return nil, fmt.Errorf("tshark -r %s: %w", capture, err)
	}
	return parseRPCEvents(string(out)), nil
}

func parseRPCEvents(out string) []rpcEvent {
	var evs []rpcEvent
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, "\t")
		if len(f) < 12 {
			continue
		}
		sec, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		e := rpcEvent{t: time.Unix(0, int64(sec*1e9))}
		if f[10] == foVIP {
			e.arpFrom = f[11]
			evs = append(evs, e)
			continue
		}
		if f[1] == "" {
			continue
		}
		e.stream, _ = strconv.Atoi(f[1])
		e.fromGuest = f[2] == strconv.Itoa(foMDSPort)
		flag := func(s string) bool { return s == "1" || s == "True" }
		e.syn, e.ack, e.rst, e.fin = flag(f[3]), flag(f[4]), flag(f[5]), flag(f[6])
		if f[7] != "" {
			e.xids = strings.Split(f[7], ",")
			e.msgtypes = strings.Split(f[8], ",")
		}
		for _, s := range strings.Split(f[9], ",") {
			if v, err := strconv.Atoi(s); err == nil {
				e.statuses = append(e.statuses, v)
			}
		}
		evs = append(evs, e)
	}
	return evs
}

// wireSummary describes the frames from a second before r's fault to 90 s
// after it, or to a second before the next round's fault (next, if not
// zero), times relative to the fault.
func (r *foRound) wireSummary(evs []rpcEvent, next time.Time) []string {
	from, to := r.at.Add(-time.Second), r.at.Add(90*time.Second)
	if !next.IsZero() && next.Add(-time.Second).Before(to) {
		to = next.Add(-time.Second)
	}
	rel := func(t time.Time) string { return fmt.Sprintf("%+.2fs", t.Sub(r.at).Seconds()) }
	var syns, rsts, fins, arps []string
	statuses := map[int]int{}
	firstOK := ""
	type call struct {
		first, last time.Time
		n           int
		streams     []int
		replied     bool
	}
	calls := map[string]*call{}
	var order []string
	for _, e := range evs {
		if e.t.Before(from.Add(-60*time.Second)) || e.t.After(to) {
			continue
		}
		in := !e.t.Before(from)
		switch {
		case e.arpFrom != "":
			if in {
				arps = append(arps, rel(e.t)+" "+e.arpFrom)
			}
			continue
		case in && e.syn && !e.ack:
			syns = append(syns, rel(e.t))
		case in && e.rst:
			who := "server"
			if e.fromGuest {
				who = "guest"
			}
			rsts = append(rsts, rel(e.t)+" from "+who)
		case in && e.fin && !e.fromGuest:
			fins = append(fins, rel(e.t))
		}
		for i, x := range e.xids {
			mt := ""
			if i < len(e.msgtypes) {
				mt = e.msgtypes[i]
			}
			c := calls[x]
			switch {
			case mt == "0" && e.fromGuest:
				if c == nil {
					c = &call{first: e.t}
					calls[x] = c
					order = append(order, x)
				}
				c.n++
				c.last = e.t
				if !slices.Contains(c.streams, e.stream) {
					c.streams = append(c.streams, e.stream)
				}
			case mt == "1" && !e.fromGuest && c != nil:
				c.replied = true
			}
		}
		// Statuses in the takeover: from the fault to 10 s after the
		// new leader led.
		if in && !e.fromGuest && len(e.xids) > 0 && e.t.After(r.at) && e.t.Sub(r.at) < r.detect+10*time.Second {
			bad := false
			for _, s := range e.statuses {
				if s != 0 {
					statuses[s]++
					bad = true
				}
			}
			if !bad && firstOK == "" && e.t.Sub(r.at) >= r.detect {
				firstOK = rel(e.t)
			}
		}
	}
	var out []string
	out = append(out, fmt.Sprintf("connects (SYN) from the guest: %v; resets: %v; FIN from a server: %v", syns, rsts, fins))
	out = append(out, fmt.Sprintf("ARP for %s (sender MAC): %v", foVIP, arps))
	out = append(out, fmt.Sprintf("NFS error statuses answered from the fault to 10 s after the new leader led (status: frames): %v (10008 DELAY, 10013 GRACE, 10011 EXPIRED, 10022 STALE_CLIENTID, 10052 BADSESSION, 10023 STALE_STATEID)", statuses))
	out = append(out, "first all-OK reply after the new leader led: "+firstOK)
	n := 0
	for _, x := range order {
		c := calls[x]
		if c.n < 2 || c.last.Before(from) {
			continue
		}
		n++
		if n > 10 {
			continue
		}
		out = append(out, fmt.Sprintf("xid %s sent %d times: first %s, again %s (%.2fs later), on TCP streams %v, answered: %v",
			x, c.n, rel(c.first), rel(c.last), c.last.Sub(c.first).Seconds(), c.streams, c.replied))
	}
	out = append(out, fmt.Sprintf("%d RPCs sent again (same XID) around this fault", n))
	var lost int
	for _, x := range order {
		if c := calls[x]; !c.replied && c.first.Before(r.at) && c.first.After(from) {
			lost++
		}
	}
	out = append(out, fmt.Sprintf("%d RPCs sent in the second before the fault never saw a reply in the capture", lost))
	return out
}
