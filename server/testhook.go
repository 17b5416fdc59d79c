package server

import (
	"os"
	"strings"
	"syscall"

	"github.com/shoalfs/shoal/internal/nfs4"
)

// DropReplyAfterEnv names the environment variable that makes a server
// die, as by kill -9, right after it carried out the first successful
// operation of the named kind (an operation name such as RENAME or
// REMOVE), before the reply leaves: the change is committed to the
// metadata, and the client never hears of it. It is for tests only
// (test/failover uses it to lose the reply of a RENAME at a known moment,
// which a real kill -9 hits only by chance); never set it anywhere else.
const DropReplyAfterEnv = "SHOAL_TEST_DROP_REPLY_AFTER"

// dropReplyAfter is the operation DropReplyAfterEnv names, or 0.
var dropReplyAfter = func() nfs4.NfsOpnum4 {
	name := os.Getenv(DropReplyAfterEnv)
	if name == "" {
		return 0
	}
	for op := nfs4.NfsOpnum4(3); op <= nfs4.OP_REMOVEXATTR; op++ {
		if strings.TrimPrefix(op.String(), "OP_") == name {
			return op
		}
	}
	return 0
}()

// testDropReply kills the process, with SIGKILL, if op is the operation
// DropReplyAfterEnv names and it succeeded.
func (s *Server) testDropReply(op nfs4.NfsOpnum4, st nfs4.Nfsstat4) {
	if op != dropReplyAfter || st != nfs4.NFS4_OK {
		return
	}
	s.log.Error("test hook: dying before the reply", "env", DropReplyAfterEnv, "op", op)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; wait for it
}
