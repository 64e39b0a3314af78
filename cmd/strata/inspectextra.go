package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
)

// expertsReport is how the checkpoint stores its MoE experts, read from its
// keys as the plugins tell the layouts apart.
type expertsReport struct {
	// Layout: per-expert (experts.{j}.*_proj), fused (experts.gate_up_proj
	// [E, …]), or mxfp4 (fused, *_blocks and *_scales).
	Layout string `json:"layout"`
	// Example is one expert tensor, with its stored shape.
	Example string  `json:"example"`
	Shape   []int64 `json:"shape"`
}

var (
	perExpertKey = regexp.MustCompile(`\.experts\.\d+\.`)
	fusedKey     = regexp.MustCompile(`\.experts\.(gate_up_proj|down_proj|gate_proj|up_proj)(_blocks|_scales|_bias)?(\.weight)?$`)
)

// detectExperts finds the expert layout of ckpt, or nil (no experts).
func detectExperts(ckpt *checkpoint.Checkpoint) *expertsReport {
	var fused, perExpert *expertsReport
	blocks := false
	for _, sh := range ckpt.Shards {
		for _, t := range sh.Tensors {
			switch {
			case fusedKey.MatchString(t.Key):
				blocks = blocks || strings.HasSuffix(t.Key, "_blocks")
				if fused == nil && !strings.HasSuffix(t.Key, "_bias") {
					fused = &expertsReport{Layout: "fused", Example: t.Key, Shape: t.Shape}
				}
			case perExpert == nil && perExpertKey.MatchString(t.Key):
				perExpert = &expertsReport{Layout: "per-expert", Example: t.Key, Shape: t.Shape}
			}
		}
	}
	switch {
	case fused == nil:
		return perExpert
	case blocks:
		fused.Layout = "mxfp4"
	case perExpert != nil:
		fused.Layout = "fused and per-expert (mixed)"
	}
	return fused
}

func (e *expertsReport) String() string {
	return fmt.Sprintf("%s (e.g. %s %v)", e.Layout, e.Example, e.Shape)
}
