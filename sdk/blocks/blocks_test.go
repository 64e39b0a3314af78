package blocks

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/sdk/fn"
)

func TestBuildIsDeterministic(t *testing.T) {
	build := func() []byte {
		f := fn.NewFunc("d", "F", fn.Float16)
		x := f.Input("x")
		f.Output("y", RMSNorm(f, x, f.Input("w"), 1e-5))
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(f.Proto())
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if !slices.Equal(build(), build()) {
		t.Error("two builds of the same function differ")
	}
}
