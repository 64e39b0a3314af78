package plugins

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Registry is every discovered plugin, started and described, and which one
// handles each model_type.
type Registry struct {
	Dirs    []SearchDir
	Plugins []*Plugin // in precedence order; failed ones carry Err
	// Shadowed lists plugins that also claim a model_type an earlier
	// plugin already handles.
	Shadowed []Shadow

	byType   map[string]*Plugin // without Options.Lazy
	lazy     bool
	stopping sync.WaitGroup // StopOthers' kills
}

// Shadow records one model_type claimed by two plugins.
type Shadow struct {
	ModelType string
	Winner    *Plugin
	Loser     *Plugin
}

// Options for Load.
type Options struct {
	Timeout time.Duration // per start and per call
	Logger  hclog.Logger  // receives the plugins' stderr logs
	// Lazy: a plugin the describe cache in CacheDir knows is not started
	// until it is called, one it remembers failing is not started at all,
	// and For waits only for the plugins that precede its answer. Without
	// Lazy every plugin is started and described at once (strata archs),
	// and the cache updated.
	Lazy     bool
	CacheDir string // "": no describe cache
}

// Load finds the plugins in dirs and learns what each handles: from the
// describe cache (Lazy), else by starting it, all in parallel. Plugins that
// fail keep their error; the others stay usable. Without Lazy, Load
// returns once every plugin has answered or failed. Close must be called
// to stop them.
func Load(ctx context.Context, dirs []SearchDir, opts Options) *Registry {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	cands := Find(dirs)
	r := &Registry{Dirs: dirs, Plugins: make([]*Plugin, len(cands)), byType: map[string]*Plugin{}, lazy: opts.Lazy}
	for i, c := range cands {
		p := newPlugin(ctx, c, opts)
		r.Plugins[i] = p
		if id, ok := identityOf(c.Path); ok {
			p.id = &id
		}
		if opts.Lazy && p.id != nil {
			if d, failed := lookup(opts.CacheDir, *p.id); d != nil || failed != "" {
				p.Desc = d
				if failed != "" {
					p.Err = fmt.Errorf("%s (remembered from an earlier run until the binary changes; strata archs tries it again)", failed)
					p.started = true
				}
				close(p.ready)
				continue
			}
		}
		go p.describe(opts.CacheDir)
	}
	if !opts.Lazy {
		for _, p := range r.Plugins {
			<-p.ready
		}
		r.index()
	}
	return r
}

func (r *Registry) index() {
	for _, p := range r.Plugins {
		if p.Err != nil {
			continue
		}
		for _, a := range p.Desc.GetArchitectures() {
			mt := a.GetModelType()
			if winner, taken := r.byType[mt]; taken {
				r.Shadowed = append(r.Shadowed, Shadow{mt, winner, p})
				continue
			}
			r.byType[mt] = p
		}
	}
}

// For returns the plugin that handles modelType: the first, in precedence
// order, that claims it. Lazy, it waits for the plugins before that one
// alone: a plugin after it, hung or slow, does not delay the command.
func (r *Registry) For(modelType string) (*Plugin, error) {
	if !r.lazy {
		if p, ok := r.byType[modelType]; ok {
			return p, nil
		}
		return nil, &NotFoundError{ModelType: modelType, Registry: r}
	}
	for _, p := range r.Plugins {
		<-p.ready // closes when the start ends, also when it is stopped
		if _, ok := p.Support(modelType); ok && p.Err == nil {
			go p.ensure() // known from the cache: starts while the caller prepares its first call
			return p, nil
		}
	}
	return nil, &NotFoundError{ModelType: modelType, Registry: r}
}

// ModelTypes lists every model_type the plugins described so far handle,
// sorted.
func (r *Registry) ModelTypes() []string {
	seen := map[string]bool{}
	for _, p := range r.Plugins {
		select {
		case <-p.ready:
		default:
			continue // still starting
		}
		if p.Err == nil {
			for _, a := range p.Desc.GetArchitectures() {
				seen[a.GetModelType()] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for mt := range seen {
		out = append(out, mt)
	}
	sort.Strings(out)
	return out
}

// StopOthers stops every plugin but keep, in the background: a command that
// has found its plugin needs no other (six plugins idled through a whole
// export). One still describing itself is let finish first, so that the
// describe cache learns it, unless Close comes first. Close waits for them.
func (r *Registry) StopOthers(keep *Plugin) {
	for _, p := range r.Plugins {
		if p != nil && p != keep {
			r.stopping.Add(1)
			go func() {
				defer r.stopping.Done()
				if p.ready != nil {
					<-p.ready
				}
				p.Kill()
			}()
		}
	}
}

// Close stops every plugin process, a start under way too.
func (r *Registry) Close() {
	for _, p := range r.Plugins {
		if p != nil && p.cancel != nil {
			p.cancel() // ends a start under way, which StopOthers may wait for
		}
	}
	r.stopping.Wait()
	var wg sync.WaitGroup
	for _, p := range r.Plugins {
		if p != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.Kill() }()
		}
	}
	wg.Wait()
}

// PeakRSS is the largest peak resident set size of the plugins stopped so
// far, in bytes.
func (r *Registry) PeakRSS() int64 {
	var peak int64
	for _, p := range r.Plugins {
		if p != nil {
			peak = max(peak, p.PeakRSS)
		}
	}
	return peak
}

// NotFoundError says no plugin handles a model_type, and where strata looked.
type NotFoundError struct {
	ModelType string
	Registry  *Registry
}

func (e *NotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no plugin handles model_type %s", e.ModelType)
	if types := e.Registry.ModelTypes(); len(types) > 0 {
		fmt.Fprintf(&b, " (plugins found handle: %s)", strings.Join(types, ", "))
	}
	b.WriteString("; looked for strata-plugin-* in:")
	for _, d := range e.Registry.Dirs {
		fmt.Fprintf(&b, "\n  %s (%s)", d.Dir, d.Source)
	}
	for _, p := range e.Registry.Plugins {
		if p.ready != nil {
			<-p.ready // For has waited for every plugin before it fails
		}
		if p.Err != nil {
			fmt.Fprintf(&b, "\n  plugin %s failed: %v", p.Path, p.Err)
		}
	}
	b.WriteString("\ninstall a plugin for it there, or point --plugin-dir at one")
	return b.String()
}
