package sdk

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// GRPCPlugin binds Architecture to go-plugin: the plugin side serves Impl,
// the host side gets an Architecture that calls the plugin over gRPC.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Architecture
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the architecture service (plugin side).
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterArchitectureServer(s, &server{impl: p.Impl, log: hclog.Default()})
	return nil
}

// GRPCClient returns the host-side Architecture.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &client{rpc: pb.NewArchitectureClient(c)}, nil
}

// DialOptions raise the host's gRPC message limits to MaxMessageBytes.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxMessageBytes),
		grpc.MaxCallSendMsgSize(MaxMessageBytes),
	)}
}

// newGRPCServer raises the plugin's gRPC message limits; go-plugin's default
// server keeps gRPC's 4 MiB receive limit.
func newGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts, grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes))
	return grpc.NewServer(opts...)
}

// server adapts an Architecture to the generated gRPC service. A plugin
// error reaches the host as InvalidArgument with the plugin's message; a
// panic as Internal, with the stack in the plugin's log.
type server struct {
	pb.UnimplementedArchitectureServer
	impl   Architecture
	log    hclog.Logger
	models models
}

// models is the last model the host sent whole with an id: the host sends
// later calls its id alone (DescribeResponse.remembers_models).
type models struct {
	mu   sync.Mutex
	last *pb.Model
}

// resolve returns the model a request names: m itself when sent whole
// (remembered when it has an id), the remembered one when m is its id alone.
func (ms *models) resolve(m *pb.Model) (*pb.Model, error) {
	if m.GetId() == "" {
		return m, nil
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if len(m.GetConfigJson()) > 0 || len(m.GetTensors()) > 0 {
		ms.last = m
		return m, nil
	}
	if ms.last == nil || ms.last.GetId() != m.GetId() {
		return nil, status.Errorf(codes.FailedPrecondition, "the host named model %q, which it has not sent this plugin whole (a host bug)", m.GetId())
	}
	return ms.last, nil
}

func (s *server) Describe(ctx context.Context, _ *pb.DescribeRequest) (resp *pb.DescribeResponse, err error) {
	defer s.recover("Describe", &err)
	resp, err = s.impl.Describe(ctx)
	if resp != nil {
		resp.RemembersModels = true
	}
	return resp, asStatus(err)
}

func (s *server) Check(ctx context.Context, req *pb.CheckRequest) (resp *pb.CheckResponse, err error) {
	defer s.recover("Check", &err)
	if req.Model, err = s.models.resolve(req.GetModel()); err != nil {
		return nil, err
	}
	resp, err = s.impl.Check(ctx, req)
	return resp, asStatus(err)
}

func (s *server) Plan(ctx context.Context, req *pb.PlanRequest) (resp *pb.PlanResponse, err error) {
	defer s.recover("Plan", &err)
	if req.Model, err = s.models.resolve(req.GetModel()); err != nil {
		return nil, err
	}
	resp, err = s.impl.Plan(ctx, req)
	return resp, asStatus(err)
}

func (s *server) Build(ctx context.Context, req *pb.BuildRequest) (resp *pb.BuildResponse, err error) {
	defer s.recover("Build", &err)
	if req.Model, err = s.models.resolve(req.GetModel()); err != nil {
		return nil, err
	}
	resp, err = s.impl.Build(ctx, req)
	return resp, asStatus(err)
}

func (s *server) recover(call string, err *error) {
	if r := recover(); r != nil {
		s.log.Error("plugin panicked", "call", call, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		*err = status.Errorf(codes.Internal, "%s panicked: %v", call, r)
	}
}

func asStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// client adapts the generated gRPC client to Architecture.
type client struct {
	rpc pb.ArchitectureClient
}

func (c *client) Describe(ctx context.Context) (*pb.DescribeResponse, error) {
	resp, err := c.rpc.Describe(ctx, &pb.DescribeRequest{})
	return resp, fromStatus(err)
}

func (c *client) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	resp, err := c.rpc.Check(ctx, req)
	return resp, fromStatus(err)
}

func (c *client) Plan(ctx context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	resp, err := c.rpc.Plan(ctx, req)
	return resp, fromStatus(err)
}

func (c *client) Build(ctx context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error) {
	resp, err := c.rpc.Build(ctx, req)
	return resp, fromStatus(err)
}

// RPCError is an error returned by a plugin call: the plugin's own message
// for InvalidArgument, or a description of what went wrong with the call.
type RPCError struct {
	Code    codes.Code
	Message string
}

func (e *RPCError) Error() string {
	switch e.Code {
	case codes.InvalidArgument:
		return e.Message
	case codes.Unavailable, codes.Canceled:
		return "the plugin stopped responding (crashed or was killed): " + e.Message
	case codes.DeadlineExceeded:
		return "the plugin did not answer in time (hung?): " + e.Message
	case codes.Internal:
		return "internal plugin error: " + e.Message
	default:
		return fmt.Sprintf("%s: %s", e.Code, e.Message)
	}
}

func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	return &RPCError{Code: st.Code(), Message: st.Message()}
}
