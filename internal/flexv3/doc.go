// Package flexv3 keeps the data of flexible files layouts (RFC 8435) on
// loosely coupled NFSv3 data servers: standard NFSv3 servers such as
// NFS-Ganesha, which know nothing of the metadata server (MDS).
//
// # What loose coupling means here
//
// A data server checks no stateids and asks the MDS nothing. It checks
// what every NFSv3 server checks: the AUTH_SYS uid and gid of each call
// against the data file's owner, group and mode. So the MDS (RFC 8435
// §2.2):
//
//   - creates each file's data files itself, one per mirror, each on a
//     different data server ([Store.Open] with create, over NFSv3 CREATE),
//     owned by a synthetic uid with a synthetic group and mode 0640: the
//     owner reads and writes, the group only reads;
//   - hands out layouts ([Store.Layout]) whose ffds_user/ffds_group are
//     those ids: the owner uid for a read/write layout, a read-only uid
//     that is not the owner (so it falls into the group) for a read
//     layout; ffds_stateid is the anonymous stateid, ffds_fh_vers the
//     data file's NFSv3 handle, and the device ([Store.DeviceAddr]) says
//     ffdv_version 3, ffdv_tightly_coupled false;
//   - fences a client whose layout it revokes by giving the data files a
//     fresh owner uid ([Store.Fence], NFSv3 SETATTR): the revoked
//     client's calls with the old uid then get NFS3ERR_ACCES or
//     NFS3ERR_PERM, and new layouts carry the new uid;
//   - removes and truncates the data files with the file (REMOVE,
//     SETATTR size), and does I/O that clients send to the MDS on them
//     ([Store] is a store.Backend: reads from the first mirror that
//     answers, writes to every mirror).
//
// The data file's owner is the record of its fencing generation: the MDS
// reads it back with GETATTR and keeps no table of its own, so an MDS
// restart or a second MDS sees the fence as it is.
//
// A copy a client reports failing (server.CopyFailer: LAYOUTERROR, or
// ff_ioerr4 in LAYOUTRETURN) is marked stale ([Store.MarkStale]) in the
// file's stripe map in the MDS's metadata, never the last good one;
// layouts and I/O through the MDS leave it out, and healing
// ([Store.Heal], [Store.RunHealer]) copies a good copy back under a
// fence. stale.go and heal.go say why and how.
//
// Sizes come from the MDS (clients send LAYOUTCOMMIT: the layout must not
// carry FF_FLAGS_NO_LAYOUTCOMMIT), never from the data files.
package flexv3
