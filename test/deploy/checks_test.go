package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalfs/shoal/fusemount"
)

// The machines the checks know by their role in the page.
var (
	mdsNodes  = []string{"mds1", "mds2"}
	etcdNodes = []string{"mds1", "mds2", "etcd3"}
)

// checks are what the page says holds at the end of a section, by the
// section's number.
func (w *world) checks() map[string]func() {
	return map[string]func(){
		"2.": func() {
			w.waitEtcd()
		},
		"3.": func() {
			w.waitHA("mds1")
		},
		"4.": func() {
			w.waitActive("ds1", "ds2")
			for _, c := range []struct{ node, want string }{{"mds1", "shoal_mds_leader 1"}, {"mds2", "shoal_mds_leader 0"}} {
				m := w.machines[c.node]
				body, err := httpGet(w.machines["client"], "http://"+m.docIP+":9101/metrics")
				if err != nil {
					w.t.Fatalf("%s's metrics: %v", c.node, err)
				}
				if !strings.Contains(body, "\n"+c.want+"\n") {
					w.t.Fatalf("%s's metrics lack %q", c.node, c.want)
				}
			}
		},
		"6.": func() {
			if ok, _ := fusemount.Mounted(filepath.Join(w.machines["client"].root, "mnt/shoal")); ok {
				w.t.Fatal("the client's /mnt/shoal is still mounted after shoal umount")
			}
			w.verifySample()
		},
		"7.": func() {
			w.waitHA("mds1")
			w.waitActive("ds1", "ds2")
			body, err := httpGet(w.machines["client"], "http://"+w.machines["mds1"].docIP+":9101/metrics")
			if err != nil {
				w.t.Fatal(err)
			}
			if want := `shoal_mds_election_events_total{event="stepped_down"} 1`; !strings.Contains(body, want) {
				w.t.Fatalf("mds1's metrics lack %q after the step-down", want)
			}
			w.verifySample()
		},
		"8.": func() {
			st := w.waitActive("ds1", "ds2", "ds3")
			if d := st.ds(w.dsID("ds3")); d.Files == 0 {
				w.t.Fatalf("after shoal admin rebalance ds3 holds no files: %+v", *st)
			}
			w.verifySample()
		},
		"9.": func() {
			st := w.waitActive("ds1", "ds2")
			if d := st.ds(w.dsID("ds3")); d == nil || d.State != "removed" {
				w.t.Fatalf("ds3 is not listed as removed after shoal admin remove: %+v", d)
			}
			if n := objectsWithData(w.t, filepath.Join(w.machines["ds3"].root, "var/lib/shoal/ds")); n != 0 {
				w.t.Fatalf("ds3 still holds %d objects with data after its drain", n)
			}
			w.verifySample()
		},
		"10.": func() {
			// Every member runs on the restored snapshot, and the cluster
			// with it.
			for _, name := range etcdNodes {
				u := w.unit(name + " etcd")
				b, _ := os.ReadFile(u.logPath)
				if want := "data dir = " + filepath.Join(w.machines[name].root, "var/lib/etcd/shoal-restored"); !u.running() || !strings.Contains(string(b), want) {
					w.t.Fatalf("etcd on %s does not run in the restored data directory:\n%s", name, tail(b))
				}
			}
			w.waitEtcd()
			w.waitHA("mds1")
			w.waitActive("ds1", "ds2")
			w.verifySample()
		},
		"11.": func() {
			w.waitHA("mds2")
			w.waitActive("ds1", "ds2")
			w.verifySample()
		},
	}
}

// shoal runs a short shoal command on the client machine.
func (w *world) shoal(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := w.machines["client"].command(ctx, shoalBin, args...).Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		err = fmt.Errorf("shoal %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
	}
	return string(out), err
}

// adminArgs are the flags of the page's `shoal admin` commands: both MDS
// addresses, and mds1's copy of the join secret.
func (w *world) adminArgs() []string {
	var addrs []string
	for _, n := range mdsNodes {
		addrs = append(addrs, w.machines[n].docIP+":2049")
	}
	return []string{"--mds", strings.Join(addrs, ","), "--join-secret-file", filepath.Join(w.machines["mds1"].root, "var/lib/shoal/mds/join-secret")}
}

// serviceAddrRe finds the service address in the page's vip.yaml.
var serviceAddrRe = regexp.MustCompile(`(?m)^address:\s*([0-9.]+)/\d+\s*$`)

// serviceAddr is the service address (a.b.c.d) the page gives shoal vip.
func (w *world) serviceAddr() string {
	w.t.Helper()
	m := serviceAddrRe.FindStringSubmatch(w.files["mds1 /etc/shoal/vip.yaml"])
	if m == nil {
		w.t.Fatal("the page's /etc/shoal/vip.yaml on mds1 has no address: A.B.C.D/N")
	}
	return m[1]
}

// status mirrors what the checks read of `shoal admin status --json`.
type status struct {
	DataServers []dsStatus `json:"data_servers"`
	HA          *struct {
		Term  uint64 `json:"term"`
		Nodes []struct {
			Node   string `json:"node"`
			Leader bool   `json:"leader"`
		} `json:"nodes"`
		Etcd []struct {
			Name    string `json:"name"`
			Healthy bool   `json:"healthy"`
		} `json:"etcd"`
	} `json:"ha"`
}

type dsStatus struct {
	ID    string
	State string
	Up    bool
	Files int `json:"files"`
}

func (s *status) ds(id string) *dsStatus {
	for i := range s.DataServers {
		if s.DataServers[i].ID == id {
			return &s.DataServers[i]
		}
	}
	return nil
}

// waitStatus asks `shoal admin status --json` until ok accepts the answer,
// for up to 60 s, and fails the test with what it last saw if none did.
func (w *world) waitStatus(what string, ok func(*status) error) *status {
	w.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := w.shoal(append([]string{"admin", "status", "--json"}, w.adminArgs()...)...)
		var st status
		if err == nil {
			err = json.Unmarshal([]byte(out), &st)
		}
		if err == nil {
			if err = ok(&st); err == nil {
				return &st
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("waited 60s for %s: %v; last status: %s", what, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitActive waits until exactly the named data servers are in the
// cluster (not counting removed ones, which status lists as such), each
// active and up.
func (w *world) waitActive(names ...string) *status {
	w.t.Helper()
	ids := map[string]string{}
	for _, n := range names {
		ids[n] = w.dsID(n)
	}
	return w.waitStatus(fmt.Sprintf("data servers %v to be the active ones", names), func(st *status) error {
		members := 0
		for _, d := range st.DataServers {
			if d.State != "removed" {
				members++
			}
		}
		if members != len(names) {
			return fmt.Errorf("%d data servers in the cluster", members)
		}
		for _, n := range names {
			if d := st.ds(ids[n]); d == nil || !d.Up || d.State != "active" {
				return fmt.Errorf("%s is not active and up: %+v", n, d)
			}
		}
		return nil
	})
}

// waitHA waits until leader leads and every other MDS of the page stands
// by, every etcd member is healthy as the leader sees it, and the service
// address is on the leader's eth0 and no other machine's.
func (w *world) waitHA(leader string) {
	w.t.Helper()
	w.waitStatus(leader+" to lead, the others to stand by, and etcd to be healthy", func(st *status) error {
		if st.HA == nil {
			return errors.New("no ha section: the MDS is not elected")
		}
		roles := map[string]bool{}
		for _, n := range st.HA.Nodes {
			if _, dup := roles[n.Node]; dup {
				return fmt.Errorf("node %s twice in the election", n.Node)
			}
			roles[n.Node] = n.Leader
		}
		if len(roles) != len(mdsNodes) {
			return fmt.Errorf("%d MDS nodes in the election, want %d", len(roles), len(mdsNodes))
		}
		for _, n := range mdsNodes {
			if isLeader, ok := roles[n]; !ok || isLeader != (n == leader) {
				return fmt.Errorf("%s: listed %v, leader %v", n, ok, isLeader)
			}
		}
		if len(st.HA.Etcd) != len(etcdNodes) {
			return fmt.Errorf("%d etcd members, want %d", len(st.HA.Etcd), len(etcdNodes))
		}
		for _, e := range st.HA.Etcd {
			if !e.Healthy {
				return fmt.Errorf("etcd member %s is not healthy", e.Name)
			}
		}
		return nil
	})
	addr := w.serviceAddr()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var holders []string
		for _, m := range w.machines {
			if w.hasAddr(m, addr) {
				holders = append(holders, m.name)
			}
		}
		if len(holders) == 1 && holders[0] == leader {
			break
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("waited 60s for the service address %s to be on %s only; it is on %v", addr, leader, holders)
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.t.Logf("%s leads and holds the service address %s; the other MDS stands by", leader, addr)
}

// waitEtcd waits until every etcd member of the page is in the cluster
// and answers, as etcdctl on mds1 sees it.
func (w *world) waitEtcd() {
	w.t.Helper()
	var eps []string
	for _, n := range etcdNodes {
		eps = append(eps, "http://"+w.machines[n].docIP+":2379")
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := w.machines["mds1"].command(ctx, "etcdctl", "--endpoints="+strings.Join(eps, ","), "endpoint", "status", "--write-out=json").Output()
		cancel()
		var sts []struct {
			Endpoint string `json:"Endpoint"`
			Status   struct {
				Header struct {
					MemberID uint64 `json:"member_id"`
				} `json:"header"`
				Leader uint64 `json:"leader"`
			} `json:"Status"`
		}
		if err == nil {
			err = json.Unmarshal(out, &sts)
		}
		if err == nil && len(sts) == len(eps) {
			leaders := map[uint64]bool{}
			for _, s := range sts {
				leaders[s.Status.Leader] = true
			}
			if len(leaders) == 1 && !leaders[0] {
				w.t.Logf("etcd: %d members answer, with one raft leader", len(sts))
				return
			}
			err = fmt.Errorf("the members see leaders %v", leaders)
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("waited 60s for the etcd members %v to answer with one leader: %v: %s", etcdNodes, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dsID is a data server's identity, from its directory.
func (w *world) dsID(name string) string {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.machines[name].root, "var/lib/shoal/ds/ds-identity.json"))
	if err != nil {
		w.t.Fatal(err)
	}
	var ident struct{ ID string }
	if err := json.Unmarshal(b, &ident); err != nil {
		w.t.Fatalf("%s's ds-identity.json: %v", name, err)
	}
	return ident.ID
}

// verifySample reads the file the page wrote through the mount back with
// `shoal get` from the client machine, through the service address (from
// the data servers, not a cache of the client's), and compares sha256 with
// the client's local copy.
func (w *world) verifySample() {
	w.t.Helper()
	want := sha256File(w.t, filepath.Join(w.machines["client"].root, "root/sample"))
	got := filepath.Join(w.base, "sample.get")
	if _, err := w.shoal("get", "nfs://"+w.serviceAddr()+":2049/sample", got); err != nil {
		w.t.Fatal(err)
	}
	defer os.Remove(got)
	if sum := sha256File(w.t, got); sum != want {
		w.t.Fatalf("sample reads back with sha256 %s, written %s", sum, want)
	}
	w.t.Logf("sample reads back identical through the service address (sha256 %s)", want[:16])
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// objectsWithData counts a data server's objects (files named by an inode
// number under data/) that have blocks allocated.
func objectsWithData(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(filepath.Join(dir, "data"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if _, nerr := strconv.ParseUint(d.Name(), 10, 64); !d.Type().IsRegular() || nerr != nil {
			return nil
		}
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return err
		}
		if st.Blocks > 0 {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
