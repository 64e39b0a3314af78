package plugins

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"

	"github.com/strata-llm/strata/internal/contain"
	"github.com/strata-llm/strata/internal/procstat"
	"github.com/strata-llm/strata/sdk"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Plugin is one started plugin process, or the error it failed with.
type Plugin struct {
	Candidate
	Desc *pb.DescribeResponse
	Err  error

	client  *goplugin.Client
	cmd     *exec.Cmd
	arch    sdk.Architecture
	timeout time.Duration
	// PeakRSS is the process's peak resident set size in bytes, read as it
	// is stopped (0 where the OS does not say).
	PeakRSS int64

	models sentModels
	killed sync.Once
}

// sentModels are the models a plugin that remembers_models has received
// whole, by the host's pointer to each, with the id they were sent under.
// Weak pointers: a model the host has let go of (GLM-4.6's inventory is
// 7 MB) is not kept alive by having been sent.
type sentModels struct {
	mu   sync.Mutex
	ids  map[weak.Pointer[pb.Model]]string
	next int
}

// model is what a call sends for m: m whole, under an id the first time,
// then that id alone, to a plugin that remembers models. done records a
// successful call: until one returns, concurrent calls send m whole too.
func (p *Plugin) model(m *pb.Model) (send *pb.Model, done func()) {
	if m == nil || !p.Desc.GetRemembersModels() {
		return m, func() {}
	}
	s := &p.models
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.ids[weak.Make(m)]; ok {
		return &pb.Model{Id: id}, func() {}
	}
	s.next++
	id := "m" + strconv.Itoa(s.next)
	return &pb.Model{ConfigJson: m.ConfigJson, Tensors: m.Tensors, Id: id}, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.ids == nil {
			s.ids = map[weak.Pointer[pb.Model]]string{}
		}
		if _, ok := s.ids[weak.Make(m)]; !ok {
			s.ids[weak.Make(m)] = id
		}
	}
}

// start launches the plugin and asks it to describe itself.
func start(ctx context.Context, c Candidate, timeout time.Duration, log hclog.Logger) *Plugin {
	p := &Plugin{Candidate: c, timeout: timeout}
	// Contained: the plugin and whatever it starts end with strata, even
	// when strata is killed by SIGKILL (internal/contain).
	cmd := contain.Command(c.Path)
	cmd.Env = []string{sdk.HostPIDEnv + "=" + strconv.Itoa(os.Getpid())} // go-plugin adds the environment
	p.cmd = cmd
	p.client = goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: sdk.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			sdk.ProtocolVersion: {sdk.PluginName: &sdk.GRPCPlugin{}},
		},
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           log.Named(c.Name),
		StartTimeout:     timeout,
		GRPCDialOptions:  sdk.DialOptions(),
	})
	if p.Err = p.connectUnless(ctx); p.Err != nil {
		p.Err = fmt.Errorf("cannot start: %w", p.Err)
		p.Kill()
		return p
	}
	p.Err = p.call(ctx, "Describe", func(ctx context.Context) (err error) {
		p.Desc, err = p.arch.Describe(ctx)
		return err
	})
	if p.Err == nil {
		p.Err = validate(p.Desc)
	}
	if p.Err != nil {
		p.Kill()
	}
	return p
}

// connectUnless is connect, given up when ctx is: go-plugin waits for the
// handshake (up to the start timeout) holding a lock its Kill needs, so
// the plugin's process group is killed here, its pid found by parent and
// path (go-plugin's exec.Cmd is not ours to read while it starts).
func (p *Plugin) connectUnless(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- p.connect() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	deadline := time.After(killGrace)
	for {
		pid := procstat.Child(os.Getpid(), p.Path)
		for _, d := range procstat.Descendants(pid) {
			d.Kill()
		}
		killGroup(pid)
		select {
		case <-done:
			return ctx.Err()
		case <-deadline:
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // not started yet: again
		}
	}
}

func (p *Plugin) connect() error {
	rpc, err := p.client.Client()
	if err != nil {
		return err
	}
	raw, err := rpc.Dispense(sdk.PluginName)
	if err != nil {
		return err
	}
	arch, ok := raw.(sdk.Architecture)
	if !ok {
		return fmt.Errorf("plugin served %T, not a strata architecture", raw)
	}
	p.arch = arch
	return nil
}

func validate(d *pb.DescribeResponse) error {
	if d.GetProtocolVersion() != sdk.ProtocolVersion {
		return fmt.Errorf("speaks plugin protocol %d, this strata speaks %d: rebuild the plugin against a matching sdk", d.GetProtocolVersion(), sdk.ProtocolVersion)
	}
	if d.GetName() == "" || len(d.GetArchitectures()) == 0 {
		return errors.New("describes no name or no architectures")
	}
	return nil
}

// call runs one RPC under the per-call timeout and names the plugin in errors.
func (p *Plugin) call(ctx context.Context, what string, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	err := fn(ctx)
	if err == nil {
		return nil
	}
	var rpc *sdk.RPCError
	// gRPC's own deadline timer may fire a moment before the context's.
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.As(err, &rpc) && rpc.Code == codes.DeadlineExceeded {
		return fmt.Errorf("plugin %s: %s did not answer within %s (hung?); raise --plugin-timeout if the model is very large", p.Path, what, p.timeout)
	}
	return fmt.Errorf("plugin %s: %s: %w", p.Path, what, err)
}

// Check asks whether the plugin can export the model.
// Calls that name the same *pb.Model send it once (Plugin.model); Plan and
// Build replace their request's Model with what they send.
func (p *Plugin) Check(ctx context.Context, m *pb.Model) (resp *pb.CheckResponse, err error) {
	send, done := p.model(m)
	err = p.call(ctx, "Check", func(ctx context.Context) error {
		resp, err = p.arch.Check(ctx, &pb.CheckRequest{Model: send})
		return err
	})
	if err == nil {
		done()
	}
	return resp, err
}

// Plan asks for the model's layers and parts.
func (p *Plugin) Plan(ctx context.Context, req *pb.PlanRequest) (resp *pb.PlanResponse, err error) {
	var done func()
	req.Model, done = p.model(req.GetModel())
	err = p.call(ctx, "Plan", func(ctx context.Context) error {
		resp, err = p.arch.Plan(ctx, req)
		return err
	})
	if err == nil {
		done()
	}
	return resp, err
}

// Build asks for one part.
func (p *Plugin) Build(ctx context.Context, req *pb.BuildRequest) (resp *pb.BuildResponse, err error) {
	what := "Build " + req.GetPart()
	if req.GetKind() != "" {
		what += " " + req.GetKind()
	}
	var done func()
	req.Model, done = p.model(req.GetModel())
	err = p.call(ctx, what, func(ctx context.Context) error {
		resp, err = p.arch.Build(ctx, req)
		return err
	})
	if err == nil {
		done()
	}
	return resp, err
}

// killGrace is how long a plugin has to exit when asked (go-plugin waits
// 2 s, then kills the plugin process, but not what it started).
const killGrace = 2500 * time.Millisecond

// Kill stops the plugin process (gracefully, then by force after 2 s),
// everything in its process group, and every process below it (by parent,
// where procfs shows them: also one in a session of its own). A child of the plugin that keeps the
// plugin's stdout open would leave go-plugin waiting for the pipe for ever:
// killing the group closes it.
// Only the first call acts: a second must not signal a process group
// whose number the system may have given to another.
func (p *Plugin) Kill() {
	p.killed.Do(p.kill)
}

func (p *Plugin) kill() {
	if p.client == nil {
		return
	}
	pid := 0
	var below []procstat.Proc
	if p.cmd.Process != nil {
		pid = p.cmd.Process.Pid
		if !p.client.Exited() {
			if rss, ok := procstat.PeakRSS(p.pluginPid(pid)); ok {
				p.PeakRSS = max(p.PeakRSS, rss)
			}
			// Before the plugin goes: then its children are orphans, no
			// longer found through it (one that left its process group for
			// a session of its own would survive killGroup).
			below = procstat.Descendants(pid)
		}
	}
	defer func() {
		for _, d := range below {
			d.Kill()
		}
	}()
	done := make(chan struct{})
	go func() { p.client.Kill(); close(done) }()
	select {
	case <-done:
	case <-time.After(killGrace):
	}
	killGroup(pid)
	select {
	case <-done:
	case <-time.After(killGrace):
		// Nothing of the group is left to hold a pipe; go-plugin's
		// goroutines end when the kernel closes it.
	}
}

// pluginPid is the plugin's own process: the shim's child when it runs
// contained (pid is the shim's), else pid.
func (p *Plugin) pluginPid(pid int) int {
	if contain.Contained(p.cmd) {
		if child := procstat.Child(pid, p.Path); child > 0 {
			return child
		}
	}
	return pid
}

// Support returns what the plugin says about modelType, if it handles it.
func (p *Plugin) Support(modelType string) (*pb.ArchitectureSupport, bool) {
	for _, a := range p.Desc.GetArchitectures() {
		if a.GetModelType() == modelType {
			return a, true
		}
	}
	return nil, false
}
