package convert

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/strata-llm/strata/internal/testbin"
)

func run(t *testing.T, src, out string, opts Options) *Result {
	t.Helper()
	res, err := Convert(context.Background(), src, out, opts)
	if err != nil {
		t.Fatalf("convert: %v", err)
	}
	return res
}

func TestE4M3RoundsToNearestEvenAndSaturates(t *testing.T) {
	for c := range 256 {
		v := e4m3Values[c]
		if v != v {
			continue
		}
		if got := e4m3(v); got != uint8(c) && !(v == 0 && got&0x7f == 0) {
			t.Errorf("e4m3(%g) = %#x, want %#x", v, got, c)
		}
	}
	// Halfway between codes 0x38 (1.0) and 0x39 (1.125): ties go to the even code.
	if got := e4m3(1.0625); got != 0x38 {
		t.Errorf("e4m3(1.0625) = %#x, want 0x38", got)
	}
	if got := e4m3(1.1875); got != 0x3a { // between 1.125 (odd) and 1.25 (even)
		t.Errorf("e4m3(1.1875) = %#x, want 0x3a", got)
	}
	for _, x := range []float32{448, 1000, float32(math.Inf(1))} {
		if got := e4m3(x); got != 0x7e {
			t.Errorf("e4m3(%g) = %#x, want 0x7e (448)", x, got)
		}
	}
	if got := e4m3(-1000); got != 0xfe {
		t.Errorf("e4m3(-1000) = %#x, want 0xfe", got)
	}
	if got := e4m3(float32(math.Ldexp(1, -10))); got != 0 { // half the smallest subnormal: to even (0)
		t.Errorf("e4m3(2^-10) = %#x, want 0", got)
	}
}

func TestCopyIsByteIdenticalAndAccountsEveryTensor(t *testing.T) {
	m := llamaModel(1, 3, "BF16")
	m.shards["model.safetensors"]["unknown.buffer"] = tensor{"I64", []int64{4}, make([]byte, 32)}
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	res := run(t, src, out, Options{Jobs: 2})
	o := readOutput(t, out)
	for k, want := range m.all() {
		got, ok := o.tensors[k]
		if !ok || got.dtype != want.dtype || !bytes.Equal(got.data, want.data) {
			t.Errorf("%s not carried byte for byte", k)
		}
	}
	if o.file["model.layers.1.mlp.up_proj.weight"] != "model-layer-00001.safetensors" || o.file["lm_head.weight"] != TailFile || o.file["unknown.buffer"] != TailFile {
		t.Errorf("shard placement: %v", o.file)
	}
	if res.Sources != len(m.all()) || res.Dropped != 0 || len(o.report.Tensors) != len(m.all()) {
		t.Errorf("accounting: %d sources, %d dropped, %d in the report", res.Sources, res.Dropped, len(o.report.Tensors))
	}
	for _, f := range []string{"tokenizer.json", "generation_config.json"} {
		if b, err := os.ReadFile(filepath.Join(out, f)); err != nil || string(b) != m.files[f] {
			t.Errorf("%s not copied: %v", f, err)
		}
	}
	if _, ok := o.config["quantization_config"]; ok {
		t.Error("quantization_config written without --quantize")
	}
}

func TestCastRoundsAsTorch(t *testing.T) {
	m := llamaModel(2, 2, "F32")
	src := m.write(t, t.TempDir())
	for _, tc := range []struct{ dtype, st string }{{"bfloat16", "BF16"}, {"float16", "F16"}} {
		out := filepath.Join(t.TempDir(), "out")
		run(t, src, out, Options{DType: tc.dtype})
		o := readOutput(t, out)
		for k, want := range m.all() {
			got := o.tensors[k]
			if got.dtype != tc.st || !bytes.Equal(got.data, encode(nil, tc.st, floats(want))) {
				t.Errorf("%s: %s, not the rounded source", k, got.dtype)
			}
		}
		if o.config["dtype"] != tc.dtype {
			t.Errorf("config dtype %v, want %s", o.config["dtype"], tc.dtype)
		}
	}
}

func TestFP8BlockQuantisesLinearsOnly(t *testing.T) {
	m := llamaModel(3, 2, "BF16")
	rng := rand.New(rand.NewPCG(3, 3))
	// A router and a 300-row weight (blocks 128, 128, 44).
	m.shards["model.safetensors"]["model.layers.0.mlp.gate.weight"] = bf16(rng, 8, 64)
	m.shards["model.safetensors"]["model.layers.1.mlp.gate_proj.weight"] = bf16(rng, 300, 64)
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	run(t, src, out, Options{Quantize: QuantFP8Block})
	o := readOutput(t, out)
	qc := o.quantConfig()
	if qc["quant_method"] != "fp8" || fmt.Sprint(qc["weight_block_size"]) != "[128 128]" || qc["activation_scheme"] != "dynamic" {
		t.Errorf("quantization_config %v", qc)
	}
	excl := o.exclusions()
	for _, want := range []string{"lm_head", "model.embed_tokens", "model.norm", "model.layers.0.mlp.gate", "model.layers.1.input_layernorm"} {
		if !slices.Contains(excl, want) {
			t.Errorf("exclusions lack %s: %v", want, excl)
		}
	}
	if slices.Contains(excl, "model") {
		t.Error("a bare model exclusion")
	}
	for k, src := range m.all() {
		got := o.tensors[k]
		quant := strings.HasSuffix(k, "_proj.weight")
		if !quant {
			if !bytes.Equal(got.data, src.data) || got.dtype != src.dtype {
				t.Errorf("%s changed though not quantised", k)
			}
			continue
		}
		inv, ok := o.tensors[k+"_scale_inv"]
		rows, cols := src.shape[0], src.shape[1]
		if got.dtype != "F8_E4M3" || !ok || inv.dtype != "F32" || !slices.Equal(inv.shape, []int64{ceilDiv(rows, 128), ceilDiv(cols, 128)}) {
			t.Fatalf("%s: %s, scale %v %v", k, got.dtype, inv.dtype, inv.shape)
		}
		w, q, s := floats(src), floats(got), floats(inv)
		for i := range w {
			r, c := int64(i)/cols, int64(i)%cols
			block := s[(r/128)*ceilDiv(cols, 128)+c/128]
			deq := q[i] * block
			if d := math.Abs(float64(deq - w[i])); d > float64(block)*448/16+1e-7 {
				t.Fatalf("%s[%d]: %g dequantises to %g", k, i, w[i], deq)
			}
		}
	}
}

func TestFP8DynamicWritesCompressedTensors(t *testing.T) {
	m := llamaModel(4, 2, "BF16")
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	run(t, src, out, Options{Quantize: QuantFP8Dynamic})
	o := readOutput(t, out)
	qc := o.quantConfig()
	g, _ := qc["config_groups"].(map[string]any)["group_0"].(map[string]any)
	if qc["quant_method"] != "compressed-tensors" || qc["format"] != "float-quantized" ||
		g["weights"].(map[string]any)["strategy"] != "channel" || g["input_activations"].(map[string]any)["strategy"] != "token" ||
		g["input_activations"].(map[string]any)["dynamic"] != true {
		t.Errorf("quantization_config %v", qc)
	}
	k := "model.layers.1.mlp.down_proj.weight"
	w, q := floats(m.all()[k]), o.tensors[k]
	sc := o.tensors["model.layers.1.mlp.down_proj.weight_scale"]
	if q.dtype != "F8_E4M3" || sc.dtype != "BF16" || !slices.Equal(sc.shape, []int64{64, 1}) {
		t.Fatalf("%s %s, scale %s %v", k, q.dtype, sc.dtype, sc.shape)
	}
	s := floats(sc)
	cols := int64(160)
	for i, x := range floats(q) {
		row := int64(i) / cols
		if d := math.Abs(float64(x*s[row] - w[i])); d > float64(s[row])*448/16*1.01 {
			t.Fatalf("%s[%d]: %g dequantises to %g", k, i, w[i], x*s[row])
		}
	}
}

// fp8Source makes every Linear of layer 0 an FP8 weight with a block
// weight_scale_inv, as DeepSeek-V3's release does. (A static input_scale
// beside them is refused by host/quant: TestQuantisedSourceRefusals.)
func fp8Source(m *model) map[string][]float32 {
	want := map[string][]float32{}
	ts := m.shards["model.safetensors"]
	for k, tt := range ts {
		if !strings.HasPrefix(k, "model.layers.0.") || !strings.HasSuffix(k, "_proj.weight") {
			continue
		}
		rows, cols := tt.shape[0], tt.shape[1]
		codes := make([]byte, rows*cols)
		vals := make([]float32, rows*cols)
		br, bc := ceilDiv(rows, 128), ceilDiv(cols, 128)
		scales := make([]float32, br*bc)
		for i := range scales {
			scales[i] = float32(i+1) / 64
		}
		for i := range codes {
			codes[i] = byte(i*7) & 0x7e // no NaN codes
			vals[i] = e4m3Values[codes[i]] * scales[(int64(i)/cols/128)*bc+int64(i)%cols/128]
		}
		ts[k] = tensor{"F8_E4M3", tt.shape, codes}
		ts[k+"_scale_inv"] = tensor{"F32", []int64{br, bc}, encode(nil, "F32", scales)}
		want[k] = vals
	}
	m.config["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []int{128, 128}}
	return want
}

func TestFP8SourceIsDequantisedAndScalesReported(t *testing.T) {
	m := llamaModel(5, 2, "BF16")
	want := fp8Source(m)
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	res := run(t, src, out, Options{DType: "float32"})
	o := readOutput(t, out)
	for k, vals := range want {
		got := o.tensors[k]
		if got.dtype != "F32" || !slices.Equal(floats(got), vals) {
			t.Errorf("%s not dequantised exactly", k)
		}
		if _, ok := o.tensors[k+"_scale_inv"]; ok {
			t.Errorf("%s_scale_inv written after dequantisation", k)
		}
	}
	dropped := 0
	for _, a := range o.report.Tensors {
		if a.Action == "dropped" {
			dropped++
			if !strings.HasSuffix(a.Key, "_scale_inv") && !strings.HasSuffix(a.Key, "input_scale") || a.Reason == "" {
				t.Errorf("dropped %s (%s)", a.Key, a.Reason)
			}
		}
	}
	if dropped != len(want) || res.Dropped != dropped {
		t.Errorf("%d dropped, want %d", dropped, len(want))
	}
	if _, ok := o.config["quantization_config"]; ok {
		t.Error("the source's fp8 quantization_config survived dequantisation")
	}
	// Without a dtype everything is carried as stored, scales included.
	out2 := filepath.Join(t.TempDir(), "out")
	run(t, src, out2, Options{})
	if o2 := readOutput(t, out2); len(o2.tensors) != len(m.all()) || o2.quantConfig()["quant_method"] != "fp8" {
		t.Errorf("FP8 source not carried as stored: %d tensors", len(o2.tensors))
	}
	// Requantised: FP8 -> float -> fp8-block.
	out3 := filepath.Join(t.TempDir(), "out")
	run(t, src, out3, Options{Quantize: QuantFP8Block})
	if o3 := readOutput(t, out3); o3.tensors["model.layers.0.mlp.up_proj.weight"].dtype != "F8_E4M3" || o3.tensors["model.layers.0.mlp.up_proj.weight_scale_inv"].dtype != "F32" {
		t.Error("FP8 source not requantised")
	}
}

func TestMXFP4IsDequantisedAndTransposed(t *testing.T) {
	m := llamaModel(6, 1, "BF16")
	const e, rows, groups = 2, 6, 3 // [E, 2I, H/32, 16]
	blocks := make([]byte, e*rows*groups*16)
	scales := make([]byte, e*rows*groups)
	for i := range blocks {
		blocks[i] = byte(i * 37)
	}
	for i := range scales {
		scales[i] = byte(124 + i%6)
	}
	ts := m.shards["model.safetensors"]
	ts["model.layers.0.mlp.experts.gate_up_proj_blocks"] = tensor{"U8", []int64{e, rows, groups, 16}, blocks}
	ts["model.layers.0.mlp.experts.gate_up_proj_scales"] = tensor{"U8", []int64{e, rows, groups}, scales}
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	run(t, src, out, Options{DType: "bfloat16"})
	o := readOutput(t, out)
	got := o.tensors["model.layers.0.mlp.experts.gate_up_proj"]
	cols := int64(groups * 32)
	if got.dtype != "BF16" || !slices.Equal(got.shape, []int64{e, cols, rows}) {
		t.Fatalf("dequantised %s %v", got.dtype, got.shape)
	}
	v := floats(got)
	for x := range int64(e) {
		for r := range int64(rows) {
			for c := range cols {
				g := (x*rows+r)*groups + c/32
				code := blocks[g*16+(c%32)/2]
				nib := code & 0x0f
				if c%2 == 1 {
					nib = code >> 4
				}
				want := fp4Values[nib] * float32(math.Ldexp(1, int(scales[g])-127))
				if v[(x*cols+c)*rows+r] != want {
					t.Fatalf("[%d,%d,%d] = %g, want %g", x, c, r, v[(x*cols+c)*rows+r], want)
				}
			}
		}
	}
	if _, ok := o.tensors["model.layers.0.mlp.experts.gate_up_proj_scales"]; ok {
		t.Error("MXFP4 scales written after dequantisation")
	}
}

// mtpVariants adds MTP weights by file surgery, in each convention.
var mtpVariants = []struct {
	name       string
	apply      func(m *model, rng *rand.Rand) []string // returns the MTP keys
	prefix     string                                  // expected exclusion prefix
	convention string
}{
	{"inlined", func(m *model, rng *rand.Rand) []string {
		m.config["num_nextn_predict_layers"] = 1
		keys := mtpLayer(m.shards["model.safetensors"], "model.layers.2.", rng)
		return keys
	}, "model.layers.2", MTPInlined},
	{"separate-file", func(m *model, rng *rand.Rand) []string {
		m.indexed = true
		ts := map[string]tensor{}
		keys := mtpLayer(ts, "model.layers.2.", rng)
		m.extra = map[string]map[string]tensor{"mtp.safetensors": ts}
		return keys
	}, "model.layers.2", MTPSeparateFile},
	{"indexed", func(m *model, rng *rand.Rand) []string {
		m.indexed = true
		ts := map[string]tensor{}
		keys := mtpLayer(ts, "mtp.layers.0.", rng)
		for _, k := range []string{"mtp.fc.weight", "mtp.norm.weight"} {
			ts[k] = bf16(rng, 64, 64)
			keys = append(keys, k)
		}
		m.shards["model-00002-of-00002.safetensors"] = ts
		return keys
	}, "mtp", MTPIndexed},
}

func mtpLayer(ts map[string]tensor, p string, rng *rand.Rand) []string {
	var keys []string
	for name, shape := range map[string][]int64{
		"enorm.weight": {64}, "hnorm.weight": {64}, "eh_proj.weight": {64, 128}, "shared_head.norm.weight": {64},
		"shared_head.head.weight": {96, 64}, "self_attn.q_proj.weight": {64, 64}, "mlp.gate.weight": {8, 64},
		"mlp.experts.0.up_proj.weight": {32, 64}, "input_layernorm.weight": {64},
	} {
		ts[p+name] = bf16(rng, shape...)
		keys = append(keys, p+name)
	}
	return keys
}

func TestMTPConventionsCarriedWholeUnquantisedAndExcluded(t *testing.T) {
	for _, v := range mtpVariants {
		for _, q := range []string{QuantFP8Block, QuantFP8Dynamic} {
			t.Run(v.name+"/"+q, func(t *testing.T) {
				m := llamaModel(7, 2, "BF16")
				keys := v.apply(m, rand.New(rand.NewPCG(7, 7)))
				src := m.write(t, t.TempDir())
				out := filepath.Join(t.TempDir(), "out")
				res := run(t, src, out, Options{Quantize: q})
				o := readOutput(t, out)
				all := m.all()
				for _, k := range keys {
					got, ok := o.tensors[k]
					if !ok || got.dtype != all[k].dtype || !bytes.Equal(got.data, all[k].data) {
						t.Errorf("MTP tensor %s not carried byte for byte (present %v, %s)", k, ok, got.dtype)
					}
					if _, ok := o.tensors[k+"_scale_inv"]; ok {
						t.Errorf("MTP tensor %s quantised", k)
					}
				}
				want := v.prefix
				if q == QuantFP8Dynamic {
					want = `re:^` + strings.ReplaceAll(v.prefix, ".", `\.`) + `\.`
				}
				if excl := o.exclusions(); !slices.Contains(excl, want) || slices.Contains(excl, "model") {
					t.Errorf("exclusions %v lack %s", excl, want)
				}
				if len(res.MTP.Descriptions) != 1 || res.MTP.Descriptions[0].Convention != v.convention || len(res.MTP.Keys) != len(keys) {
					t.Errorf("MTP found: %+v", res.MTP)
				}
				if v.prefix == "model.layers.2" && o.file[keys[0]] != "model-layer-00002.safetensors" {
					t.Errorf("MTP layer in %s, want its own shard", o.file[keys[0]])
				}
				if v.prefix == "mtp" && o.file[keys[0]] != TailFile {
					t.Errorf("mtp.* in %s, want the tail", o.file[keys[0]])
				}
				// The backbone is quantised still.
				if o.tensors["model.layers.1.mlp.up_proj.weight"].dtype != "F8_E4M3" {
					t.Error("the backbone was not quantised")
				}
			})
		}
	}
}

func TestExplicitMTPDescription(t *testing.T) {
	m := llamaModel(8, 2, "BF16")
	rng := rand.New(rand.NewPCG(8, 8))
	keys := mtpLayer(m.shards["model.safetensors"], "model.layers.2.", rng) // no num_nextn_predict_layers
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	res := run(t, src, out, Options{Quantize: QuantFP8Block, MTP: []MTPDescription{{Convention: MTPInlined, Layers: []int{2}}}})
	if len(res.MTP.Keys) != len(keys) || !slices.Equal(res.MTP.Prefixes, []string{"model.layers.2"}) {
		t.Errorf("declared MTP not applied: %+v", res.MTP)
	}
	if o := readOutput(t, out); o.tensors["model.layers.2.self_attn.q_proj.weight"].dtype != "BF16" {
		t.Error("declared MTP layer quantised")
	}
	_, err := Convert(context.Background(), src, filepath.Join(t.TempDir(), "o"), Options{MTP: []MTPDescription{{Convention: MTPIndexed, Keys: []string{"mtp"}}}})
	if err == nil || !strings.Contains(err.Error(), "matches no tensor") {
		t.Errorf("a declared layout the checkpoint lacks: %v", err)
	}
}

func TestResumeAndScaleOutGiveIdenticalOutput(t *testing.T) {
	m := llamaModel(9, 4, "F32")
	src := m.write(t, t.TempDir())
	ref := filepath.Join(t.TempDir(), "ref")
	run(t, src, ref, Options{DType: "bfloat16", Quantize: QuantFP8Block})
	want := testbin.HashTree(t, ref)

	shared := filepath.Join(t.TempDir(), "shared")
	opts := Options{DType: "bfloat16", Quantize: QuantFP8Block}
	opts.Layers = &Range{0, 1}
	run(t, src, shared, opts)
	if _, err := os.Stat(filepath.Join(shared, IndexFile)); err == nil {
		t.Fatal("index written before every layer was converted")
	}
	_, err := Convert(context.Background(), src, shared, Options{DType: "bfloat16", Quantize: QuantFP8Block, Finalize: true})
	if err == nil || !strings.Contains(err.Error(), "missing layers 2-3") {
		t.Fatalf("finalize with layers missing: %v", err)
	}
	if _, err := os.Stat(filepath.Join(shared, IndexFile)); err == nil {
		t.Fatal("index written by a refused finalize")
	}
	opts.Layers = &Range{2, 3}
	run(t, src, shared, opts)
	res := run(t, src, shared, Options{DType: "bfloat16", Quantize: QuantFP8Block, Finalize: true})
	if len(res.Written) != 0 || !res.Finalized {
		t.Errorf("finalize rewrote layers %v", res.Written)
	}
	if got := testbin.HashTree(t, shared); !mapsEqual(got, want) {
		t.Errorf("scaled-out output differs from one run:\n%v\n%v", got, want)
	}
	// A layer shard lost: the next run rewrites just it.
	os.Remove(filepath.Join(shared, LayerFile(2)))
	res = run(t, src, shared, Options{DType: "bfloat16", Quantize: QuantFP8Block})
	if !slices.Equal(res.Written, []int{2}) || len(res.Kept) != 3 {
		t.Errorf("resume wrote %v kept %v", res.Written, res.Kept)
	}
	if got := testbin.HashTree(t, shared); !mapsEqual(got, want) {
		t.Error("resumed output differs")
	}
}

func TestRangesConvertedAtOnceIntoOneDirectory(t *testing.T) {
	m := llamaModel(11, 6, "F32")
	src := m.write(t, t.TempDir())
	opts := Options{DType: "bfloat16"}
	ref := filepath.Join(t.TempDir(), "ref")
	run(t, src, ref, opts)

	for round := range 3 { // the first runs race to make the directory and its manifest
		shared := filepath.Join(t.TempDir(), "shared")
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i, r := range []Range{{0, 1}, {2, 3}, {4, 5}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := opts
				o.Layers = &r
				_, errs[i] = Convert(context.Background(), src, shared, o)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, range %d: %v", round, i, err)
			}
		}
		res := run(t, src, shared, Options{DType: "bfloat16", Finalize: true})
		if len(res.Written) != 0 {
			t.Errorf("finalize rewrote layers %v", res.Written)
		}
		if got := testbin.HashTree(t, shared); !mapsEqual(got, testbin.HashTree(t, ref)) {
			t.Errorf("round %d: output of concurrent ranges differs from one run", round)
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestCancelStopsPromptlyAndResumes(t *testing.T) {
	m := llamaModel(10, 2, "F32")
	rng := rand.New(rand.NewPCG(10, 10))
	for i := range 2 { // ~16 MB per layer so a run takes a while
		m.shards["model.safetensors"][fmt.Sprintf("model.layers.%d.mlp.big_proj.weight", i)] = f32(rng, 2048, 2048)
	}
	src := m.write(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	start := time.Now()
	_, err := Convert(ctx, src, out, Options{Quantize: QuantFP8Dynamic, DType: "float16", Jobs: 1})
	if took := time.Since(start); err == nil || took > 5*time.Second {
		t.Skipf("finished before the cancel (%v, %v)", took, err)
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "resume") {
		t.Errorf("cancel error: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, IndexFile)); err == nil {
		t.Error("index written by a cancelled run")
	}
	temps, _ := filepath.Glob(filepath.Join(out, ".strata-tmp-*"))
	if len(temps) > 0 {
		t.Errorf("temporary files left: %v", temps)
	}
	run(t, src, out, Options{Quantize: QuantFP8Dynamic, DType: "float16"})
	ref := filepath.Join(t.TempDir(), "ref")
	run(t, src, ref, Options{Quantize: QuantFP8Dynamic, DType: "float16"})
	if !mapsEqual(testbin.HashTree(t, out), testbin.HashTree(t, ref)) {
		t.Error("output after cancel + resume differs from one run")
	}
}

func TestBadInputFailsClearlyAndTouchesNothing(t *testing.T) {
	m := llamaModel(11, 2, "BF16")
	src := m.write(t, t.TempDir())
	fp8 := llamaModel(11, 2, "BF16")
	fp8Source(fp8)
	delete(fp8.shards["model.safetensors"], "model.layers.0.mlp.up_proj.weight_scale_inv")
	fp8Src := fp8.write(t, t.TempDir())
	u8 := llamaModel(11, 2, "BF16")
	u8.shards["model.safetensors"]["model.layers.0.mlp.packed"] = tensor{"U8", []int64{4}, []byte{1, 2, 3, 4}}
	u8Src := u8.write(t, t.TempDir())
	other := filepath.Join(t.TempDir(), "other")
	run(t, src, other, Options{DType: "float16"})
	foreign := t.TempDir()
	os.WriteFile(filepath.Join(foreign, "model-00001-of-00002.safetensors"), []byte("x"), 0o644)

	before := map[string]map[string]string{}
	for _, d := range []string{src, fp8Src, u8Src} {
		before[d] = testbin.HashTree(t, d)
	}
	cases := []struct {
		name, src, out string
		opts           Options
		want           string
	}{
		{"layer range outside", src, "", Options{Layers: &Range{1, 5}}, "outside the model"},
		{"fp8 without scales", fp8Src, "", Options{DType: "bfloat16"}, "its scale, is missing"},
		{"unconvertible dtype", u8Src, "", Options{DType: "bfloat16"}, "cannot be converted as asked"},
		{"another conversion", src, other, Options{DType: "bfloat16"}, "holds another conversion"},
		{"foreign files", src, foreign, Options{}, "which strata convert did not write"},
		{"out inside source", src, filepath.Join(src, "out"), Options{}, "lies inside the source"},
		{"bad dtype", src, "", Options{DType: "int8"}, "--dtype"},
		{"bad quantize", src, "", Options{Quantize: "nvfp4"}, "--quantize"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := tc.out
			if out == "" {
				out = filepath.Join(t.TempDir(), "out")
			}
			_, err := Convert(context.Background(), tc.src, out, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if tc.out != other {
				if _, err := os.Stat(filepath.Join(out, IndexFile)); err == nil {
					t.Error("index written")
				}
			}
		})
	}
	for d, h := range before {
		if !mapsEqual(testbin.HashTree(t, d), h) {
			t.Errorf("source %s modified", d)
		}
	}
}

func TestLateUnstagedKeyFailsFinalize(t *testing.T) {
	m := llamaModel(12, 2, "BF16")
	src := m.write(t, t.TempDir())
	inv, err := openInventory(src)
	if err != nil {
		t.Fatal(err)
	}
	mtp, _ := ResolveMTP(inv, nil)
	p, err := makePlan(inv, mtp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := &outDir{dir: t.TempDir(), p: p, run: p.runInfo()}
	writeSafetensors(t, filepath.Join(src, "late.safetensors"), map[string]tensor{"late.weight": {"F32", []int64{1}, make([]byte, 4)}})
	if err := o.checkStaged(); err == nil || !strings.Contains(err.Error(), "late.weight") {
		t.Errorf("late key: %v", err)
	}
}

func TestProgressBarOnATerminalAndLinesOtherwise(t *testing.T) {
	m := llamaModel(13, 2, "BF16")
	src := m.write(t, t.TempDir())
	for _, tty := range []bool{true, false} {
		var buf bytes.Buffer
		run(t, src, filepath.Join(t.TempDir(), "out"), Options{DType: "float16", Progress: &buf, TTY: tty})
		out := buf.String()
		if tty && (!strings.Contains(out, "\r\x1b[K[") || !strings.Contains(out, "3/3 shards") || !strings.Contains(out, "ETA")) {
			t.Errorf("terminal progress: %q", out)
		}
		if !tty && (strings.Contains(out, "\r") || strings.Count(out, " written (") != 3 || !strings.Contains(out, "/s, ETA")) {
			t.Errorf("plain progress: %q", out)
		}
	}
}
