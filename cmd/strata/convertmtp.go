package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/convert"
	"github.com/strata-llm/strata/host/export"
	"github.com/strata-llm/strata/host/quant"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// pluginMTP asks the plugin of the checkpoint's model_type where the MTP
// weights are (its plan's MTPLayout): the architecture knows its
// conventions. Without a plugin that takes the model, or when its plan
// finds none, convert detects them itself (convert.DetectMTP) — either
// way no tensor is dropped, MTP or not. It says which on stderr.
func pluginMTP(c *cli.Context, dir string) []convert.MTPDescription {
	ckpt, err := checkpoint.Open(dir)
	if err != nil {
		return nil // convert reports what is wrong with the checkpoint
	}
	reg := loadPlugins(c)
	defer reg.Close()
	p, err := reg.For(ckpt.ModelType)
	if err != nil {
		return nil
	}
	q, err := quant.Read(ckpt)
	if err != nil {
		return nil // convert reports what it cannot read
	}
	model := export.Model(ckpt, q)
	check, err := p.Check(c.Context, model)
	if err != nil || !check.GetSupported() {
		return nil
	}
	plan, err := p.Plan(c.Context, &pb.PlanRequest{Model: model})
	// A separate file is found by convert itself, which sees file names.
	if err != nil || plan.GetMtp().GetConvention() == "" || plan.GetMtp().GetConvention() == convert.MTPSeparateFile {
		return nil
	}
	d := mtpDescription(plan.GetMtp())
	info(c, "MTP layout from plugin %s: %s", p.Desc.GetName(), describeMTP(d))
	return []convert.MTPDescription{d}
}

// mtpDescription turns a plan's MTPLayout into convert's description:
// inlined layers by index, indexed keys by their module prefix (never the
// bare "model", which would name the whole backbone).
func mtpDescription(l *pb.MTPLayout) convert.MTPDescription {
	d := convert.MTPDescription{Convention: l.GetConvention()}
	for _, i := range l.GetLayers() {
		d.Layers = append(d.Layers, int(i))
	}
	if d.Convention == convert.MTPIndexed {
		for _, k := range l.GetKeys() {
			prefix, _, _ := strings.Cut(k, ".")
			if prefix != "model" && !slices.Contains(d.Keys, prefix) {
				d.Keys = append(d.Keys, prefix)
			}
		}
	}
	return d
}

func describeMTP(d convert.MTPDescription) string {
	switch {
	case len(d.Layers) > 0:
		return fmt.Sprintf("%s, layers %v", d.Convention, d.Layers)
	case len(d.Keys) > 0:
		return fmt.Sprintf("%s, keys %s.*", d.Convention, strings.Join(d.Keys, ".*, "))
	}
	return d.Convention
}
