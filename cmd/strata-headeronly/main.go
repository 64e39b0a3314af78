// Command strata-headeronly writes a header-only checkpoint for a
// config.json: real index and safetensors headers over sparse data, so
// benchmarks can export release-sized models using almost no disk.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/strata-llm/strata/internal/headeronly"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintf(os.Stderr, "strata-headeronly: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("strata-headeronly", flag.ContinueOnError)
	fl.SetOutput(stderr)
	config := fl.String("config", "", "config.json to write a checkpoint for")
	release := fl.String("release", "", "a shipped release directory (bench/configs/<name>): its config.json, sharded as released")
	out := fl.String("out", "", "output directory; existing files in it are never overwritten (required)")
	dt := fl.String("dtype", "BF16", "safetensors dtype of every tensor (with --config)")
	maxShard := fl.Int64("max-shard-bytes", 5_000_000_000, `most tensor bytes per shard (with --config); save_pretrained's "5GB" is 5e9`)
	if err := fl.Parse(args); err != nil {
		return err
	}
	if (*config == "") == (*release == "") || *out == "" || fl.NArg() > 0 {
		return errors.New("usage: strata-headeronly (--config PATH [--dtype BF16] [--max-shard-bytes N] | --release DIR) --out DIR")
	}
	var st headeronly.Stats
	if *release != "" {
		r, err := headeronly.LoadRelease(*release)
		if err != nil {
			return err
		}
		if st, err = headeronly.WriteRelease(*out, r); err != nil {
			return err
		}
	} else {
		data, err := os.ReadFile(*config)
		if err != nil {
			return err
		}
		tensors, err := headeronly.Tensors(data, *dt)
		if err != nil {
			return fmt.Errorf("%s: %w", *config, err)
		}
		if st, err = headeronly.Write(*out, data, tensors, *maxShard); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "%s: %d tensors in %d shards, %d bytes of tensor data (apparent %d bytes), %d header bytes\n",
		*out, st.Tensors, st.Shards, st.TensorBytes, st.ApparentBytes, st.HeaderBytes)
	return nil
}
