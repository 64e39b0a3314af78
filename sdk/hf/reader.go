package hf

// Reader reads many fields and keeps the first error, so a plugin's config
// parsing is a list of assignments followed by one check of Err.
type Reader struct {
	Config Config
	Err    error
}

func (r *Reader) keep(err error) {
	if r.Err == nil {
		r.Err = err
	}
}

// Int is a required integer.
func (r *Reader) Int(key string) int {
	v, err := r.Config.Int(key)
	r.keep(err)
	return v
}

// IntOr is an optional integer.
func (r *Reader) IntOr(key string, def int) int {
	v, err := r.Config.IntOr(key, def)
	r.keep(err)
	return v
}

// FloatOr is an optional number.
func (r *Reader) FloatOr(key string, def float64) float64 {
	v, err := r.Config.FloatOr(key, def)
	r.keep(err)
	return v
}

// BoolOr is an optional boolean.
func (r *Reader) BoolOr(key string, def bool) bool {
	v, err := r.Config.BoolOr(key, def)
	r.keep(err)
	return v
}

// StringOr is an optional string.
func (r *Reader) StringOr(key, def string) string {
	v, err := r.Config.StringOr(key, def)
	r.keep(err)
	return v
}

// Ints is an optional list of integers.
func (r *Reader) Ints(key string) []int {
	v, err := r.Config.Ints(key)
	r.keep(err)
	return v
}

// FirstInt is a required integer that may be spelled several ways (config
// fields renamed across transformers versions): the first key present.
func (r *Reader) FirstInt(keys ...string) int {
	for _, k := range keys {
		if r.Config.Has(k) {
			return r.Int(k)
		}
	}
	return r.Int(keys[0])
}

// Float is a required number.
func (r *Reader) Float(key string) float64 {
	v, err := r.Config.Float(key)
	r.keep(err)
	return v
}

// Strings is an optional list of strings.
func (r *Reader) Strings(key string) []string {
	v, err := r.Config.Strings(key)
	r.keep(err)
	return v
}

// Object is an optional nested object; ok is false when absent or null.
func (r *Reader) Object(key string) (sub Config, ok bool) {
	sub, ok, err := r.Config.Object(key)
	r.keep(err)
	return sub, ok
}

// Fail records err unless an earlier error is kept.
func (r *Reader) Fail(err error) { r.keep(err) }
