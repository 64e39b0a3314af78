package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/export"
	"github.com/strata-llm/strata/host/weights"
)

func exportCommand() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "export a checkpoint to DIR/model.onnx and DIR/weight_spec.json, weights referenced in place",
		ArgsUsage: "MODEL_DIR",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Aliases: []string{"o"}, Required: true, Usage: "output `DIR` (created; may hold only an earlier strata export)"},
			&cli.StringFlag{Name: "dtype", Value: "float32", Usage: "compute dtype of the graph: float32 or float16 (weights are cast in-graph)"},
			&cli.StringFlag{Name: "link", Value: weights.LinkHard, Usage: "how DIR/checkpoint reaches the shards: " + strings.Join(weights.LinkModes, ", ")},
		},
		Action: func(c *cli.Context) error {
			dir, err := oneArg(c, "MODEL_DIR")
			if err != nil {
				return err
			}
			start := time.Now()
			ckpt, err := checkpoint.Open(dir)
			if err != nil {
				return err
			}
			reg := loadPlugins(c)
			defer reg.Close()
			p, err := reg.For(ckpt.ModelType)
			if err != nil {
				return err
			}
			res, err := export.Run(c.Context, p, ckpt, export.Options{
				Out: c.String("out"), ComputeDType: c.String("dtype"), Link: c.String("link"), Version: version,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "exported %s with plugin %s %s: %d layers, %s parameters, compute %s\n",
				ckpt.ModelType, p.Desc.GetName(), p.Desc.GetVersion(), len(res.Plan.GetLayers()), human(res.Parameters, ""), res.Spec.ComputeDType)
			fmt.Fprintf(c.App.Writer, "  %s (%s)\n  %s (%d weights in %s, %s into %s/)\n  in %s; read %s of the checkpoint (headers only)\n",
				res.ModelPath, human(int64(res.ModelBytes), "B"), res.SpecPath, len(res.Spec.Weights), plural(len(res.Spec.Files), "shard"),
				linkVerb(c.String("link")), weights.DataDir, time.Since(start).Round(time.Millisecond), human(ckpt.BytesRead, "B"))
			return nil
		},
	}
}

func linkVerb(mode string) string {
	switch mode {
	case weights.LinkCopy:
		return "copied"
	case weights.LinkSymlink:
		return "symlinked"
	default:
		return "hard-linked"
	}
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
