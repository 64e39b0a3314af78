package convert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/quant"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/internal/testbin"
	"github.com/strata-llm/strata/sdk/dtype"
)

// quantFixtures are the committed quantised checkpoints
// (conformance/gen_quant.py): every format host/quant reads.
var quantFixtures = []string{
	"llama-fp8-block", "llama-fp8-block32", "qwen3moe-fp8-block",
	"llama-ct-fp8-channel", "llama-ct-fp8-tensor", "llama-ct-fp8-block", "llama-ct-fp8-dynamic",
	"llama-ct-w4a16-group", "llama-ct-w4a16-asym", "llama-ct-w8a16-channel", "qwen3moe-ct-w4a16",
	"llama-modelopt-nvfp4", "llama-modelopt-fp8",
}

func quantFixture(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join("..", "..", "conformance", "fixtures", name, "model")
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return dir
}

// readView reads a checkpoint's quantisation as host/quant does.
func readView(t *testing.T, dir string) (*checkpoint.Checkpoint, *quant.View) {
	t.Helper()
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := quant.Read(ck)
	if err != nil {
		t.Fatal(err)
	}
	return ck, v
}

// checkDequantised checks a --dtype conversion of a quantised source: each
// quantised weight is one tensor under its logical key, dtype dt, with the
// bytes of Eval of its View expression (rounded to dt); every other tensor
// is the source's, cast; no stored part survives; every part is accounted
// as consumed; the config and sidecars no longer describe a quantisation.
func checkDequantised(t *testing.T, src, out, dt string) {
	t.Helper()
	ck, view := readView(t, src)
	if !view.Quantized() {
		t.Fatalf("%s: not quantised", src)
	}
	o := readOutput(t, out)
	want := map[string]bool{}
	for _, w := range view.Weights() {
		want[w.Key] = true
		e, err := view.Typed(w)
		if err != nil {
			t.Fatal(err)
		}
		d, err := e.Eval(ck.ReadTensor)
		if err != nil {
			t.Fatal(err)
		}
		exp := d.Bytes
		if dt != "F32" {
			exp = encode(nil, dt, decode(nil, "F32", d.Bytes))
		}
		got, ok := o.tensors[w.Key]
		if !ok || got.dtype != dt || !slices.Equal(got.shape, w.Shape) {
			t.Errorf("%s: %v %s %v, want %s %v", w.Key, ok, got.dtype, got.shape, dt, w.Shape)
			continue
		}
		if !bytes.Equal(got.data, exp) {
			t.Errorf("%s: not the bits of Eval(%s) (%s)", w.Key, e, firstDiff(got, tensor{dt, w.Shape, exp}))
		}
	}
	for _, k := range ck.Keys() {
		if view.Stored(k) {
			if _, ok := o.tensors[k]; ok {
				t.Errorf("stored part %s was written", k)
			}
			continue
		}
		if want[k] {
			continue
		}
		want[k] = true
		st, _ := ck.Tensor(k)
		raw, _ := ck.ReadTensor(k)
		if got := o.tensors[k]; got.dtype != dt || !bytes.Equal(got.data, encode(nil, dt, decode(nil, st.DType, raw))) {
			t.Errorf("%s: %s, not the source cast to %s", k, got.dtype, dt)
		}
	}
	for k, tt := range o.tensors {
		if !want[k] {
			t.Errorf("unexpected output %s", k)
		}
		if !isFloat(tt.dtype) || strings.Contains(k, "_scale") || strings.Contains(k, "_packed") || strings.Contains(k, "zero_point") {
			t.Errorf("output %s (%s) looks quantised", k, tt.dtype)
		}
	}
	if _, ok := o.config["quantization_config"]; ok {
		t.Error("quantization_config survived dequantisation")
	}
	if _, err := os.Stat(filepath.Join(out, quant.ModelOptFile)); err == nil {
		t.Errorf("%s copied to a dequantised output", quant.ModelOptFile)
	}
	dequantized := 0
	for _, a := range o.report.Tensors {
		switch {
		case view.Stored(a.Key) && a.Action != "dropped" && a.Action != "dequantized",
			a.Action == "dropped" && a.Reason == "":
			t.Errorf("%s: %s (%s)", a.Key, a.Action, a.Reason)
		case a.Action == "dequantized":
			dequantized++
			if len(a.Outputs) != 1 || !want[a.Outputs[0]] {
				t.Errorf("%s dequantised into %v", a.Key, a.Outputs)
			}
		}
	}
	sq := o.report.SourceQuantization
	if dequantized != len(view.Weights()) || sq == nil || sq.Weights != dequantized || sq.Method != view.Method {
		t.Errorf("report: %d dequantised, source %+v; want %d", dequantized, sq, len(view.Weights()))
	}
	if _, v := readView(t, out); v.Quantized() || v.Method != "" {
		t.Errorf("the output still reads as quantised (%s)", v.Method)
	}
}

func firstDiff(a, b tensor) string {
	x, y := floats(a), floats(b)
	for i := range min(len(x), len(y)) {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			return fmt.Sprintf("element %d: %g, want %g", i, x[i], y[i])
		}
	}
	return fmt.Sprintf("%d elements, want %d", len(x), len(y))
}

// Every format host/quant reads is dequantised by convert to the bits of the
// View's expression: the FP8 ones by the streaming FP8 kernel, the others by
// Eval.
func TestQuantisedFixturesDequantiseToTheViewsBits(t *testing.T) {
	for _, name := range quantFixtures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			src := quantFixture(t, name)
			out := filepath.Join(t.TempDir(), "out")
			res := run(t, src, out, Options{DType: "float32", Jobs: 2})
			checkDequantised(t, src, out, "F32")
			o := readOutput(t, out)
			if o.config["dtype"] != "float32" {
				t.Errorf("config dtype %v", o.config["dtype"])
			}
			if res.Dropped == 0 {
				t.Error("no stored part reported dropped")
			}
		})
	}
}

func TestQuantisedSourceCastToBF16(t *testing.T) {
	for _, name := range []string{"llama-fp8-block32", "llama-ct-w4a16-asym", "llama-modelopt-nvfp4"} {
		t.Run(name, func(t *testing.T) {
			src := quantFixture(t, name)
			out := filepath.Join(t.TempDir(), "out")
			run(t, src, out, Options{DType: "bfloat16"})
			checkDequantised(t, src, out, "BF16")
		})
	}
}

// Without --dtype and --quantize a quantised source is carried as stored,
// its quantisation config and sidecars with it.
func TestQuantisedSourceCarriedAsStored(t *testing.T) {
	for _, name := range []string{"llama-ct-w4a16-asym", "llama-modelopt-nvfp4"} {
		t.Run(name, func(t *testing.T) {
			src := quantFixture(t, name)
			out := filepath.Join(t.TempDir(), "out")
			run(t, src, out, Options{})
			o := readOutput(t, out)
			ck, _ := readView(t, src)
			if len(o.tensors) != len(ck.Keys()) {
				t.Errorf("%d tensors, the source has %d", len(o.tensors), len(ck.Keys()))
			}
			for _, k := range ck.Keys() {
				raw, _ := ck.ReadTensor(k)
				if !bytes.Equal(o.tensors[k].data, raw) {
					t.Errorf("%s not carried byte for byte", k)
				}
			}
			if o.quantConfig()["quant_method"] == nil {
				t.Error("quantization_config dropped")
			}
			if _, err := os.Stat(filepath.Join(src, quant.ModelOptFile)); err == nil {
				if _, err := os.Stat(filepath.Join(out, quant.ModelOptFile)); err != nil {
					t.Errorf("%s not carried", quant.ModelOptFile)
				}
			}
		})
	}
}

// Re-quantising a quantised source dequantises it first: the outputs are
// the quantiser's over Eval's values, and the config is ours alone.
func TestQuantisedSourceRequantised(t *testing.T) {
	for _, name := range []string{"llama-ct-w4a16-group", "llama-fp8-block32", "llama-modelopt-nvfp4"} {
		for _, scheme := range []string{QuantFP8Block, QuantFP8Dynamic} {
			t.Run(name+"/"+scheme, func(t *testing.T) {
				src := quantFixture(t, name)
				ck, view := readView(t, src)
				out := filepath.Join(t.TempDir(), "out")
				run(t, src, out, Options{Quantize: scheme})
				o := readOutput(t, out)
				qc := o.quantConfig()
				if scheme == QuantFP8Block && (qc["quant_method"] != "fp8" || fmt.Sprint(qc["weight_block_size"]) != "[128 128]") ||
					scheme == QuantFP8Dynamic && (qc["quant_method"] != "compressed-tensors" || qc["format"] != "float-quantized") {
					t.Errorf("quantization_config %v", qc)
				}
				if _, err := os.Stat(filepath.Join(out, quant.ModelOptFile)); err == nil {
					t.Errorf("%s copied", quant.ModelOptFile)
				}
				want := map[string]bool{}
				for _, w := range view.Weights() {
					e, err := view.Typed(w)
					if err != nil {
						t.Fatal(err)
					}
					d, err := e.Eval(ck.ReadTensor)
					if err != nil {
						t.Fatal(err)
					}
					vals := decode(nil, "F32", d.Bytes)
					rows, cols := w.Shape[0], w.Shape[1]
					got := o.tensors[w.Key]
					if got.dtype != "F8_E4M3" {
						t.Fatalf("%s: %s, not re-quantised", w.Key, got.dtype)
					}
					codes := make([]byte, len(vals))
					if scheme == QuantFP8Block {
						inv := quantBlockRows(vals, codes, cols, nil)
						sc := o.tensors[w.Key+"_scale_inv"]
						if !bytes.Equal(got.data, codes) || !bytes.Equal(sc.data, encode(nil, "F32", inv)) {
							t.Errorf("%s: not fp8-block of the dequantised weight", w.Key)
						}
						want[w.Key], want[w.Key+"_scale_inv"] = true, true
						continue
					}
					var scales []float32
					for r := range rows {
						s := roundTo("BF16", amaxBits(vals, cols, r, r+1, 0, cols)/fp8Max)
						if s == 0 {
							s = 1
						}
						scales = append(scales, s)
						encodeDivided(codes[r*cols:(r+1)*cols], vals[r*cols:(r+1)*cols], s)
					}
					scale := strings.TrimSuffix(w.Key, "weight") + "weight_scale"
					sc := o.tensors[scale]
					if !bytes.Equal(got.data, codes) || sc.dtype != "BF16" || !bytes.Equal(sc.data, encode(nil, "BF16", scales)) {
						t.Errorf("%s: not fp8-dynamic of the dequantised weight", w.Key)
					}
					want[w.Key], want[scale] = true, true
				}
				for _, k := range ck.Keys() {
					if !view.Stored(k) {
						if _, q := view.Weight(k); !q {
							want[k] = true
						}
					}
				}
				for k := range o.tensors {
					if !want[k] {
						t.Errorf("unexpected output %s", k)
					}
				}
				if len(o.tensors) != len(want) {
					t.Errorf("%d outputs, want %d", len(o.tensors), len(want))
				}
			})
		}
	}
}

// fp8Model is a checkpoint whose layer 0 holds FP8 weights the FP8 kernel
// streams, in the shapes host/quant gives them: a fused [E, R, C] expert
// tensor with partial blocks over several chunks (fine-grained FP8), a
// per-channel BF16 scale (compressed-tensors), an F16 per-tensor scale and
// E5M2 values, a per-tensor scale with activation and KV-cache scales and
// a per-channel [out] scale the View reshapes (ModelOpt); every code, NaNs
// included.
func fp8Model(t *testing.T, kind string) string {
	m := llamaModel(21, 1, "BF16")
	ts := m.shards["model.safetensors"]
	rng := rand.New(rand.NewPCG(21, 21))
	codes := func(n int64, e5m2 bool) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.IntN(256))
			if !e5m2 && b[i]&0x7f == 0x7f && rng.IntN(50) != 0 { // keep a few NaNs
				b[i] ^= 1
			}
		}
		return b
	}
	scales := func(dt string, n int64) []byte {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.Ldexp(rng.Float64()+0.5, -rng.IntN(12)))
		}
		return encode(nil, dt, v)
	}
	switch kind {
	case "fine-grained":
		const e, r, c = 2, 2100, 1030 // > 16 MB of float32: several chunks; blocks 128×128, partial at both edges
		ts["model.layers.0.mlp.experts.gate_up_proj"] = tensor{"F8_E4M3", []int64{e, r, c}, codes(e*r*c, false)}
		ts["model.layers.0.mlp.experts.gate_up_proj_scale_inv"] = tensor{"BF16", []int64{e, 17, 9}, scales("BF16", e*17*9)}
		ts["model.layers.0.mlp.down_proj.weight"] = tensor{"F8_E4M3", []int64{64, 160}, codes(64*160, false)}
		ts["model.layers.0.mlp.down_proj.weight_scale_inv"] = tensor{"F32", []int64{1, 2}, scales("F32", 2)}
		m.config["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": []int{128, 128}}
	case "ct":
		ts["model.layers.0.mlp.down_proj.weight"] = tensor{"F8_E4M3", []int64{64, 160}, codes(64*160, false)}
		ts["model.layers.0.mlp.down_proj.weight_scale"] = tensor{"BF16", []int64{64, 1}, scales("BF16", 64)}
		ts["model.layers.0.mlp.up_proj.weight"] = tensor{"F8_E5M2", []int64{160, 64}, codes(160*64, true)}
		ts["model.layers.0.mlp.up_proj.weight_scale"] = tensor{"F16", []int64{1}, scales("F16", 1)}
		m.config["quantization_config"] = map[string]any{"quant_method": "compressed-tensors", "format": "float-quantized",
			"config_groups": map[string]any{
				"channel": map[string]any{"targets": []string{"re:.*down_proj"}, "weights": map[string]any{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel"}},
				"tensor":  map[string]any{"targets": []string{"re:.*up_proj"}, "weights": map[string]any{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "tensor"}},
			}}
	case "modelopt":
		ts["model.layers.0.mlp.down_proj.weight"] = tensor{"F8_E4M3", []int64{64, 160}, codes(64*160, false)}
		ts["model.layers.0.mlp.down_proj.weight_scale"] = tensor{"F32", []int64{}, scales("F32", 1)}
		ts["model.layers.0.mlp.up_proj.weight"] = tensor{"F8_E4M3", []int64{160, 64}, codes(160*64, false)}
		ts["model.layers.0.mlp.up_proj.weight_scale"] = tensor{"F32", []int64{160}, scales("F32", 160)} // per channel, reshaped by the View
		ts["model.layers.0.mlp.down_proj.input_scale"] = tensor{"F32", []int64{}, scales("F32", 1)}
		ts["model.layers.0.self_attn.k_scale"] = tensor{"F32", []int64{}, scales("F32", 1)}
		m.config["quantization_config"] = map[string]any{"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
	}
	return m.write(t, t.TempDir())
}

// The FP8 kernel gives Eval's bits on every FP8 form the View produces
// (where the fixtures are too small to reach chunk boundaries, partial
// blocks of fused experts, non-F32 scales, E5M2 or NaN codes).
func TestFP8KernelGivesTheViewsBits(t *testing.T) {
	for _, kind := range []string{"fine-grained", "ct", "modelopt"} {
		t.Run(kind, func(t *testing.T) {
			src := fp8Model(t, kind)
			p := planOf(t, src, Options{DType: "float32"})
			streamed := 0
			for _, g := range p.groups {
				if g.Kind == kindFP8 {
					streamed++
				}
				if g.Kind == kindDequant {
					t.Errorf("%s computed by Eval, not streamed", g.Outputs[0].Name)
				}
			}
			if streamed == 0 {
				t.Fatal("no FP8 weight streamed")
			}
			out := filepath.Join(t.TempDir(), "out")
			run(t, src, out, Options{DType: "float32"})
			checkDequantised(t, src, out, "F32")
		})
	}
}

// ModelOpt's per-channel [out] scale reaches the kernel reshaped to
// [out, 1] (host/quant's expression for it, built here by hand).
func TestFP8KernelReadsAReshapedScale(t *testing.T) {
	m := llamaModel(22, 1, "BF16")
	rng := rand.New(rand.NewPCG(22, 22))
	codes := make([]byte, 64*160)
	for i := range codes {
		codes[i] = byte(rng.IntN(256))
	}
	scale := make([]float32, 64)
	for i := range scale {
		scale[i] = float32(rng.Float64() + 0.01)
	}
	ts := m.shards["model.safetensors"]
	ts["w"] = tensor{"F8_E4M3", []int64{64, 160}, codes}
	ts["s"] = tensor{"F32", []int64{64}, encode(nil, "F32", scale)}
	inv, err := openInventory(m.write(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	e := &transform.Expr{Op: transform.OpDequant, Ints: []int64{1, 160}, Args: []*transform.Expr{transform.Leaf("w"),
		{Op: transform.OpReshape, Ints: []int64{64, 1}, Args: []*transform.Expr{transform.Leaf("s")}}}}
	if err := e.Infer(func(k string) (transform.Type, error) { return typeOf(inv.tensors[k]), nil }); err != nil {
		t.Fatal(err)
	}
	want, err := e.Eval(inv.read)
	if err != nil {
		t.Fatal(err)
	}
	p := &plan{inv: inv}
	sc, shape, bm, bn, ok := p.plainFP8(e)
	if !ok || !slices.Equal(shape, []int64{64, 1}) || bm != 1 || bn != 160 {
		t.Fatalf("plainFP8: %v %v %d×%d", ok, shape, bm, bn)
	}
	g := &group{Kind: kindFP8, src: inv.tensors["w"], scale: sc, scaleShape: shape, blockRows: bm, blockCols: bn, outDT: "F32"}
	var buf bytes.Buffer
	if err := streamTo(g, &buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want.Bytes) {
		t.Error("the kernel's bits differ from Eval's")
	}
}

func typeOf(s *source) transform.Type {
	info, _ := dtype.FromSafetensors(s.DType)
	return transform.Type{DType: info.ONNX, Shape: s.Shape}
}

// streamTo runs a group into buf, through a temporary file.
func streamTo(g *group, buf *bytes.Buffer) error {
	f, err := os.CreateTemp("", "convert-test-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	var n atomic.Int64
	if err := runGroup(context.Background(), g, &countingWriter{f: f, n: &n}); err != nil {
		return err
	}
	data, err := os.ReadFile(f.Name())
	buf.Write(data)
	return err
}

// What host/quant refuses, convert refuses when dequantising — with
// host/quant's message, before writing anything — and carries as stored
// otherwise.
func TestQuantisedSourceRefusals(t *testing.T) {
	static := llamaModel(31, 2, "BF16")
	fp8Source(static)
	static.shards["model.safetensors"]["model.layers.0.mlp.up_proj.input_scale"] = tensor{"F32", []int64{}, encode(nil, "F32", []float32{0.5})}

	withConfig := func(name string, edit func(qc map[string]any)) string {
		return editedFixture(t, name, func(cfg map[string]any) { edit(cfg["quantization_config"].(map[string]any)) })
	}
	cases := []struct {
		name, src, want string
	}{
		{"static activation scale", static.write(t, t.TempDir()), "is a static activation scale"},
		{"unsupported method", withConfig("llama-ct-w4a16-group", func(qc map[string]any) { qc["quant_method"] = "gptq" }), `quant_method "gptq" is not supported`},
		{"strategy", withConfig("llama-ct-w4a16-group", func(qc map[string]any) {
			g := qc["config_groups"].(map[string]any)["group_0"].(map[string]any)
			g["weights"].(map[string]any)["actorder"] = "group"
		}), `actorder "group"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := testbin.HashTree(t, tc.src)
			for _, opts := range []Options{{DType: "bfloat16"}, {Quantize: QuantFP8Block}} {
				out := filepath.Join(t.TempDir(), "out")
				_, err := Convert(context.Background(), tc.src, out, opts)
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "cannot dequantise") {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				if _, err := os.Stat(out); err == nil {
					t.Error("the output directory was created")
				}
			}
			run(t, tc.src, filepath.Join(t.TempDir(), "stored"), Options{}) // carried as stored
			if !mapsEqual(testbin.HashTree(t, tc.src), before) {
				t.Error("source modified")
			}
		})
	}
}

// Static activation quantisation, which an export refuses, does not stop a
// conversion to float weights: the weights are all a float checkpoint holds.
func TestStaticActivationsDequantiseToFloat(t *testing.T) {
	dir := editedFixture(t, "llama-ct-fp8-channel", func(cfg map[string]any) {
		g := cfg["quantization_config"].(map[string]any)["config_groups"].(map[string]any)["group_0"].(map[string]any)
		g["input_activations"] = map[string]any{"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false}
	})
	run(t, dir, filepath.Join(t.TempDir(), "out"), Options{DType: "float32"})
}

// planOf is the conversion plan of src.
func planOf(t *testing.T, src string, opts Options) *plan {
	t.Helper()
	inv, err := openInventory(src)
	if err != nil {
		t.Fatal(err)
	}
	mtp, _ := ResolveMTP(inv, nil)
	p, err := makePlan(inv, mtp, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// editedFixture is a copy of a quantised fixture's checkpoint whose
// config.json edit changed.
func editedFixture(t *testing.T, name string, edit func(cfg map[string]any)) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.CopyFS(dir, os.DirFS(quantFixture(t, name))); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	if data, err = json.Marshal(cfg); err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// A quantisation nested under text_config (multimodal releases) is removed
// with the top-level one.
func TestNestedQuantizationConfigRemoved(t *testing.T) {
	m := llamaModel(32, 2, "BF16")
	fp8Source(m)
	m.config["text_config"] = map[string]any{"quantization_config": m.config["quantization_config"], "hidden_size": 64}
	delete(m.config, "quantization_config")
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	run(t, src, out, Options{DType: "bfloat16"})
	o := readOutput(t, out)
	if tc := o.config["text_config"].(map[string]any); tc["quantization_config"] != nil || tc["hidden_size"] == nil {
		t.Errorf("text_config %v", tc)
	}
	if o.tensors["model.layers.0.mlp.up_proj.weight"].dtype != "BF16" {
		t.Error("not dequantised")
	}
}

// Ctrl-C is honoured while a weight is computed whole: the group returns
// at once, and an interrupted run resumes to the bytes of one run.
func TestCancelDuringDequantisation(t *testing.T) {
	src := quantFixture(t, "llama-ct-w4a16-asym")
	p := planOf(t, src, Options{DType: "float32"})
	computed := 0
	for _, g := range p.groups {
		if g.Kind != kindDequant {
			continue
		}
		computed++
		ctx, cancel := context.WithCancel(context.Background())
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		read := g.read
		g.read = func(key string) ([]byte, error) { // a read slower than Ctrl-C
			once.Do(func() { close(started) })
			<-release
			return read(key)
		}
		go func() { <-started; cancel() }()
		err := runGroup(ctx, g, nil)
		close(release) // the abandoned evaluation ends with its tensor
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: %v", g.Outputs[0].Name, err)
		}
		break
	}
	if computed == 0 {
		t.Fatal("no weight computed by Eval")
	}

	out := filepath.Join(t.TempDir(), "out")
	one := Options{DType: "float32", Layers: &Range{0, 0}}
	run(t, src, out, one)
	if _, err := os.Stat(filepath.Join(out, IndexFile)); err == nil {
		t.Error("index written by a partial run")
	}
	run(t, src, out, Options{DType: "float32"})
	ref := filepath.Join(t.TempDir(), "ref")
	run(t, src, ref, Options{DType: "float32"})
	if !mapsEqual(testbin.HashTree(t, out), testbin.HashTree(t, ref)) {
		t.Error("resumed output differs from one run")
	}
}

// A quantised MTP layer is dequantised, never re-quantised, and excluded:
// MTP membership follows its stored tensors, not its logical keys.
func TestQuantisedMTPLayerDequantisedNotRequantised(t *testing.T) {
	src := editedFixture(t, "llama-ct-w4a16-group", func(cfg map[string]any) {
		cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"] = 1, 1 // layer 1 becomes an inlined MTP layer
	})
	out := filepath.Join(t.TempDir(), "out")
	res := run(t, src, out, Options{Quantize: QuantFP8Block})
	if !slices.Equal(res.MTP.Layers, []int{1}) {
		t.Fatalf("MTP %+v", res.MTP)
	}
	o := readOutput(t, out)
	for k, tt := range o.tensors {
		switch {
		case strings.HasPrefix(k, "model.layers.1.") && tt.dtype != "BF16":
			t.Errorf("MTP tensor %s is %s", k, tt.dtype)
		case strings.HasPrefix(k, "model.layers.0.") && strings.HasSuffix(k, "proj.weight") && tt.dtype != "F8_E4M3":
			t.Errorf("backbone %s is %s", k, tt.dtype)
		}
	}
	if !slices.Contains(o.exclusions(), "model.layers.1") {
		t.Errorf("exclusions %v", o.exclusions())
	}
	for _, a := range o.report.Tensors {
		if strings.HasPrefix(a.Key, "model.layers.1.") && !a.MTP {
			t.Errorf("%s not flagged MTP", a.Key)
		}
	}
}
