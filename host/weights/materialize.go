package weights

import (
	"context"
	"fmt"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/sdk/dtype"
)

// entries are the materialised weights as safetensors entries, in first-use order.
func (t *Table) entries() []checkpoint.Entry {
	out := make([]checkpoint.Entry, len(t.order))
	for i, name := range t.order {
		w := t.weights[name]
		info, _ := dtype.Of(w.expr.Type.DType)
		out[i] = checkpoint.Entry{Name: name, DType: info.Safetensors, Shape: w.expr.Type.Shape}
	}
	return out
}

// Layout fixes, in materialize mode, where each weight's bytes will be in
// the data file, and records it in the initializers and the spec. Call it
// after the last Value; it writes nothing.
func (t *Table) Layout() error {
	if t.mode != Materialize || len(t.order) == 0 {
		return nil
	}
	l, err := checkpoint.Layout(t.entries())
	if err != nil {
		return err
	}
	file := t.addFile(File{Path: t.DataPath, Kind: KindMaterialized, Size: l.Size})
	for i, name := range t.order {
		t.inits[name].ExternalData = external(t.DataPath, l.Offsets[i], l.Sizes[i])
		t.weights[name].spec.Data = &Location{File: file, Offset: l.Offsets[i], Length: l.Sizes[i]}
	}
	return nil
}

// Materialize computes every weight in Go from the checkpoint's bytes and
// writes the data file (named name in messages) into sink, holding one
// weight (and its sources) in memory at a time. The file appears only when
// complete; a cancelled ctx stops it between weights.
func (t *Table) Materialize(ctx context.Context, name string, sink checkpoint.Sink) error {
	if t.mode != Materialize || len(t.order) == 0 {
		sink.Abort()
		return nil
	}
	w, err := checkpoint.NewWriter(name, checkpoint.CancelSink(ctx, sink), t.entries())
	if err != nil {
		return err
	}
	for _, name := range t.order {
		if err := ctx.Err(); err != nil {
			w.Abort()
			return err
		}
		data, err := evalContext(ctx, t.weights[name].expr, t.ckpt.ReadTensor)
		if err == nil {
			err = w.Write(data.Bytes)
		}
		if err != nil {
			w.Abort()
			return fmt.Errorf("materialising %s: %w", name, err)
		}
	}
	return w.Close()
}

// Materializing reports whether the table writes a data file.
func (t *Table) Materializing() bool { return t.mode == Materialize && len(t.order) > 0 }

// evalContext evaluates e, returning as soon as ctx is cancelled: one
// weight of a large model (an embedding cast to float32) can take many
// seconds. The abandoned evaluation only computes in memory and ends with
// the tensor; nothing is written from it.
func evalContext(ctx context.Context, e *transform.Expr, read transform.Reader) (transform.Data, error) {
	if err := ctx.Err(); err != nil {
		return transform.Data{}, err
	}
	type result struct {
		data transform.Data
		err  error
	}
	done := make(chan result, 1)
	go func() {
		d, err := e.Eval(read)
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		return r.data, r.err
	case <-ctx.Done():
		return transform.Data{}, ctx.Err()
	}
}
