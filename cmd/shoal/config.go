package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/shoalfs/shoal/server"
)

// The servers' configuration files (shoal serve, mds and ds --config FILE)
// are their command lines written down. Every flag of the command is a key,
// spelled with _ for - (--stripe-unit is stripe_unit, --log-level is
// log_level), and a few settings that no flag can express (exports) are
// keys of their own. One rule merges the two sources: a flag given on the
// command line wins over the file, and the file wins over the flag's
// default. So an operator can run the packaged configuration and still
// override one setting by hand, and a flag's --help text documents its key.
//
// Decoding is strict: an unknown key, or an unknown field inside exports,
// is an error that names its line, so a misspelt key never silently leaves
// a default in place.

// configFile is the decoded file: Keys receives the settings without a
// flag (a struct with yaml tags), Flags every other key. yaml.v3 only
// honours an inline map declared in the decoded struct itself, which is why
// this is a generic wrapper rather than something embedded in each
// command's struct.
type configFile[K any] struct {
	Keys  K                    `yaml:",inline"`
	Flags map[string]yaml.Node `yaml:",inline"`
}

// noConfigFlags are flags that make no sense in a file.
var noConfigFlags = map[string]bool{"config": true, "help": true}

// loadConfig reads the configuration file at path (none if path is ""),
// sets from it the flags of cmd that were not given on the command line,
// and returns the settings that have no flag. It runs at the start of the
// command's RunE, when cobra has parsed the command line.
func loadConfig[K any](cmd *cobra.Command, path string) (K, error) {
	var f configFile[K]
	if path == "" {
		return f.Keys, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return f.Keys, fmt.Errorf("read config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file
		return f.Keys, fmt.Errorf("config %s: %w", path, err)
	}
	keys := make([]string, 0, len(f.Flags))
	for k := range f.Flags {
		keys = append(keys, k)
	}
	// In file order, so that the first mistake is the one reported.
	slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(f.Flags[a].Line, f.Flags[b].Line) })
	fromFile := map[string]string{} // flag name → the key that set it
	for _, key := range keys {
		n := f.Flags[key]
		where := fmt.Sprintf("config %s line %d: %s", path, n.Line, key)
		fl := cmd.Flags().Lookup(strings.ReplaceAll(key, "_", "-"))
		if fl == nil || noConfigFlags[fl.Name] || strings.Contains(key, "-") {
			return f.Keys, fmt.Errorf("%s: unknown key; %s takes %s", where, cmd.CommandPath(), strings.Join(configKeys[K](cmd), ", "))
		}
		if n.Kind != yaml.ScalarNode {
			return f.Keys, fmt.Errorf("%s: want a single value, as for --%s", where, fl.Name)
		}
		if n.Tag == "!!null" { // "key:" with nothing after it: the default
			continue
		}
		// Two keys for one setting (an alias such as metrics for http, or
		// a flag whose name normalizes to another) are a contradiction
		// waiting to happen, even if they agree today.
		for name, other := range fromFile {
			if sameSetting(cmd.Flags().Lookup(name), fl) {
				return f.Keys, fmt.Errorf("%s: %s already sets --%s", where, other, fl.Name)
			}
		}
		fromFile[fl.Name] = key
		if fl.Deprecated != "" {
			slog.Warn("deprecated configuration key", "file", path, "line", n.Line, "key", key, "hint", fl.Deprecated)
		}
		if givenOnCommandLine(cmd, fl) {
			continue
		}
		// Value.Set rather than FlagSet.Set: Changed keeps meaning "given on
		// the command line".
		if err := fl.Value.Set(n.Value); err != nil {
			return f.Keys, fmt.Errorf("%s: %w", where, err)
		}
	}
	if _, ok := fromFile["log-level"]; ok {
		if err := setLogLevel(cmd.Flags().Lookup("log-level").Value.String()); err != nil {
			return f.Keys, fmt.Errorf("config %s: %w", path, err)
		}
	}
	return f.Keys, nil
}

// givenOnCommandLine reports whether fl, or another flag for the same
// setting, was given on the command line.
func givenOnCommandLine(cmd *cobra.Command, fl *pflag.Flag) bool {
	changed := false
	cmd.Flags().Visit(func(o *pflag.Flag) { changed = changed || sameSetting(o, fl) })
	return changed
}

// sameSetting reports whether two flags set the same variable: an alias is
// a second flag bound to the first one's variable, and pflag's values are
// pointers to the variables.
func sameSetting(a, b *pflag.Flag) bool {
	if a == b {
		return true
	}
	if !reflect.TypeOf(a.Value).Comparable() || !reflect.TypeOf(b.Value).Comparable() {
		return false
	}
	return a.Value == b.Value
}

// configKeys lists the keys cmd's configuration file takes, for the error
// about an unknown one.
func configKeys[K any](cmd *cobra.Command) []string {
	var keys []string
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if !noConfigFlags[fl.Name] && !fl.Hidden { // hidden: internal, or a deprecated alias
			keys = append(keys, strings.ReplaceAll(fl.Name, "-", "_"))
		}
	})
	t := reflect.TypeFor[K]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" {
			keys = append(keys, name)
		}
	}
	slices.Sort(keys)
	return keys
}

// exportsFile is the exports key of shoal serve's and shoal mds's
// configuration files: server.Export's fields, one list item per export.
type exportsFile struct {
	Exports []*server.Export `yaml:"exports"`
}

// squashExports applies --no-root-squash to the configured exports: with
// no exports configured it exports the whole namespace, and it turns root
// squashing off on every export, whatever the file said (the command line
// wins).
func squashExports(exports []*server.Export, noRootSquash bool) []*server.Export {
	if !noRootSquash {
		return exports
	}
	if len(exports) == 0 {
		exports = []*server.Export{{Path: "/"}}
	}
	off := false
	for _, e := range exports {
		e.RootSquash = &off
	}
	return exports
}
