// Package suggest finds the names a mistyped one was probably meant to be:
// the CLI's commands and flags, a plugin's values and context names.
package suggest

import (
	"fmt"
	"sort"
	"strings"
)

// DidYouMean asks whether name was meant to be one of the candidates
// closest to it, or is "".
func DidYouMean(name string, candidates []string) string {
	near := Nearest(name, candidates, 3)
	switch len(near) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("did you mean %s?", near[0])
	}
	return fmt.Sprintf("did you mean one of: %s?", strings.Join(near, ", "))
}

// Nearest are up to n candidates close to name, best first: one that name
// ends or starts with, or that ends or starts with name, at a separator (a
// weight's checkpoint key "model.layers.0.self_attn.q_proj.weight" for the
// formal input "self_attn.q_proj.weight"), then those a few edits away.
func Nearest(name string, candidates []string, n int) []string {
	type scored struct {
		name  string
		score int
	}
	var near []scored
	seen := map[string]bool{}
	for _, c := range candidates {
		if c == "" || c == name || seen[c] {
			continue
		}
		seen[c] = true
		if endsAtSeparator(name, c) || endsAtSeparator(c, name) || startsAtSeparator(name, c) || startsAtSeparator(c, name) {
			near = append(near, scored{c, -len(c)}) // the longest shared part first
			continue
		}
		if d := Distance(name, c); d <= 2 && d < min(len(name), len(c)) || d*3 <= max(len(name), len(c)) {
			near = append(near, scored{c, d})
		}
	}
	sort.Slice(near, func(i, j int) bool {
		if near[i].score != near[j].score {
			return near[i].score < near[j].score
		}
		return near[i].name < near[j].name
	})
	var out []string
	for _, s := range near[:min(n, len(near))] {
		out = append(out, s.name)
	}
	return out
}

// startsAtSeparator says whether long starts with short, just before a
// '.', '/' or '_'.
func startsAtSeparator(long, short string) bool {
	if len(long) <= len(short) || !strings.HasPrefix(long, short) {
		return false
	}
	return strings.ContainsRune("./_", rune(long[len(short)]))
}

// endsAtSeparator says whether long ends with short, just after a '.', '/'
// or '_'.
func endsAtSeparator(long, short string) bool {
	if len(long) <= len(short) || !strings.HasSuffix(long, short) {
		return false
	}
	return strings.ContainsRune("./_", rune(long[len(long)-len(short)-1]))
}

// Distance is the Damerau-Levenshtein distance (adjacent swaps cost 1)
// of a and b.
func Distance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}
