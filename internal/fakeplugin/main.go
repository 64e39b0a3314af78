// Command fakeplugin is a misbehaving strata plugin for the host's tests.
// Installed as strata-plugin-fake-<mode>, it claims model_type llama and:
//
//	crash-on-start  exits before the handshake
//	hang-on-start   never completes the handshake
//	stdout          prints to stdout before the handshake
//	crash-on-plan   dies in the middle of Plan
//	hang-on-plan    never answers Plan
//	protocol-2      claims plugin protocol 2 in Describe
//	refuse          says the checkpoint is unsupported, with a reason
//	no-layerwise    says llama cannot be exported layerwise (and fakearch can)
//	child-hang      starts a child that keeps the plugin's stdout open
//	                (its pid in child.pid beside the binary), never answers Plan
//	child-exit      the same child, then exits in the middle of Plan
//	child-setsid    starts a child in a session of its own (its pid in
//	                child.pid), then works as refuse does
//	child-setsid-hang the same child, then never answers Plan
//	hang-on-describe completes the handshake, never answers Describe
//	unrelated       claims model_type fakearch alone, and appends its pid
//	                to starts beside the binary at each start
//
// In the modes below it exports Llama as the llama plugin does, but for one
// mistake in the layer part it returns, which the host must refuse before
// writing anything:
//
//	weight-name     a node reads layer 0's checkpoint key of the q_proj
//	                weight instead of the function's formal input
//	context-typo    the layer's formal input "mask" is misspelt "msk"
//	no-cache-output the layer function lacks past_value_RetainedState
//	missing-tensor  the last layer binds its q_proj weight to a key the
//	                checkpoint lacks (found once the host assembles it)
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func main() {
	if runChild() {
		return
	}
	mode := strings.TrimPrefix(filepath.Base(os.Args[0]), "strata-plugin-fake-")
	switch mode {
	case "child-hang", "child-exit":
		startChild(false)
	case "child-setsid", "child-setsid-hang":
		startChild(true)
	case "unrelated":
		recordStart()
	case "hang-on-start":
		select {}
	case "crash-on-start":
		fmt.Fprintln(os.Stderr, "fake plugin: crashing on start")
		os.Exit(1)
	case "stdout":
		fmt.Println("hello from a plugin that writes to stdout")
	}
	sdk.Serve(fake{mode: mode})
}

type fake struct{ mode string }

// mistakes are the modes that export Llama with one mistake in the layer
// part, and the mistake.
var mistakes = map[string]func(*pb.BuildResponse){
	"weight-name":     readWeightName,
	"context-typo":    misspellInput("mask", "msk"),
	"no-cache-output": dropOutput("past_value" + sdk.RetainedSuffix),
	"missing-tensor":  bindMissing("self_attn.q_proj.weight"),
}

// llama is the llama plugin's architecture, which the mistake modes export.
var llama = decoder.Plugin{Name: "fake", Version: "0.0.1", Architectures: []decoder.Architecture{{
	ModelType: "llama", HFArchitectures: []string{"LlamaForCausalLM"}, Name: "Llama",
	Load: func(m *decoder.Model) error {
		m.Kind("decoder", "LlamaDecoderLayer", func(l *decoder.Layer) error {
			return l.PreNorm(&decoder.Attention{}, &decoder.SwiGLU{Width: m.Intermediate})
		})
		return nil
	},
}}}

// readWeightName makes the node reading the q_proj weight read the
// checkpoint key bound to it for the first layer: a weight's name passed
// where its value belongs.
func readWeightName(resp *pb.BuildResponse) {
	const formal = "self_attn.q_proj.weight"
	key := ""
	for _, b := range resp.GetWeights()[0].GetBindings() {
		if b.GetInput() == formal {
			key = b.GetKey()
		}
	}
	for _, n := range resp.GetFunction().GetNode() {
		for i, in := range n.GetInput() {
			if in == formal {
				n.Input[i] = key
				return
			}
		}
	}
}

// bindMissing binds the last layer's formal input to a key the checkpoint
// does not hold.
func bindMissing(formal string) func(*pb.BuildResponse) {
	return func(resp *pb.BuildResponse) {
		layers := resp.GetWeights()
		for _, b := range layers[len(layers)-1].GetBindings() {
			if b.GetInput() == formal {
				b.Key += ".missing"
			}
		}
	}
}

// misspellInput renames the formal input from, and its reads, to.
func misspellInput(from, to string) func(*pb.BuildResponse) {
	return func(resp *pb.BuildResponse) {
		f := resp.GetFunction()
		for i, in := range f.GetInput() {
			if in == from {
				f.Input[i] = to
			}
		}
		for _, n := range f.GetNode() {
			for i, in := range n.GetInput() {
				if in == from {
					n.Input[i] = to
				}
			}
		}
	}
}

// dropOutput removes the formal output name (the node computing it stays).
func dropOutput(name string) func(*pb.BuildResponse) {
	return func(resp *pb.BuildResponse) {
		f := resp.GetFunction()
		f.Output = slices.DeleteFunc(f.Output, func(o string) bool { return o == name })
	}
}

func (f fake) Describe(context.Context) (*pb.DescribeResponse, error) {
	protocol := int32(sdk.ProtocolVersion)
	if f.mode == "protocol-2" {
		protocol = 2
	}
	archs := []*pb.ArchitectureSupport{{ModelType: "llama", Capabilities: &pb.Capabilities{
		LayerwiseReason: "the fake plugin's layers cannot be cut apart"}}}
	switch f.mode {
	case "hang-on-describe":
		select {}
	case "unrelated":
		archs = []*pb.ArchitectureSupport{{ModelType: "fakearch", Capabilities: &pb.Capabilities{Layerwise: true}}}
	}
	if f.mode == "no-layerwise" {
		archs = append(archs, &pb.ArchitectureSupport{ModelType: "fakearch", Capabilities: &pb.Capabilities{Layerwise: true}})
	}
	return &pb.DescribeResponse{Name: "fake-" + f.mode, Version: "0.0.1", ProtocolVersion: protocol, Architectures: archs}, nil
}

func (f fake) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if mistakes[f.mode] != nil {
		return llama.Check(ctx, req)
	}
	if f.mode == "refuse" {
		return &pb.CheckResponse{Reasons: []string{"the fake plugin refuses every checkpoint"}}, nil
	}
	return &pb.CheckResponse{Supported: true}, nil
}

func (f fake) Plan(ctx context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	if mistakes[f.mode] != nil {
		return llama.Plan(ctx, req)
	}
	switch f.mode {
	case "crash-on-plan":
		os.Exit(7)
	case "hang-on-plan", "child-hang", "child-setsid-hang":
		select {} // never answers, whatever the host does
	case "child-exit":
		os.Exit(3)
	}
	return nil, fmt.Errorf("the fake plugin cannot plan")
}

func (f fake) Build(ctx context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error) {
	mistake := mistakes[f.mode]
	if mistake == nil {
		return nil, fmt.Errorf("the fake plugin cannot build")
	}
	resp, err := llama.Build(ctx, req)
	if err == nil && req.GetPart() == sdk.PartLayer {
		mistake(resp)
	}
	return resp, err
}
