// Package deploy tests docs/deploy.md by following it: TestDeployDoc reads
// the page, and runs its marked blocks in order on one machine, with
// Debian's etcd, a `shoal mds`, three `shoal ds` processes (the third added
// and removed as the page says) and a `shoal mount` FUSE mount, all over
// loopback.
//
// The page marks what the test runs with HTML comments, which Markdown
// does not render:
//
//	<!-- deploy-test: run MACHINE... -->        the next fenced block is a
//	                                            shell script to run on each
//	<!-- deploy-test: file MACHINE PATH -->     the next fenced block is the
//	                                            file PATH on MACHINE
//	<!-- deploy-test: file MACHINE PATH like OTHER -->
//	                                            OTHER's PATH, with OTHER's
//	                                            address replaced by MACHINE's
//
// The machines and their addresses come from the page's table. Each
// machine is a directory; the page's last section lists every
// substitution the test makes (paths under the machine's directory,
// 192.0.2.N as 127.A.B.N, systemctl as processes of the test), and
// rewrite and the bash prelude implement them.
//
// After each section the test checks what the page says is true by then:
// data servers active, the sample file reading back with its sha256, the
// removed data server empty. Every process it starts is its child, stopped
// by PID; the FUSE mount is unmounted and the directories removed when it
// ends.
//
// It needs root (port 2049, FUSE), /dev/fuse, etcd and etcdctl (Debian's
// etcd-server and etcd-client) and jq, and skips without them unless
// SHOAL_DEPLOY=1, as scripts/test.sh sets it.
package deploy
