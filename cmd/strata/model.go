package main

import (
	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/checkpoint"
)

// revisionFlag picks (each app gets its own flags: urfave/cli writes into
// them while parsing) the snapshot of a Hugging Face cache repository.
func revisionFlag() cli.Flag {
	return &cli.StringFlag{Name: "revision", Usage: "with a hub id or a Hugging Face cache repository: the snapshot of `REV`, a ref name or a commit hash (default: main); a commit may be abbreviated to 4 or more hex digits, as with git"}
}

// modelArgs is how commands name their MODEL argument in help.
const modelArgs = "MODEL"

// modelHelp explains what MODEL may be, for each command's description.
const modelHelp = `MODEL is a checkpoint directory (config.json and safetensors), a Hugging Face
cache repository directory (models--org--name: its refs/main snapshot, or
--revision), or a hub id (org/name) found in the local Hugging Face cache
($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub). strata never
downloads: fetch a model first with ` + "`hf download org/name`" + `.`

// locateModel resolves the MODEL argument to a checkpoint directory, saying
// on stderr which snapshot of the cache it took.
func locateModel(c *cli.Context, model string) (checkpoint.Location, error) {
	loc, err := checkpoint.Locate(model, c.String("revision"))
	if err != nil {
		return loc, err
	}
	if loc.FromCache() && loc.Dir != model {
		info(c, "%s: Hugging Face cache snapshot %s (revision %s) in %s", model, short(loc.Commit), loc.Revision, loc.Dir)
	}
	return loc, nil
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}
