package hf

import (
	"strings"
	"testing"
)

func TestConfigGetters(t *testing.T) {
	c, err := Parse([]byte(`{"a": 3, "f": 2.5, "big": 1e3, "b": true, "s": "x", "l": ["p", "q"], "n": null, "o": {"k": 1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.Int("a"); v != 3 || err != nil {
		t.Errorf("Int(a) = %d, %v", v, err)
	}
	if v, err := c.Int("big"); v != 1000 || err != nil {
		t.Errorf("Int(big) = %d, %v; integral floats are integers", v, err)
	}
	if v, _ := c.IntOr("n", 7); v != 7 {
		t.Errorf("IntOr(null) = %d, want the default", v)
	}
	if v, _ := c.FloatOr("f", 0); v != 2.5 {
		t.Errorf("FloatOr(f) = %g", v)
	}
	if v, _ := c.BoolOr("b", false); !v {
		t.Error("BoolOr(b) = false")
	}
	if v, _ := c.Strings("l"); strings.Join(v, ",") != "p,q" {
		t.Errorf("Strings(l) = %v", v)
	}
	o, ok, err := c.Object("o")
	if !ok || err != nil {
		t.Fatalf("Object(o) = %v, %v", ok, err)
	}
	if _, err := o.Int("missing"); err == nil || !strings.Contains(err.Error(), "config.json: o") {
		t.Errorf("nested error does not say where: %v", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	c, err := Parse([]byte(`{"f": 2.5, "s": "x", "b": "yes"}`))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		get  func() error
		want string
	}{
		"missing":        {func() error { _, err := c.Int("hidden_size"); return err }, `required field "hidden_size" is missing`},
		"fraction":       {func() error { _, err := c.Int("f"); return err }, `"f" must be an integer, got 2.5`},
		"string for int": {func() error { _, err := c.Int("s"); return err }, `"s" must be an integer, got "x"`},
		"string bool":    {func() error { _, err := c.BoolOr("b", false); return err }, `"b" must be true or false`},
		"not an object":  {func() error { _, _, err := c.Object("s"); return err }, `"s" must be an object`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if err := tc.get(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Parse([]byte(`[1]`)); err == nil {
		t.Error("a JSON list parsed as a config")
	}
}

func TestReaderKeepsFirstError(t *testing.T) {
	c, _ := Parse([]byte(`{"a": 1}`))
	r := Reader{Config: c}
	_ = r.Int("x")
	_ = r.Int("y")
	if r.Int("a") != 1 || r.Err == nil || !strings.Contains(r.Err.Error(), `"x"`) {
		t.Errorf("Reader.Err = %v, want the error about x", r.Err)
	}
}
