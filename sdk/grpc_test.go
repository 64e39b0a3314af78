package sdk

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The server remembers the last model sent whole with an id and hands it
// out for that id alone; an id it was never sent is the host's bug, said so.
func TestModelsResolve(t *testing.T) {
	var ms models
	whole := &pb.Model{ConfigJson: []byte(`{}`), Tensors: []*pb.TensorInfo{{Key: "w"}}, Id: "m1"}
	anonymous := &pb.Model{ConfigJson: []byte(`{}`)}
	for _, step := range []struct {
		name string
		in   *pb.Model
		want *pb.Model
		code codes.Code
	}{
		{"unknown id", &pb.Model{Id: "m1"}, nil, codes.FailedPrecondition},
		{"no id: as sent", anonymous, anonymous, codes.OK},
		{"whole with an id", whole, whole, codes.OK},
		{"its id alone", &pb.Model{Id: "m1"}, whole, codes.OK},
		{"another id", &pb.Model{Id: "m2"}, nil, codes.FailedPrecondition},
		{"no id does not forget", &pb.Model{Id: "m1"}, whole, codes.OK},
	} {
		got, err := ms.resolve(step.in)
		if status.Code(err) != step.code || got != step.want {
			t.Errorf("%s: got %p, %v; want %p, code %v", step.name, got, err, step.want, step.code)
		}
	}
}
