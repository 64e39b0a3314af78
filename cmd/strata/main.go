// Command strata exports Hugging Face LLM checkpoints to ONNX, weight-free,
// through out-of-process architecture plugins.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/internal/contain"
	"github.com/strata-llm/strata/internal/suggest"
	invocation "github.com/strata-llm/strata/internal/usage"
	"github.com/strata-llm/strata/sdk"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	contain.Main() // strata is also the shim that contains plugins and compilers
	tuneGC()
	// A write to a closed stdout pipe then fails with EPIPE, which run
	// reports, instead of the runtime killing strata by SIGPIPE before the
	// plugins are stopped. (Caught signals are not inherited by plugins.)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// checkedWriter is stdout, remembering the first write that failed (a
// closed pipe, a full disk): a command whose output was lost fails.
type checkedWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

func (c *checkedWriter) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	c.err = err
	return n, err
}

// failed is the error to report when stdout could not be written, or nil.
func (c *checkedWriter) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return nil
	}
	return fmt.Errorf("writing the output to stdout: %w (is the reader of the pipe gone, or the disk full?); the output is incomplete", c.err)
}

// run executes the CLI and returns the process exit code. Ctrl-C cancels the
// command's context, so plugins are stopped and partial outputs removed; a
// second Ctrl-C exits at once.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()

	out := &checkedWriter{w: stdout}
	app := newApp(out, stderr)
	var err error
	if completing(args) {
		err = app.RunContext(ctx, args)
	} else if err = refuseUnknownCommand(app, args); err == nil {
		err = requiredFlagHelp(app, args, app.RunContext(ctx, interspersed(app, args)))
	}
	if lost := out.failed(); lost != nil && (err == nil || errors.Is(err, out.err)) {
		err = lost
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "strata: interrupted; no complete output was written")
			return 130
		}
		fmt.Fprintf(stderr, "strata: error: %v\n", err)
		if isUsageError(err) {
			return 2
		}
		return 1
	}
	return 0
}

// Exit codes: 0 success, 1 failure, 2 usage error, 130 interrupted.
const exitHelp = `0 success; 1 the command failed; 2 usage error (unknown command or flag, missing
or invalid argument or flag value; nothing was done); 130 interrupted (Ctrl-C).`

// envHelp lists the environment variables strata reads.
const envHelp = `STRATA_PLUGIN_PATH  more directories of strata-plugin-* binaries, separated like PATH
                    (after --plugin-dir, before the strata executable's directory)
XDG_CONFIG_HOME     plugins are also found in $XDG_CONFIG_HOME/strata/plugins
                    (default ~/.config/strata/plugins)
XDG_CACHE_HOME      what each plugin binary handles is cached in $XDG_CACHE_HOME/strata/plugins
                    (default ~/.cache/strata/plugins; safe to remove)
HF_HUB_CACHE        the Hugging Face hub cache where a hub id MODEL is looked up
HF_HOME             without HF_HUB_CACHE, the cache is $HF_HOME/hub
                    (default ~/.cache/huggingface/hub)
Environment variables choose where things are found, never what an export produces.`

// isUsageError reports whether err is a mistake in how strata was called:
// ours, or urfave/cli's for a missing required flag.
func isUsageError(err error) bool {
	var cliUsage usageError
	var hostUsage invocation.Error
	if errors.As(err, &cliUsage) || errors.As(err, &hostUsage) {
		return true
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "Required flag") || strings.HasPrefix(msg, "Required flags") ||
		strings.HasPrefix(msg, "No help topic for") // strata help NOSUCH
}

// onUsageError turns urfave/cli's flag parsing errors (unknown flag, bad
// value) into usage errors, with the nearest flag when there is one.
func onUsageError(c *cli.Context, err error, _ bool) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		flags := c.App.Flags
		if c.Command != nil && c.Command.Name != "" {
			flags = append(append([]cli.Flag{}, c.Command.Flags...), c.App.Flags...)
		}
		name = strings.TrimLeft(name, "-")
		best, bestD := "", 3
		for _, f := range flags {
			for _, n := range f.Names() {
				if d := suggest.Distance(name, n); len(n) > 1 && d < bestD {
					best, bestD = n, d
				}
			}
		}
		if best != "" {
			msg += fmt.Sprintf(" (did you mean --%s?)", best)
		}
	}
	where := "strata --help"
	if c.Command != nil && c.Command.Name != "" && c.Command.Name != c.App.Name { // the root's name is the app's
		where = "strata " + c.Command.Name + " --help"
	}
	return usageError{msg + "; see " + where}
}

// commandWord is the index in args of the command's name, after the
// global flags, or -1 (none, or a flag urfave/cli refuses first).
func commandWord(app *cli.App, args []string) int {
	i := 1
	for i < len(args) && strings.HasPrefix(args[i], "-") {
		if !isFlag(app.Flags, args[i]) && args[i] != "--help" && args[i] != "-h" && args[i] != "--version" {
			return -1 // urfave/cli refuses it
		}
		if takesValue(app.Flags, args[i]) {
			i++
		}
		i++
	}
	if i >= len(args) {
		return -1
	}
	return i
}

// requiredFlagHelp points urfave/cli's "Required flag ... not set" at the
// command's help, as every other usage error does.
func requiredFlagHelp(app *cli.App, args []string, err error) error {
	if err == nil || !strings.HasPrefix(err.Error(), "Required flag") {
		return err
	}
	where := "strata --help"
	if i := commandWord(app, args); i > 0 && app.Command(args[i]) != nil {
		where = "strata " + args[i] + " --help"
	}
	return usageError{err.Error() + "; see " + where}
}

// refuseUnknownCommand refuses an unknown command, suggesting the nearest one.
func refuseUnknownCommand(app *cli.App, args []string) error {
	i := commandWord(app, args)
	if i < 0 {
		return nil
	}
	name := args[i]
	if app.Command(name) != nil || name == "help" || name == "h" { // urfave/cli adds help when it runs
		return nil
	}
	msg := fmt.Sprintf("unknown command %q", name)
	if near := nearestCommand(app, name); near != "" {
		msg += fmt.Sprintf(": did you mean %s?", near)
	}
	return usageError{msg + " (strata --help lists the commands)"}
}

// nearestCommand is the command name closest to name (edit distance at most
// 2, or a prefix), or "".
func nearestCommand(app *cli.App, name string) string {
	best, bestD := "", 3
	for _, c := range app.Commands {
		if c.Hidden {
			continue
		}
		for _, n := range c.Names() {
			d := suggest.Distance(name, n)
			if strings.HasPrefix(n, name) && len(name) >= 2 {
				d = min(d, 1)
			}
			if d < bestD {
				best, bestD = n, d
			}
		}
	}
	return best
}

func init() {
	// -v is --verbose here; --version keeps no short form.
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version, the Go version and the plugin protocol", DisableDefaultText: true}
	cli.HelpFlag = &cli.BoolFlag{Name: "help", Aliases: []string{"h"}, Usage: "show help", DisableDefaultText: true}
	cli.VersionPrinter = func(c *cli.Context) { printVersion(c.App.Writer) }
	printHelp := cli.HelpPrinter
	cli.HelpPrinter = func(w io.Writer, templ string, data any) {
		printHelp(w, templ, data)
		switch d := data.(type) {
		case *cli.App:
			fmt.Fprintf(w, "\nENVIRONMENT:\n%s\n\nEXIT STATUS:\n%s\n", indent(envHelp), indent(exitHelp))
		case *cli.Command:
			if d.Name == "export" || d.Name == "compile" {
				printPluginOptions(w)
			}
			if ex := examples[d.Name]; ex != "" {
				fmt.Fprintf(w, "\nEXAMPLES:\n%s\n", indent(ex))
			}
			if d.Name != "help" {
				fmt.Fprintf(w, "\nEXIT STATUS:\n%s\n", indent(exitHelp))
			}
		}
	}
}

func indent(s string) string { return "   " + strings.ReplaceAll(s, "\n", "\n   ") }

// printVersion is `strata version` and `strata --version`.
func printVersion(w io.Writer) {
	fmt.Fprintf(w, "strata %s\n%s %s/%s\nplugin protocol %d\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH, sdk.ProtocolVersion)
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:      "version",
		Usage:     "print strata's version, the Go version it was built with and the plugin protocol it speaks",
		ArgsUsage: " ",
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return usageError{"version takes no arguments"}
			}
			printVersion(c.App.Writer)
			return nil
		},
	}
}

// helpPluginDirs are the --plugin-dir flags, for help that lists the
// options of the plugins found.
var helpPluginDirs struct {
	sync.Mutex
	dirs []string
}

// printPluginOptions lists, under a command's help, the options each
// plugin found declares: the CLI knows no architecture's options itself.
func printPluginOptions(w io.Writer) {
	helpPluginDirs.Lock()
	dirs := helpPluginDirs.dirs
	helpPluginDirs.Unlock()
	reg := plugins.Load(context.Background(), plugins.SearchPath(dirs), plugins.Options{
		Timeout: 30 * time.Second, Logger: hclog.NewNullLogger()})
	defer reg.Close()
	fmt.Fprintln(w, "\nPLUGIN OPTIONS (--KEY VALUE, --KEY alone for a false|true option, or --plugin-option KEY=VALUE; from the plugins found):")
	n := 0
	defer func() {
		if n == 0 {
			fmt.Fprintln(w, "   none (no plugin found declares options; see strata archs)")
		}
	}()
	for _, p := range reg.Plugins {
		for _, a := range p.Desc.GetArchitectures() {
			if len(a.GetOptions()) > 0 {
				n++
				fmt.Fprintf(w, "   %s (plugin %s):\n", a.GetModelType(), p.Desc.GetName())
				printOptions(w, "     ", a.GetOptions())
			}
		}
	}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "strata",
		Usage:     "export Hugging Face LLM checkpoints to ONNX, layer by layer and weight-free",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		// Errors are printed by run; urfave/cli must not call os.Exit, which
		// would skip stopping plugins.
		ExitErrHandler: func(*cli.Context, error) {},
		Flags: append([]cli.Flag{
			&cli.StringSliceFlag{Name: "plugin-dir", Usage: "look for strata-plugin-* binaries in `DIR` first (repeatable)"},
			&cli.DurationFlag{Name: "plugin-timeout", Value: 2 * time.Minute, Usage: "give up on a plugin that does not start or answer a call within this long"},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "show the plugins' logs (go-plugin's [WARN]/[ERROR] lines with timestamps); without it only a plugin's panic is shown"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress, notes or summary of export, convert and compile (the reports of archs, inspect and check, errors, warnings and --json results still print)"},
		}, append(profileFlags(), statsFlag())...),
		OnUsageError: onUsageError,
		Before: func(c *cli.Context) error {
			helpPluginDirs.Lock()
			helpPluginDirs.dirs = c.StringSlice("plugin-dir")
			helpPluginDirs.Unlock()
			if err := checkPluginDirs(c.StringSlice("plugin-dir")); err != nil {
				return err
			}
			startStats(c)
			return startProfiles(c)
		},
		After: func(c *cli.Context) error {
			if err := stopProfiles(c); err != nil {
				return err
			}
			return writeStats(c)
		},
		Commands: []*cli.Command{archsCommand(), inspectCommand(), exportCommand(), compileCommand(), convertCommand(), convertBinCommand(), checkCommand(), versionCommand(),
			completionCommand(), manCommand()},
		EnableBashCompletion: true,
	}
	for _, cmd := range app.Commands {
		cmd.OnUsageError = onUsageError
		quietBools(cmd.Flags)
	}
	quietBools(app.Flags)
	return app
}

// quietBools drops urfave/cli's "(default: false)" after boolean flags.
func quietBools(flags []cli.Flag) {
	for _, f := range flags {
		if b, ok := f.(*cli.BoolFlag); ok {
			b.DisableDefaultText = true
		}
	}
}

// checkPluginDirs refuses a --plugin-dir that is not a directory.
func checkPluginDirs(dirs []string) error {
	for _, d := range dirs {
		info, err := os.Stat(d)
		switch {
		case err != nil:
			return usageError{fmt.Sprintf("--plugin-dir %s: %v", d, errors.Unwrap(err))}
		case !info.IsDir():
			return usageError{fmt.Sprintf("--plugin-dir %s: not a directory", d)}
		}
	}
	return nil
}

// usageError marks a mistake in how strata was called (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// loadPlugins discovers and starts the plugins; the caller must Close the registry.
func loadPlugins(c *cli.Context) *plugins.Registry {
	return announcePlugins(c, startPlugins(c))
}

// startPlugins finds the plugins and learns what each handles (from the
// describe cache, else by starting it); it prints nothing, so it may run
// beside other work (export opens the checkpoint meanwhile).
func startPlugins(c *cli.Context) *plugins.Registry {
	return plugins.Load(c.Context, plugins.SearchPath(c.StringSlice("plugin-dir")), plugins.Options{
		Timeout: c.Duration("plugin-timeout"),
		Logger:  pluginLogger(c.App.ErrWriter, c.Bool("verbose")),
		// Only archs starts every plugin; other commands start the one
		// they need, knowing the others from the describe cache.
		Lazy:     c.Command.Name != "archs",
		CacheDir: plugins.DefaultCacheDir(),
	})
}

// announcePlugins records the registry for --stats and warns of plugin
// files discovery passed over.
func announcePlugins(c *cli.Context, reg *plugins.Registry) *plugins.Registry {
	recordRegistry(c, reg)
	if c.Command.Name != "archs" { // archs lists them itself
		for _, s := range skippedPlugins(reg.Dirs) {
			fmt.Fprintf(c.App.ErrWriter, "strata: warning: %s: %s\n", s.Path, s.Reason)
		}
	}
	return reg
}

// skippedPlugin is a file named like a plugin that discovery passes over.
type skippedPlugin struct {
	Path     string `json:"path"`
	FoundVia string `json:"found_via"`
	Reason   string `json:"reason"`
}

// skippedPlugins lists the strata-plugin-* entries of dirs that are not
// executable regular files, so that none is skipped without a word.
func skippedPlugins(dirs []plugins.SearchDir) []skippedPlugin {
	var out []skippedPlugin
	for _, d := range dirs {
		entries, err := os.ReadDir(d.Dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := strings.TrimSuffix(e.Name(), ".exe")
			if !strings.HasPrefix(name, plugins.BinaryPrefix) || name == plugins.BinaryPrefix {
				continue
			}
			path := filepath.Join(d.Dir, e.Name())
			info, err := os.Stat(path)
			reason := ""
			switch {
			case err != nil:
				reason = fmt.Sprintf("named like a plugin but unreadable (%v); skipped", errors.Unwrap(err))
			case !info.Mode().IsRegular():
				reason = "named like a plugin but not a regular file; skipped"
			case info.Mode().Perm()&0o111 == 0:
				reason = "named like a plugin but not executable; skipped (chmod +x it to use it)"
			default:
				continue
			}
			out = append(out, skippedPlugin{Path: path, FoundVia: d.Source, Reason: reason})
		}
	}
	return out
}

// oneArg returns the command's single positional argument.
func oneArg(c *cli.Context, name string) (string, error) {
	if c.NArg() != 1 {
		return "", usageError{fmt.Sprintf("%s takes exactly one argument, %s (got %d)", c.Command.Name, name, c.NArg())}
	}
	return c.Args().First(), nil
}
