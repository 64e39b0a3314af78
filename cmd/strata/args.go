package main

import (
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/internal/suggest"
)

// interspersed moves a subcommand's flags ahead of its positional arguments,
// so `strata export MODEL --out DIR` works (urfave/cli v2 stops reading
// flags at the first positional argument), and global flags written after
// the subcommand (`strata export ... --plugin-dir D`) back before it.
// Everything after "--" stays put.
func interspersed(app *cli.App, args []string) []string {
	out := []string{args[0]}
	i := 1
	// Global flags up to the subcommand name.
	for i < len(args) && strings.HasPrefix(args[i], "-") {
		out = append(out, args[i])
		if takesValue(app.Flags, args[i]) && i+1 < len(args) {
			out = append(out, args[i+1])
			i++
		}
		i++
	}
	if i == len(args) {
		return out
	}
	cmd := app.Command(args[i])
	name := args[i]
	i++
	if cmd == nil {
		return append(append(out, name), args[i:]...)
	}
	var flags, positional []string
	taken := -1 // in flags, the last plugin option that took the next word as its value
	for ; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			positional = append(positional, args[i:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-" && isFlag(app.Flags, a) && !isFlag(cmd.Flags, a):
			out = append(out, a)
			if takesValue(app.Flags, a) && i+1 < len(args) {
				out = append(out, args[i+1])
				i++
			}
		case a == "--help" || a == "-h":
			flags = append(flags, a)
		case strings.HasPrefix(a, "--") && !isFlag(cmd.Flags, a) && isFlag(cmd.Flags, "--"+pluginOptionFlag):
			// A flag strata does not have is a plugin's option: --moe-strategy
			// dense is --plugin-option moe_strategy=dense. The plugin refuses
			// names it does not know.
			name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			key := strings.ReplaceAll(name, "-", "_")
			switch {
			case hasValue:
				flags = append(flags, "--"+pluginOptionFlag, key+"="+value)
			case i+1 < len(args) && !strings.HasPrefix(args[i+1], "--"):
				taken = len(flags) + 1
				flags = append(flags, "--"+pluginOptionFlag, key+"="+args[i+1])
				i++
			case nearFlag(cmd.Flags, name):
				flags = append(flags, a) // a typo: the parser refuses it, naming the flag
			default:
				// A bare option: true if the plugin declares it boolean
				// (--vision), else refused as needing a value.
				flags = append(flags, "--"+pluginOptionFlag, key)
			}
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			if takesValue(cmd.Flags, a) && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
		default:
			positional = append(positional, a)
		}
	}
	if key, value, _ := strings.Cut(at(flags, taken), "="); len(positional) == 0 && looksLikeModel(value) {
		// `--vision MODEL`: the word was MODEL, not the option's value
		// (every command with plugin options takes one MODEL).
		flags[taken], positional = key, []string{value}
	}
	out = append(out, name)
	return append(append(out, flags...), positional...)
}

func at(xs []string, i int) string {
	if i < 0 || i >= len(xs) {
		return ""
	}
	return xs[i]
}

// looksLikeModel reports whether a word is a MODEL rather than an option's
// value (dense, true, 2): a path that exists, or one with a slash (a hub
// id, a directory strata then reports missing).
func looksLikeModel(word string) bool {
	if word == "" {
		return false
	}
	_, err := os.Stat(word)
	return err == nil || strings.Contains(word, "/")
}

// nearFlag reports whether name is a likely typo of one of flags' names
// rather than a plugin option: one edit away, two for a long name
// (--layerwsie; but --vision is not --revision).
func nearFlag(flags []cli.Flag, name string) bool {
	limit := 1
	if len(name) >= 8 {
		limit = 2
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if len(n) > 1 && suggest.Distance(name, n) <= limit {
				return true
			}
		}
	}
	return false
}

// pluginOptionFlag passes an option to the plugin.
const pluginOptionFlag = "plugin-option"

// isFlag reports whether arg names one of flags.
func isFlag(flags []cli.Flag, arg string) bool {
	return lookup(flags, arg) != nil
}

func lookup(flags []cli.Flag, arg string) cli.Flag {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// takesValue reports whether arg names a flag that needs a separate value
// (not a boolean, not written --name=value).
func takesValue(flags []cli.Flag, arg string) bool {
	if strings.Contains(arg, "=") {
		return false
	}
	f := lookup(flags, arg)
	_, isBool := f.(*cli.BoolFlag)
	return f != nil && !isBool
}
