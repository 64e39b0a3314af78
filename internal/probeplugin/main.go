// Command probeplugin is a test plugin for the contract's optional parts:
// Llama with inputs_embeds instead of input_ids, the final hidden states
// as an extra output, and its embedding as a separate model ("embed":
// input_ids -> inputs_embeds). The conformance suite runs the two models
// one after the other against transformers' logits.
package main

import (
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func main() { sdk.Serve(plugin) }

var plugin = decoder.Plugin{Name: "probe", Version: "0.0.1", Architectures: []decoder.Architecture{{
	ModelType: "llama", HFArchitectures: []string{"LlamaForCausalLM"}, Name: "Probe", Load: load,
	Capabilities: &pb.Capabilities{Layerwise: true, Models: []string{"embed"}},
}}}

func load(m *decoder.Model) error {
	m.InputsEmbeds, m.OutputHidden = true, true
	m.Kind("decoder", "ProbeDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(&decoder.Attention{}, &decoder.SwiGLU{Width: m.Intermediate})
	})
	tokens := []*pb.Dim{decoder.DimParam("batch_size"), decoder.DimParam("seq_len")}
	m.AddModel(&pb.ModelSpec{Name: "embed",
		Inputs:  []*pb.IOSpec{{Name: sdk.InputIDs, Dtype: "int64", Shape: tokens}},
		Outputs: []*pb.IOSpec{{Name: sdk.InputsEmbeds, Dtype: "compute", Shape: append(tokens, decoder.DimSize(m.Hidden))}},
	}, func(f *fn.Func) (*pb.BuildResponse, error) {
		ids, table := f.Input(sdk.InputIDs), f.Input("embed_tokens.weight")
		f.Output(sdk.InputsEmbeds, blocks.Embedding(f, table, ids))
		return decoder.Response(f, &pb.LayerWeights{Layer: sdk.NonLayer, Bindings: []*pb.WeightBinding{
			{Input: "embed_tokens.weight", Key: m.Key("embed_tokens.weight")}}}), nil
	})
	return nil
}
