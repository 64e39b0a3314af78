package transform

import (
	"slices"

	"github.com/strata-llm/strata/host/checkpoint"
)

// Packed is an expression stored flat, in prefix order, for holding many
// once they are lowered: a leaf is its key, 32 bytes where an Expr is 160.
// Qwen3-235B-FP8's stacks of dequantised experts are 88,000 leaves, 14 MB
// as trees until the weight spec is written.
type Packed []packedNode

type packedNode struct {
	key    string             // a leaf's key, when stored is nil
	stored *checkpoint.Tensor // a leaf's tensor, when it was known (Expr.Stored)
	op     *Expr              // an operation's fields, without its arguments (nil: a leaf)
	args   int32              // how many arguments follow
}

// leafKey is a leaf node's key.
func (n packedNode) leafKey() string {
	if n.stored != nil {
		return n.stored.Key
	}
	return n.key
}

// Pack flattens e (nil for nil), each leaf's key its tensor's, else as key
// gives it (the checkpoint's own string, not the copy a plugin's binding or
// a scale's name made: 6 MB of Qwen3-235B-FP8's).
func (e *Expr) Pack(key func(string) string) Packed {
	if e == nil {
		return nil
	}
	nodes := 0
	e.walk(func(*Expr) { nodes++ })
	p := make(Packed, 0, nodes) // sized once: grown, a stack of 384 experts' was copied 10 times
	e.walk(func(x *Expr) {
		if x.IsLeaf() && x.Stored != nil {
			p = append(p, packedNode{stored: x.Stored})
			return
		}
		if x.IsLeaf() {
			p = append(p, packedNode{key: key(x.Key)})
			return
		}
		op := &Expr{Op: x.Op, Ints: x.Ints, Axis: x.Axis, Start: x.Start, End: x.End, Step: x.Step, To: x.To}
		p = append(p, packedNode{op: op, args: int32(len(x.Args))})
	})
	return p
}

// Unpack rebuilds the expression (untyped; nil for an empty Packed).
func (p Packed) Unpack() *Expr {
	if len(p) == 0 {
		return nil
	}
	e, _ := p.unpack(0)
	return e
}

// unpack rebuilds the node at i and returns the index after its subtree.
func (p Packed) unpack(i int) (*Expr, int) {
	n := p[i]
	if n.op == nil {
		return Leaf(n.leafKey()), i + 1
	}
	e := *n.op
	e.Args = make([]*Expr, n.args)
	next := i + 1
	for a := range e.Args {
		e.Args[a], next = p.unpack(next)
	}
	return &e, next
}

// Node is node i: a leaf's key, or an operation without its arguments and
// how many arguments follow it.
func (p Packed) Node(i int) (key string, op *Expr, args int) {
	return p[i].leafKey(), p[i].op, int(p[i].args)
}

// Tensors lists the checkpoint tensors the expression reads, in order,
// each once: a leaf's own (Expr.Stored), else what find gives for its key.
func (p Packed) Tensors(find func(key string) *checkpoint.Tensor) []*checkpoint.Tensor {
	out := make([]*checkpoint.Tensor, 0, len(p))
	var seen map[*checkpoint.Tensor]bool // past a few leaves (a stack of experts)
	if len(p) > 8 {
		seen = make(map[*checkpoint.Tensor]bool, len(p))
	}
	for _, n := range p {
		if n.op != nil {
			continue
		}
		t := n.stored
		if t == nil {
			t = find(n.leafKey())
		}
		switch {
		case seen != nil:
			if seen[t] {
				continue
			}
			seen[t] = true
		case slices.Contains(out, t):
			continue
		}
		out = append(out, t)
	}
	return out
}
