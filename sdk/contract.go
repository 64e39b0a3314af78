// Package sdk is what a strata architecture plugin imports: the plugin
// contract (protocol 1 of the gRPC service in sdk/proto/pluginv1), Serve for
// a plugin's main, and the names of parts and their inputs. Graph-building
// blocks live in sdk/fn, sdk/blocks, sdk/weight and sdk/decoder, config.json
// helpers in sdk/hf.
//
// A plugin's main is a few lines:
//
//	func main() { sdk.Serve(myArchitecture{}) }
package sdk

import (
	"context"

	"github.com/hashicorp/go-plugin"

	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// ProtocolVersion is the plugin protocol this SDK speaks. It changes only
// when the contract breaks; fields are added without changing it.
const ProtocolVersion = 1

// Version of the SDK, reported by plugins in Describe.
const Version = "0.2.0"

// Handshake is shared by host and plugins. The cookie only keeps a user from
// running a plugin by hand by mistake; it is not a security measure.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "STRATA_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "7d1c5a0e4b2f9a38c6e15d0b7a4f2c91e8d3b6a05f7c2e49d1a8b3c6e0f5a274",
}

// PluginName is the key of the architecture service in go-plugin's plugin set.
const PluginName = "architecture"

// MaxMessageBytes bounds gRPC messages both ways. Graphs and tensor
// inventories are small, but a 36k-tensor MoE inventory or a large layer
// function is past gRPC's 4 MiB default; an error beats an OOM kill.
const MaxMessageBytes = 256 << 20

// Architecture is what a plugin implements and what the host calls.
type Architecture interface {
	Describe(ctx context.Context) (*pb.DescribeResponse, error)
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
	Plan(ctx context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error)
	Build(ctx context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error)
}

// Parts a model is built from, in order.
const (
	PartEmbed   = "embed"   // input_ids -> hidden_states
	PartContext = "context" // position_ids, a cache -> shared values (RoPE tables, masks)
	PartLayer   = "layer"   // one decoder layer of a kind
	PartFinal   = "final"   // hidden_states, position_ids -> logits of the last valid token
)

// Formal input and output names of part functions with a meaning to the host.
// Any other formal input is a weight and must be bound.
const (
	InputIDs = "input_ids"
	// InputsEmbeds [batch_size, seq_len, hidden] replaces input_ids when the
	// plan asks for it (a vision model's embeddings merged by the caller).
	InputsEmbeds    = "inputs_embeds"
	PositionIDs     = "position_ids"
	HiddenStates    = "hidden_states"
	HiddenStatesOut = "hidden_states_out"
	Logits          = "logits"
	// BatchIndex [batch_size, 1] int64: each batch row's KV-cache row
	// (continuous batching).
	BatchIndex = "batch_index"
	// CompCtxLengths [comp_ctx_lengths] int64: its length is how many cache
	// rows attention reads (compute-context-length).
	CompCtxLengths = "comp_ctx_lengths"
	// RetainedSuffix makes a cache output's name from its input's: the
	// compiler pairs "past_key.3" with "past_key.3_RetainedState".
	RetainedSuffix = "_RetainedState"
)

// NonLayer is the LayerWeights.layer of bindings for parts other than layers.
const NonLayer = -1

// PartModel is a separate model of the plan's models (BuildRequest.model_name).
const PartModel = "model"

// TargetORT is the export target (ExportOptions.target, Capabilities.targets)
// of ONNX Runtime's form: its contrib ops and onnxruntime-genai's decoder IO.
const TargetORT = "ort"

// The rows of logits (ExportOptions.logits, --logits): every position, or
// each row's last valid token.
const (
	LogitsAll  = "all"
	LogitsLast = "last"
)

// AttentionMask is the graph input of --target ort, [batch_size,
// total_sequence_length] int64: 1 for the tokens so far, past and new.
const AttentionMask = "attention_mask"
