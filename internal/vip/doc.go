// Package vip keeps a Shoal cluster's service address on the host whose
// metadata server leads, and on no other host.
//
// # Why a supervisor
//
// Linux NFS clients mount one address. When the MDS fails over, that
// address must move to the new leader's host. The MDS itself cannot own
// it: an MDS killed with SIGKILL never removes it, and a stopped one
// (SIGSTOP, a long pause) keeps it while another host takes over. So each
// MDS host runs a small supervisor (shoal vip) that outlives the MDS
// process and holds the address on its behalf.
//
// # Protocol
//
// The MDSes campaign in an etcd election under PREFIX/election/; the
// value of the leader's key is a JSON [Leader] naming its node. Each
// supervisor follows the election and wants the address exactly while the
// leader's node is its own --node. The leader is the key under the prefix
// with the lowest create revision (concurrency.Election's rule), so the
// prefix must hold campaign keys only. When nobody campaigns, or the
// leader's value is not a Leader, no supervisor wants the address; nor
// while the leader's value says it does not serve yet ("serving": false,
// as an elected MDS says until its listener is up), so that clients are
// not answered with resets by a host without a listener.
//
// Wanting is not enough to take it: the address is guarded by one etcd
// key, PREFIX/vip/IP (see [ClaimKey]), written under the supervisor's own
// lease, and created only if absent. The order of steps is what keeps two
// hosts from holding the address at once:
//
//   - to hold it: create the claim key, then add the address to the
//     interface, then send gratuitous ARPs so that neighbours forget the
//     previous holder's hardware address;
//   - to give it up: remove the address, then delete the claim key.
//
// A host therefore carries the address only while its claim key exists,
// and the key of a host that stops talking to etcd lasts until its lease
// expires in etcd. The other half of the argument is local: the
// supervisor renews its lease with one keepalive at a time and notes when
// each was sent. etcd restarts the TTL when the keepalive arrives, so the
// lease cannot expire before send time + TTL: that is the local deadline.
// If no renewal succeeds by a margin (a fifth of the TTL) before the
// deadline, the supervisor removes the address by itself. By the time etcd
// expires the lease and another host can create the claim key, this host
// holds nothing, partition or not.
//
// On start, the supervisor removes the address if the interface carries
// it: it holds no claim yet, so a stale address left by a crashed run may
// be another host's by now.
//
// # Limits
//
// The argument assumes the supervisor runs: a supervisor that is itself
// stopped (SIGSTOP, a host frozen for longer than the margin) can neither
// renew nor remove. It is a small process that does nothing but this, and
// systemd restarts it (Restart=always). Clocks need not agree between
// hosts; only their rates must agree over one TTL, which the margin
// covers many times over. A lease revoked by hand in etcd deletes the
// claim at once; the holder notices on its next renewal or from its
// watch, not before.
//
// # Structure
//
// [Supervisor] runs one goroutine that owns the address and decides, and
// three helpers that report to it: the lease keeper, and followers of the
// election and of the claim key (a read, then a watch from the revision
// read, and a read again after each event and once per lease). The
// deciding goroutine makes no etcd request while the address is on the
// interface, so nothing it waits for can delay a removal. The host side is the small [Net]
// interface; [Netlink] implements it for one interface in one network
// namespace, which is how the tests run two "hosts" in one process.
//
// Events are slog lines with a "vip:" message prefix ("address claimed",
// "address released" with a reason); metrics are shoal_vip_holding,
// shoal_vip_claims_total, shoal_vip_releases_total{reason},
// shoal_vip_gratuitous_arps_total and shoal_vip_lease_renew_errors_total.
package vip
