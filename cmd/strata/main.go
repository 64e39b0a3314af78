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
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/plugins"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(run(os.Args, os.Stdout, os.Stderr)) }

// run executes the CLI and returns the process exit code. Ctrl-C cancels the
// command's context, so plugins are stopped and partial outputs removed; a
// second Ctrl-C exits at once.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()

	app := newApp(stdout, stderr)
	if err := app.RunContext(ctx, interspersed(app, args)); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "strata: interrupted; no complete output was written")
			return 130
		}
		fmt.Fprintf(stderr, "strata: error: %v\n", err)
		var usage usageError
		if errors.As(err, &usage) {
			return 2
		}
		return 1
	}
	return 0
}

func init() {
	// -v is --verbose here; --version keeps no short form.
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version"}
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
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
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "show plugin logs"},
		}, append(profileFlags, statsFlag)...),
		Before: func(c *cli.Context) error {
			startStats(c)
			return startProfiles(c)
		},
		After: func(c *cli.Context) error {
			if err := stopProfiles(c); err != nil {
				return err
			}
			return writeStats(c)
		},
		Commands: []*cli.Command{archsCommand(), inspectCommand(), exportCommand(), compileCommand(), convertCommand(), convertBinCommand()},
	}
}

// usageError marks a mistake in how strata was called (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// loadPlugins discovers and starts the plugins; the caller must Close the registry.
func loadPlugins(c *cli.Context) *plugins.Registry {
	level := hclog.Warn
	if c.Bool("verbose") {
		level = hclog.Debug
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "plugin", Output: c.App.ErrWriter, Level: level})
	reg := plugins.Load(c.Context, plugins.SearchPath(c.StringSlice("plugin-dir")), plugins.Options{
		Timeout: c.Duration("plugin-timeout"),
		Logger:  logger,
	})
	recordRegistry(c, reg)
	return reg
}

// oneArg returns the command's single positional argument.
func oneArg(c *cli.Context, name string) (string, error) {
	if c.NArg() != 1 {
		return "", usageError{fmt.Sprintf("%s takes exactly one argument, %s (got %d)", c.Command.Name, name, c.NArg())}
	}
	return c.Args().First(), nil
}
