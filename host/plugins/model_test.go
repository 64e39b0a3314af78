package plugins

import (
	"testing"

	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// A plugin that remembers models gets each model whole once, then its id
// alone; until a call with it succeeds, it is sent whole. Others always get
// the model as it is.
func TestModelSentOnce(t *testing.T) {
	m := &pb.Model{ConfigJson: []byte(`{}`), Tensors: []*pb.TensorInfo{{Key: "w"}}}
	other := &pb.Model{ConfigJson: []byte(`{"x":1}`)}

	old := &Plugin{Desc: &pb.DescribeResponse{}}
	if send, done := old.model(m); send != m {
		t.Errorf("a plugin that does not remember got %v", send)
	} else {
		done()
	}
	if old.Holds(m) {
		t.Error("a plugin that does not remember models holds one")
	}

	p := &Plugin{Desc: &pb.DescribeResponse{RemembersModels: true}}
	first, done := p.model(m)
	if first.GetId() == "" || len(first.GetTensors()) != 1 || string(first.GetConfigJson()) != "{}" {
		t.Fatalf("first call sent %v", first)
	}
	if again, _ := p.model(m); again.GetId() == first.GetId() || len(again.GetTensors()) != 1 {
		t.Errorf("before the first call returned, a second sent %v", again)
	}
	if p.Holds(m) {
		t.Error("the plugin holds a model no call has succeeded with")
	}
	done()
	if !p.Holds(m) || p.Holds(other) {
		t.Errorf("after a call succeeded: holds m %v, holds another %v", p.Holds(m), p.Holds(other))
	}
	m.Tensors = nil // what the caller may do now: later calls send the id
	if later, _ := p.model(m); later.GetId() != first.GetId() || later.GetTensors() != nil || later.GetConfigJson() != nil {
		t.Errorf("after a call succeeded, sent %v, want id %s alone", later, first.GetId())
	}
	if o, _ := p.model(other); o.GetId() == first.GetId() || string(o.GetConfigJson()) != `{"x":1}` {
		t.Errorf("another model was sent as %v", o)
	}
	if m.GetId() != "" {
		t.Errorf("the caller's model was changed: id %q", m.GetId())
	}
}
