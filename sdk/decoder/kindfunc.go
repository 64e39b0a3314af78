package decoder

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/weight"
)

// NamedWeight is one formal weight input of a layer function and what it
// is bound to for one layer.
type NamedWeight struct {
	Input string
	Expr  weight.Expr
}

// KindFunction builds layer kind's function as Build does for the model's
// layers, with the weights it declares bound for the given layer. The layer
// may be any index, e.g. a multi-token-prediction layer stored after the
// last decoder layer, for a separate model (AddModel) that calls the
// function. The caller ships the function and its dependencies (Use).
func (m *Model) KindFunction(domain string, dt fn.DType, kind string, layer int32) (*fn.Func, []NamedWeight, error) {
	k, ok := m.kind(kind)
	if !ok {
		return nil, nil, fmt.Errorf("%s has layer kinds %s; asked for %q", m.arch.ModelType, m.kindNames(), kind)
	}
	l := newLayer(m, k, fn.NewFunc(domain, k.Function, dt))
	if err := k.Body(l); err != nil {
		return nil, nil, fmt.Errorf("layer kind %s: %w", k.Name, err)
	}
	if m.Err != nil {
		return nil, nil, m.Err
	}
	if !l.finished {
		return nil, nil, fmt.Errorf("layer kind %s: the body returned without declaring its outputs (call l.Output)", k.Name)
	}
	out := make([]NamedWeight, len(l.declared))
	for i, d := range l.declared {
		out[i] = NamedWeight{Input: d.input, Expr: d.bind(layer)}
	}
	return l.Func, out, nil
}
