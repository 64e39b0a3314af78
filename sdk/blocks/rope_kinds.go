package blocks

import (
	"fmt"
	"slices"
	"sync"

	"github.com/strata-llm/strata/sdk/hf"
)

// RoPEKind is one rope_type: how its parameters are read from config.json
// and how they make the inverse frequencies and the attention scaling, as
// transformers' ROPE_INIT_FUNCTIONS[rope_type] computes them. The SDK
// registers default, linear, llama3, yarn, longrope and mrope (Qwen2-VL's
// name for the default kind with an mrope_section); a plugin registers its
// own with RegisterRoPEKind, and RoPEFromConfig (and so every model's
// common config) then accepts it by name. A plugin is a process of its own:
// the table is the plugin's.
type RoPEKind struct {
	// Name is the rope_type config.json names.
	Name string
	// Read reads the kind's parameters from p into r, whose Type, Base,
	// Dim and MRoPESection are set and whose AttentionScaling is 1: what
	// InvFreq needs (in RoPE's fields or Params) and the attention scaling.
	// Errors name the field (p.Name + "." + key) and what it must be. Nil:
	// the kind has no parameters.
	Read func(r *RoPE, p RoPEParams) error
	// InvFreq is the [Dim/2] inverse-frequency table from pow[i] =
	// Base^(2i/Dim) (float32, as transformers' default kind computes it
	// before the reciprocal). Nil: 1/pow, the default kind's.
	InvFreq func(r RoPE, pow []float32) []float32
	// LongInvFreq, when set, is a second table for positions beyond
	// OriginalMaxPositions: the graph picks it per call when
	// max(position_ids) + 1 > OriginalMaxPositions (longrope's long
	// factors, as transformers' dynamic update does).
	LongInvFreq func(r RoPE, pow []float32) []float32
}

// RoPEParams is the object a kind reads its parameters from.
type RoPEParams struct {
	hf.Config        // rope_scaling, rope_parameters, or one of its per-layer-type objects
	Name      string // its name in errors: "rope_scaling", "rope_parameters.full_attention"
	// Top is the config object holding the rope settings
	// (max_position_embeddings, a top-level original_max_position_embeddings).
	Top hf.Config
}

var ropeKinds = struct {
	sync.RWMutex
	m map[string]RoPEKind
}{m: map[string]RoPEKind{}}

// RegisterRoPEKind adds a RoPE kind; call it from an init function or
// before sdk.Serve. A kind without a name or one already registered (the
// SDK's included) is a programming error and panics, naming it.
func RegisterRoPEKind(k RoPEKind) {
	if k.Name == "" {
		panic("blocks.RegisterRoPEKind: the kind has no Name (the rope_type config.json names)")
	}
	ropeKinds.Lock()
	defer ropeKinds.Unlock()
	if _, ok := ropeKinds.m[k.Name]; ok {
		panic(fmt.Sprintf("blocks.RegisterRoPEKind: RoPE kind %q is already registered; choose another name", k.Name))
	}
	ropeKinds.m[k.Name] = k
}

// RoPEKinds lists the registered kinds' names, sorted.
func RoPEKinds() []string {
	ropeKinds.RLock()
	defer ropeKinds.RUnlock()
	names := make([]string, 0, len(ropeKinds.m))
	for n := range ropeKinds.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func lookupRoPEKind(name string) (RoPEKind, bool) {
	ropeKinds.RLock()
	defer ropeKinds.RUnlock()
	k, ok := ropeKinds.m[name]
	return k, ok
}

// kind is r's kind ("" is default). A RoPE whose Type no kind has is a
// programming error (RoPEFromConfig refuses unknown types by name).
func (r RoPE) kind() RoPEKind {
	if r.Type == "" {
		return RoPEKind{Name: "default"}
	}
	k, ok := lookupRoPEKind(r.Type)
	if !ok {
		panic(fmt.Sprintf("blocks: RoPE type %q is not a registered kind (registered: %v); register it with blocks.RegisterRoPEKind", r.Type, RoPEKinds()))
	}
	return k
}

// The kinds transformers ships that the SDK computes.
func init() {
	RegisterRoPEKind(RoPEKind{Name: "default"})
	RegisterRoPEKind(RoPEKind{Name: "mrope", Read: func(r *RoPE, _ RoPEParams) error {
		// Qwen2-VL's legacy name of its multimodal default rope.
		r.Type = "default"
		if r.MRoPESection == nil {
			return fmt.Errorf("config.json: rope type \"mrope\" needs mrope_section")
		}
		return nil
	}})
	RegisterRoPEKind(RoPEKind{Name: "linear",
		Read: func(r *RoPE, p RoPEParams) (err error) {
			if r.Factor, err = p.Float("factor"); err != nil {
				return err
			}
			return positive(p.Name+".factor", r.Factor)
		},
		InvFreq: func(r RoPE, pow []float32) []float32 {
			inv := defaultInvFreq(pow)
			for i := range inv {
				inv[i] /= float32(r.Factor)
			}
			return inv
		}})
	RegisterRoPEKind(RoPEKind{Name: "llama3",
		Read: func(r *RoPE, p RoPEParams) error { return r.readLlama3(p.Config, p.Name) },
		InvFreq: func(r RoPE, pow []float32) []float32 {
			inv := defaultInvFreq(pow)
			r.llama3(inv)
			return inv
		}})
	RegisterRoPEKind(RoPEKind{Name: "yarn",
		Read:    func(r *RoPE, p RoPEParams) error { return r.readYarn(p.Config, p.Name, p.Top) },
		InvFreq: RoPE.yarn})
	RegisterRoPEKind(RoPEKind{Name: "longrope",
		Read:        func(r *RoPE, p RoPEParams) error { return r.readLongRoPE(p.Config, p.Name, p.Top) },
		InvFreq:     func(r RoPE, pow []float32) []float32 { return longrope(pow, r.ShortFactor) },
		LongInvFreq: func(r RoPE, pow []float32) []float32 { return longrope(pow, r.LongFactor) }})
}
