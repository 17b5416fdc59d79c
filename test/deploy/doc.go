// Package deploy tests docs/deploy.md by following it: TestDeployDoc reads
// the page, and runs its marked blocks in order on one machine, with three
// members of Debian's etcd, two `shoal mds` each beside a `shoal vip`
// holding the service address while its MDS leads, three `shoal ds`
// processes (the third added and removed as the page says) and a
// `shoal mount` FUSE mount.
//
// The page marks what the test runs with HTML comments, which Markdown
// does not render:
//
//	<!-- deploy-test: run MACHINE... -->        the next fenced block is a
//	                                            shell script to run on each,
//	                                            one after the other
//	<!-- deploy-test: run-together MACHINE... -->
//	                                            the same, on all at once (the
//	                                            members of a new etcd cluster,
//	                                            none of which is ready before
//	                                            a majority has started)
//	<!-- deploy-test: file MACHINE PATH -->     the next fenced block is the
//	                                            file PATH on MACHINE
//	<!-- deploy-test: file MACHINE PATH like OTHER -->
//	                                            OTHER's PATH, with OTHER's
//	                                            address replaced by MACHINE's
//	<!-- deploy-test: file MACHINE PATH like OTHER but -->
//	                                            OTHER's PATH, with the lines
//	                                            of the next fenced block in
//	                                            place of those with the same
//	                                            key (KEY=... or key: ...)
//	<!-- deploy-test: check leader MDS -->      wait until MDS leads, the
//	                                            other stands by and the
//	                                            service address is on MDS's
//	                                            machine only, where the page
//	                                            says to wait for that
//
// # Machines
//
// The machines and their addresses come from the page's table. Each
// machine is a network namespace the test creates, with its own loopback
// and an eth0 holding the page's address for it (192.0.2.N, TEST-NET-1),
// all eth0s joined by a bridge in one more namespace; and a directory,
// under which the page's paths (/etc/shoal, /var/lib/shoal, ...) are
// rewritten. So the addresses, ports and configuration files are the
// page's own, an MDS listening on 0.0.0.0:2049 listens on its machine only,
// data servers really move from one MDS address to the other, and
// `shoal vip` really adds the service address to its machine's eth0 (and
// announces it with gratuitous ARP), where the client reaches it after a
// handover. Nothing of the host's own network changes. Processes enter a
// machine's network namespace only (nsenter --net), so the FUSE mount on
// the client is visible to the test; the page's last section lists the
// other substitutions (systemctl as processes of the test, scp between
// machines' directories), which rewrite and the bash prelude implement.
//
// # Checks
//
// After each section the test checks what the page says is true by then,
// with `shoal admin status --json` and etcdctl run on the page's machines:
// the three etcd members answering with one raft leader; exactly one MDS
// leading (mds1 at first, mds2 after a step-down, mds1 again once mds2's
// is killed with SIGKILL) and the other standing by, with the service address on the leader's machine and no other; the
// election metrics; data servers active; the sample file reading back with
// its sha256 through the service address; the removed data server empty;
// every etcd member running on the restored snapshot. Every block of the
// page marked for the test runs; none is skipped.
//
// Every process it starts is its child, stopped by PID; the FUSE mount is
// unmounted, the namespaces deleted and the directories removed when it
// ends. The namespaces are named after the test's PID, and a run deletes
// those of an earlier run whose process no longer exists (one killed
// before its cleanup).
//
// It needs root (network namespaces, port 2049, FUSE), /dev/fuse, etcd and
// etcdctl (Debian's etcd-server and etcd-client), jq, ip (iproute2) and
// nsenter (util-linux), and skips without them unless SHOAL_DEPLOY=1, as
// scripts/test.sh sets it.
package deploy
