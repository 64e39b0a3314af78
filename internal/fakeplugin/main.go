// Command fakeplugin is a misbehaving strata plugin for the host's tests.
// Installed as strata-plugin-fake-<mode>, it claims model_type llama and:
//
//	crash-on-start  exits before the handshake
//	stdout          prints to stdout before the handshake
//	crash-on-plan   dies in the middle of Plan
//	hang-on-plan    never answers Plan
//	protocol-2      claims plugin protocol 2 in Describe
//	refuse          says the checkpoint is unsupported, with a reason
//	no-layerwise    says llama cannot be exported layerwise (and fakearch can)
//	child-hang      starts a child that keeps the plugin's stdout open
//	                (its pid in child.pid beside the binary), never answers Plan
//	child-exit      the same child, then exits in the middle of Plan
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-llm/strata/sdk"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func main() {
	if runChild() {
		return
	}
	mode := strings.TrimPrefix(filepath.Base(os.Args[0]), "strata-plugin-fake-")
	switch mode {
	case "child-hang", "child-exit":
		startChild()
	case "crash-on-start":
		fmt.Fprintln(os.Stderr, "fake plugin: crashing on start")
		os.Exit(1)
	case "stdout":
		fmt.Println("hello from a plugin that writes to stdout")
	}
	sdk.Serve(fake{mode: mode})
}

type fake struct{ mode string }

func (f fake) Describe(context.Context) (*pb.DescribeResponse, error) {
	protocol := int32(sdk.ProtocolVersion)
	if f.mode == "protocol-2" {
		protocol = 2
	}
	archs := []*pb.ArchitectureSupport{{ModelType: "llama", Capabilities: &pb.Capabilities{
		LayerwiseReason: "the fake plugin's layers cannot be cut apart"}}}
	if f.mode == "no-layerwise" {
		archs = append(archs, &pb.ArchitectureSupport{ModelType: "fakearch", Capabilities: &pb.Capabilities{Layerwise: true}})
	}
	return &pb.DescribeResponse{Name: "fake-" + f.mode, Version: "0.0.1", ProtocolVersion: protocol, Architectures: archs}, nil
}

func (f fake) Check(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error) {
	if f.mode == "refuse" {
		return &pb.CheckResponse{Reasons: []string{"the fake plugin refuses every checkpoint"}}, nil
	}
	return &pb.CheckResponse{Supported: true}, nil
}

func (f fake) Plan(ctx context.Context, _ *pb.PlanRequest) (*pb.PlanResponse, error) {
	switch f.mode {
	case "crash-on-plan":
		os.Exit(7)
	case "hang-on-plan", "child-hang":
		select {} // never answers, whatever the host does
	case "child-exit":
		os.Exit(3)
	}
	return nil, fmt.Errorf("the fake plugin cannot plan")
}

func (f fake) Build(context.Context, *pb.BuildRequest) (*pb.BuildResponse, error) {
	return nil, fmt.Errorf("the fake plugin cannot build")
}
