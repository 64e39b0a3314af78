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

	log    hclog.Logger
	id     *identity     // the binary's, for the describe cache (nil: unknown)
	ready  chan struct{} // closed once Desc or Err is known
	ctx    context.Context
	cancel context.CancelFunc // ends a start under way (Kill)
	// startMu is held while the process starts; started says it was
	// started (or must not be: it failed, or was killed).
	startMu  sync.Mutex
	started  bool
	startErr error // why ensure's start failed (Err is discovery's)
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

// Holds reports whether the plugin remembers m, sent whole by a call that
// succeeded: later calls send its id alone, and the caller may let go of
// m's inventory.
func (p *Plugin) Holds(m *pb.Model) bool {
	if m == nil || !p.Desc.GetRemembersModels() {
		return false
	}
	p.models.mu.Lock()
	defer p.models.mu.Unlock()
	_, ok := p.models.ids[weak.Make(m)]
	return ok
}

// newPlugin is candidate c, not started yet: Load describes it from the
// cache or starts it at once (describe); a call starts a plugin described
// from the cache (ensure). Kill ends either.
func newPlugin(ctx context.Context, c Candidate, opts Options) *Plugin {
	p := &Plugin{Candidate: c, timeout: opts.Timeout, log: opts.Logger, ready: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(ctx)
	return p
}

// describe starts the plugin and records what it describes, in p and in
// the cache: its success, or a failure that is the plugin's (not one of
// this run being stopped). ready is closed once Desc or Err is set.
func (p *Plugin) describe(cacheDir string) {
	defer close(p.ready)
	p.startMu.Lock()
	defer p.startMu.Unlock()
	p.started = true
	if err := p.ctx.Err(); err != nil {
		// Stopped before this goroutine ran (the command ended early): a
		// start now would be a process no Kill ends.
		p.Err = fmt.Errorf("plugin %s was stopped before it started: %w", p.Path, err)
		return
	}
	d, err := p.launch()
	p.Desc, p.Err = d, err
	if p.id != nil && p.ctx.Err() == nil {
		store(cacheDir, *p.id, d, err)
	}
}

// ensure starts a plugin Load described from the cache, before its first
// call; it returns the error the plugin failed with.
func (p *Plugin) ensure() error {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if !p.started {
		p.started = true
		_, p.startErr = p.launch()
	}
	switch {
	case p.Err != nil: // set before ready, never after
		return p.Err
	case p.startErr != nil:
		return p.startErr
	case p.arch == nil:
		return fmt.Errorf("plugin %s was stopped before it started", p.Path)
	}
	return nil
}

// launch starts the plugin process and asks it to describe itself; on
// failure the process is gone. p.startMu is held.
func (p *Plugin) launch() (*pb.DescribeResponse, error) {
	ctx := p.ctx
	// Contained: the plugin and whatever it starts end with strata, even
	// when strata is killed by SIGKILL (internal/contain).
	cmd := contain.Command(p.Path)
	cmd.Env = []string{sdk.HostPIDEnv + "=" + strconv.Itoa(os.Getpid())} // go-plugin adds the environment
	p.cmd = cmd
	p.client = goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: sdk.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			sdk.ProtocolVersion: {sdk.PluginName: &sdk.GRPCPlugin{}},
		},
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           p.log.Named(p.Name),
		StartTimeout:     p.timeout,
		GRPCDialOptions:  sdk.DialOptions(),
	})
	if err := p.connectUnless(ctx); err != nil {
		p.killed.Do(p.kill)
		return nil, fmt.Errorf("cannot start: %w", err)
	}
	var d *pb.DescribeResponse
	err := p.call(ctx, "Describe", func(ctx context.Context) (err error) {
		d, err = p.arch.Describe(ctx)
		return err
	})
	if err == nil {
		err = validate(d)
	}
	if err != nil {
		p.killed.Do(p.kill)
		return nil, err
	}
	return d, nil
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
		if pid := procstat.Child(os.Getpid(), p.Path); pid > 0 { // 0: not started yet, or gone
			for _, d := range procstat.Descendants(pid) {
				d.Kill()
			}
			killGroup(pid)
		}
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
	if err := p.ensure(); err != nil {
		return nil, err
	}
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
	if err := p.ensure(); err != nil {
		return nil, err
	}
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
	if err := p.ensure(); err != nil {
		return nil, err
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
	p.cancel()
	p.startMu.Lock() // a start under way ends with the cancel
	p.started = true
	p.startMu.Unlock()
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
