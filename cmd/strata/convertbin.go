package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/checkpoint"
)

func convertBinCommand() *cli.Command {
	return &cli.Command{
		Name:        "convert-bin",
		Usage:       "convert a PyTorch .bin checkpoint to safetensors (no code in the pickles runs; anything but tensors is refused)",
		ArgsUsage:   modelArgs,
		Description: modelHelp,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Aliases: []string{"o"}, Required: true, Usage: "`DIR` for the safetensors checkpoint (new, empty, or an earlier conversion)"},
			revisionFlag(),
			&cli.Float64Flag{Name: "max-amplification", Value: checkpoint.DefaultMaxAmplification, Usage: "write at most `FACTOR` times the bytes of a .bin file's storages (tensors sharing a storage are each written in full; a file over the bound is refused, naming it)"},
		},
		Action: func(c *cli.Context) error {
			model, err := oneArg(c, modelArgs)
			if err != nil {
				return err
			}
			out, err := outFlag(c)
			if err != nil {
				return err
			}
			loc, err := locateModel(c, model)
			if err != nil {
				return err
			}
			factor := c.Float64("max-amplification")
			if !(factor >= 1) { // NaN too
				return usageError{fmt.Sprintf("--max-amplification %v: give a factor of at least 1", factor)}
			}
			res, err := checkpoint.ConvertBinWith(c.Context, loc.Dir, out, checkpoint.BinOptions{MaxAmplification: factor})
			if err != nil {
				return err
			}
			reportConversion(c, res)
			return nil
		},
	}
}

func reportConversion(c *cli.Context, res *checkpoint.Converted) {
	w := c.App.Writer
	if c.Bool("json") || c.Path("stats") == "-" { // stdout holds JSON
		w = c.App.ErrWriter
	}
	if res.Reused {
		fmt.Fprintf(w, "reusing the safetensors conversion in %s (the .bin files are unchanged)\n", res.Dir)
		return
	}
	fmt.Fprintf(w, "converted %d tensors in %s from .bin to safetensors in %s\n", res.Tensors, plural(res.Shards, "shard"), res.Dir)
}

// openCheckpoint opens MODEL (a directory, a cache repository or a hub id),
// first converting a .bin checkpoint into binTo when given.
func openCheckpoint(c *cli.Context, model, binTo string) (*checkpoint.Checkpoint, checkpoint.Location, error) {
	loc, err := locateModel(c, model)
	if err != nil {
		return nil, loc, err
	}
	ckpt, err := openLocated(c, loc.Dir, binTo)
	return ckpt, loc, err
}

func openLocated(c *cli.Context, dir, binTo string) (*checkpoint.Checkpoint, error) {
	if checkpoint.IsBin(dir) {
		if binTo == "" {
			return nil, fmt.Errorf("%s is a PyTorch .bin checkpoint: pass --bin-to DIR to convert it to safetensors there once and export that (or run strata convert-bin first)", dir)
		}
		res, err := checkpoint.ConvertBin(c.Context, dir, binTo)
		if err != nil {
			return nil, err
		}
		reportConversion(c, res)
		dir = binTo
	}
	return checkpoint.Open(dir)
}
