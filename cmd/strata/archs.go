package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/plugins"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func archsCommand() *cli.Command {
	return &cli.Command{
		Name:      "archs",
		Usage:     "list the architecture plugins found, their versions and what they handle",
		ArgsUsage: " ",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return usageError{"archs takes no arguments"}
			}
			reg := loadPlugins(c)
			defer reg.Close()
			report := archsReportOf(reg)
			if c.Bool("json") {
				if err := emitJSON(c, report); err != nil {
					return err
				}
			} else {
				report.print(reportOut(c))
			}
			if len(report.Plugins) == 0 {
				return noPluginsError(report.SearchPath)
			}
			return nil
		},
	}
}

type archsReport struct {
	SearchPath []plugins.SearchDir `json:"search_path"`
	Plugins    []pluginReport      `json:"plugins"`
	// Skipped are files named like plugins that are not used (not executable…).
	Skipped []skippedPlugin `json:"skipped,omitempty"`
}

type pluginReport struct {
	Name          string       `json:"name"`
	Version       string       `json:"version,omitempty"`
	SDKVersion    string       `json:"sdk_version,omitempty"` // the SDK it was built with: informational
	Path          string       `json:"path"`
	FoundVia      string       `json:"found_via"`
	Error         string       `json:"error,omitempty"`
	Architectures []archReport `json:"architectures,omitempty"`
}

type archReport struct {
	ModelType       string             `json:"model_type"`
	HFArchitectures []string           `json:"hf_architectures"`
	Capabilities    *pb.Capabilities   `json:"capabilities"`
	Options         []*pb.PluginOption `json:"options,omitempty"`
	// ShadowedBy names the plugin that handles this model_type instead.
	ShadowedBy string `json:"shadowed_by,omitempty"`
}

func archsReportOf(reg *plugins.Registry) archsReport {
	r := archsReport{SearchPath: reg.Dirs, Plugins: []pluginReport{}, Skipped: skippedPlugins(reg.Dirs)}
	for _, p := range reg.Plugins {
		pr := pluginReport{Name: p.Name, Path: p.Path, FoundVia: p.Source}
		if p.Err != nil {
			pr.Error = p.Err.Error()
			r.Plugins = append(r.Plugins, pr)
			continue
		}
		pr.Name, pr.Version, pr.SDKVersion = p.Desc.GetName(), p.Desc.GetVersion(), p.Desc.GetSdkVersion()
		for _, a := range p.Desc.GetArchitectures() {
			ar := archReport{ModelType: a.GetModelType(), HFArchitectures: a.GetHfArchitectures(), Capabilities: a.GetCapabilities(),
				Options: a.GetOptions()}
			if winner, _ := reg.For(a.GetModelType()); winner != nil && winner != p {
				ar.ShadowedBy = winner.Path
			}
			pr.Architectures = append(pr.Architectures, ar)
		}
		r.Plugins = append(r.Plugins, pr)
	}
	return r
}

func (r archsReport) print(w io.Writer) {
	defer func() {
		for _, s := range r.Skipped {
			fmt.Fprintf(w, "%s (%s)\n  SKIPPED: %s\n", s.Path, s.FoundVia, s.Reason)
		}
	}()
	for _, p := range r.Plugins {
		if p.Error != "" {
			fmt.Fprintf(w, "%s  %s (%s)\n  FAILED: %s\n", p.Name, p.Path, p.FoundVia, p.Error)
			continue
		}
		sdkVersion := ""
		if p.SDKVersion != "" {
			sdkVersion = " (sdk " + p.SDKVersion + ")"
		}
		fmt.Fprintf(w, "%s %s%s  %s (%s)\n", p.Name, p.Version, sdkVersion, p.Path, p.FoundVia)
		for _, a := range p.Architectures {
			fmt.Fprintf(w, "  %-14s %-28s %s\n", a.ModelType, strings.Join(a.HFArchitectures, ","), capabilities(a.Capabilities))
			printOptions(w, "    ", a.Options)
			if a.ShadowedBy != "" {
				fmt.Fprintf(w, "  %-14s (not used: %s handles it, found first)\n", "", a.ShadowedBy)
			}
		}
	}
}

// noPluginsError is archs finding no plugin at all: an installation that
// cannot export anything, so it fails (exit 1) and says where it looked.
func noPluginsError(dirs []plugins.SearchDir) error {
	var b strings.Builder
	b.WriteString("no strata-plugin-* binaries found; looked in:")
	for _, d := range dirs {
		fmt.Fprintf(&b, "\n  %s (%s)", d.Dir, d.Source)
	}
	b.WriteString("\nbuild them beside strata (make build; go install github.com/strata-llm/strata/cmd/...@latest; pip install .)" +
		", or name their directory with --plugin-dir or " + plugins.EnvPath)
	return errors.New(b.String())
}

// printOptions lists plugin options as export takes them.
func printOptions(w io.Writer, indent string, opts []*pb.PluginOption) {
	for _, o := range opts {
		values := ""
		if len(o.GetAllowedValues()) > 0 {
			values = " " + strings.Join(o.GetAllowedValues(), "|")
		}
		fmt.Fprintf(w, "%s--%s%s (default %s): %s\n", indent, strings.ReplaceAll(o.GetName(), "_", "-"), values, o.GetDefaultValue(), o.GetHelp())
	}
}

func capabilities(c *pb.Capabilities) string {
	parts := []string{"layerwise: " + yesNo(c.GetLayerwise(), c.GetLayerwiseReason())}
	if len(c.GetExpertLayouts()) > 0 {
		parts = append(parts, "experts: "+strings.Join(c.GetExpertLayouts(), ","))
	}
	if len(c.GetQuantizedFormats()) > 0 {
		parts = append(parts, "quantized: "+strings.Join(c.GetQuantizedFormats(), ","))
	}
	if len(c.GetMtpConventions()) > 0 {
		parts = append(parts, "mtp: "+strings.Join(c.GetMtpConventions(), ","))
	}
	if c.GetVision() {
		parts = append(parts, "vision")
	}
	if len(c.GetModels()) > 0 {
		parts = append(parts, "models: "+strings.Join(c.GetModels(), ","))
	}
	if len(c.GetTargets()) > 0 {
		parts = append(parts, "targets: "+strings.Join(c.GetTargets(), ","))
	}
	return strings.Join(parts, "  ")
}

func yesNo(ok bool, why string) string {
	if ok {
		return "yes"
	}
	if why != "" {
		return "no (" + why + ")"
	}
	return "no"
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
