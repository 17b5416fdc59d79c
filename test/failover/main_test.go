package failover

import (
	"fmt"
	"os"
	"testing"

	"github.com/shoalfs/shoal/internal/shoalbin"
)

// shoalBin is the shoal command TestMain built (or $SHOAL_BIN).
var shoalBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := shoalbin.Build("shoal-failover-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
	shoalBin = bin
	code := m.Run()
	cleanup()
	os.Exit(code)
}
