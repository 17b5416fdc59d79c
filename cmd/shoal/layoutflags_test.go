package main

import (
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/shoalfs/shoal/server"
)

// TestLayoutFlags: an export's own layout settings in the --config file
// win over --layout and --flex-stripe, which fill in the rest (and make
// the default export when the file has none).
func TestLayoutFlags(t *testing.T) {
	var file exportsFile
	if err := yaml.Unmarshal([]byte(`
exports:
  - path: /a
    layout: files
  - path: /b
    flex_stripe: "off"
`), &file); err != nil {
		t.Fatal(err)
	}
	l := layoutFlags{layout: server.LayoutFlexFiles, flexStripe: server.FlexStripeOn}
	got := l.apply(file.Exports)
	if got[0].Layout != server.LayoutFiles || got[0].FlexStripe != server.FlexStripeOn ||
		got[1].Layout != server.LayoutFlexFiles || got[1].FlexStripe != server.FlexStripeOff {
		t.Fatalf("exports %+v %+v", *got[0], *got[1])
	}
	if def := l.apply(nil); len(def) != 1 || def[0].Path != "/" || def[0].Layout != server.LayoutFlexFiles {
		t.Fatalf("default export %+v", def)
	}
	if none := (&layoutFlags{}).apply(nil); none != nil {
		t.Fatalf("no flags made exports %+v", none)
	}
}
