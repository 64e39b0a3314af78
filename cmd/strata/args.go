package main

import (
	"strings"

	"github.com/urfave/cli/v2"
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
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				value, hasValue = args[i+1], true
				i++
			}
			if !hasValue {
				flags = append(flags, a) // left for the parser to refuse
				continue
			}
			flags = append(flags, "--"+pluginOptionFlag, strings.ReplaceAll(name, "-", "_")+"="+value)
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
	out = append(out, name)
	return append(append(out, flags...), positional...)
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
