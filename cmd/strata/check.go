package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/check"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:      "check",
		Usage:     "check an export directory as its loaders will: models parse (streamed), weight_spec.json is the one exported, each external-data reference is inside the directory, within its file and exactly the tensor its safetensors header and the spec name; and which loaders (ONNX Runtime, the onnx package) accept it",
		ArgsUsage: "EXPORT_DIR",
		Flags:     []cli.Flag{jsonFlag()},
		Action: func(c *cli.Context) error {
			dir, err := oneArg(c, "EXPORT_DIR")
			if err != nil {
				return err
			}
			r, err := check.Dir(dir)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if err := emitJSON(c, r); err != nil {
					return err
				}
			} else {
				r.Print(reportOut(c))
			}
			if r.Broken {
				return fmt.Errorf("the export in %s is broken: re-run the export into it with --overwrite (strata export MODEL --out %s --overwrite, with the export's other flags), which replaces the files strata wrote there even if they changed, and nothing else", dir, dir)
			}
			return nil
		},
	}
}
