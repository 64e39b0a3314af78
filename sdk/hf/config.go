// Package hf reads Hugging Face config.json files for plugins: typed getters
// whose errors name the field and say what was expected, so a user with a
// broken or unusual config knows what to fix.
package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
)

// Config is a parsed config.json object (or a nested object of one).
type Config struct {
	path string // "config.json" or "config.json: rope_scaling" for nested objects
	m    map[string]any
}

// Parse parses config.json bytes.
func Parse(data []byte) (Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return Config{}, fmt.Errorf("config.json: not a JSON object: %w", err)
	}
	if m == nil {
		return Config{}, fmt.Errorf("config.json: not a JSON object")
	}
	return Config{path: "config.json", m: m}, nil
}

// Has reports whether key is present and not null.
func (c Config) Has(key string) bool {
	v, ok := c.m[key]
	return ok && v != nil
}

// Keys lists the keys present, sorted.
func (c Config) Keys() []string {
	keys := make([]string, 0, len(c.m))
	for k := range c.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (c Config) missing(key string) error {
	return fmt.Errorf("%s: required field %q is missing", c.path, key)
}

func (c Config) wrongType(key, want string) error {
	return fmt.Errorf("%s: field %q must be %s, got %s", c.path, key, want, describe(c.m[key]))
}

func describe(v any) string {
	b, err := json.Marshal(v)
	if err != nil || len(b) > 60 {
		return fmt.Sprintf("a %T", v)
	}
	return string(b)
}

// Int is a required integer field.
func (c Config) Int(key string) (int, error) {
	if !c.Has(key) {
		return 0, c.missing(key)
	}
	n, ok := c.m[key].(json.Number)
	if !ok {
		return 0, c.wrongType(key, "an integer")
	}
	i, err := n.Int64()
	if err != nil {
		f, ferr := n.Float64()
		if ferr != nil || f != math.Trunc(f) {
			return 0, c.wrongType(key, "an integer")
		}
		i = int64(f)
	}
	return int(i), nil
}

// IntOr is an optional integer field with a default for absent or null.
func (c Config) IntOr(key string, def int) (int, error) {
	if !c.Has(key) {
		return def, nil
	}
	return c.Int(key)
}

// Float is a required number field.
func (c Config) Float(key string) (float64, error) {
	if !c.Has(key) {
		return 0, c.missing(key)
	}
	n, ok := c.m[key].(json.Number)
	if !ok {
		return 0, c.wrongType(key, "a number")
	}
	f, err := n.Float64()
	if err != nil {
		return 0, c.wrongType(key, "a number")
	}
	return f, nil
}

// FloatOr is an optional number field.
func (c Config) FloatOr(key string, def float64) (float64, error) {
	if !c.Has(key) {
		return def, nil
	}
	return c.Float(key)
}

// BoolOr is an optional boolean field.
func (c Config) BoolOr(key string, def bool) (bool, error) {
	if !c.Has(key) {
		return def, nil
	}
	b, ok := c.m[key].(bool)
	if !ok {
		return false, c.wrongType(key, "true or false")
	}
	return b, nil
}

// String is a required string field.
func (c Config) String(key string) (string, error) {
	if !c.Has(key) {
		return "", c.missing(key)
	}
	s, ok := c.m[key].(string)
	if !ok {
		return "", c.wrongType(key, "a string")
	}
	return s, nil
}

// StringOr is an optional string field.
func (c Config) StringOr(key, def string) (string, error) {
	if !c.Has(key) {
		return def, nil
	}
	return c.String(key)
}

// Strings is an optional list of strings (nil when absent).
func (c Config) Strings(key string) ([]string, error) {
	if !c.Has(key) {
		return nil, nil
	}
	list, ok := c.m[key].([]any)
	if !ok {
		return nil, c.wrongType(key, "a list of strings")
	}
	out := make([]string, len(list))
	for i, v := range list {
		s, ok := v.(string)
		if !ok {
			return nil, c.wrongType(key, "a list of strings")
		}
		out[i] = s
	}
	return out, nil
}

// Ints is an optional list of integers (nil when absent).
func (c Config) Ints(key string) ([]int, error) {
	if !c.Has(key) {
		return nil, nil
	}
	list, ok := c.m[key].([]any)
	if !ok {
		return nil, c.wrongType(key, "a list of integers")
	}
	out := make([]int, len(list))
	for i, v := range list {
		n, ok := v.(json.Number)
		x, err := n.Int64()
		if !ok || err != nil {
			return nil, c.wrongType(key, "a list of integers")
		}
		out[i] = int(x)
	}
	return out, nil
}

// Floats is an optional list of numbers (nil when absent).
func (c Config) Floats(key string) ([]float64, error) {
	if !c.Has(key) {
		return nil, nil
	}
	list, ok := c.m[key].([]any)
	if !ok {
		return nil, c.wrongType(key, "a list of numbers")
	}
	out := make([]float64, len(list))
	for i, v := range list {
		n, ok := v.(json.Number)
		x, err := n.Float64()
		if !ok || err != nil {
			return nil, c.wrongType(key, "a list of numbers")
		}
		out[i] = x
	}
	return out, nil
}

// Object is an optional nested object; ok is false when absent or null.
func (c Config) Object(key string) (sub Config, ok bool, err error) {
	if !c.Has(key) {
		return Config{}, false, nil
	}
	m, isObj := c.m[key].(map[string]any)
	if !isObj {
		return Config{}, false, c.wrongType(key, "an object")
	}
	return Config{path: c.path + ": " + key, m: m}, true, nil
}

// Path names the object in errors: "config.json", or "config.json: text_config"
// for a nested one.
func (c Config) Path() string { return c.path }

// WithDefaults is c with each key of defaults that c lacks added, as
// transformers' configuration classes fill a field config.json omits:
// a key present, null included, is kept (null is Python's None, which
// the class handles itself). Values are what encoding/json encodes
// (numbers, strings, booleans, lists, maps). It returns the keys it added,
// sorted.
func (c Config) WithDefaults(defaults map[string]any) (Config, []string, error) {
	if len(defaults) == 0 {
		return c, nil, nil
	}
	data, err := json.Marshal(defaults)
	if err != nil {
		return c, nil, fmt.Errorf("%s: defaults are not JSON values: %w", c.path, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var parsed map[string]any
	if err := dec.Decode(&parsed); err != nil {
		return c, nil, fmt.Errorf("%s: defaults are not JSON values: %w", c.path, err)
	}
	m := make(map[string]any, len(c.m)+len(parsed))
	for k, v := range c.m {
		m[k] = v
	}
	var added []string
	for k, v := range parsed {
		if _, ok := m[k]; !ok {
			m[k] = v
			added = append(added, k)
		}
	}
	sort.Strings(added)
	return Config{path: c.path, m: m}, added, nil
}
