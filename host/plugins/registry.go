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

	byType   map[string]*Plugin
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
}

// Load starts every plugin found in dirs, in parallel, and asks each what it
// handles. Plugins that fail keep their error; the others stay usable.
// Close must be called to stop them.
func Load(ctx context.Context, dirs []SearchDir, opts Options) *Registry {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	cands := Find(dirs)
	r := &Registry{Dirs: dirs, Plugins: make([]*Plugin, len(cands)), byType: map[string]*Plugin{}}
	var wg sync.WaitGroup
	for i, c := range cands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Plugins[i] = start(ctx, c, opts.Timeout, opts.Logger)
		}()
	}
	wg.Wait()
	r.index()
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

// For returns the plugin that handles modelType.
func (r *Registry) For(modelType string) (*Plugin, error) {
	if p, ok := r.byType[modelType]; ok {
		return p, nil
	}
	return nil, &NotFoundError{ModelType: modelType, Registry: r}
}

// ModelTypes lists every handled model_type, sorted.
func (r *Registry) ModelTypes() []string {
	out := make([]string, 0, len(r.byType))
	for mt := range r.byType {
		out = append(out, mt)
	}
	sort.Strings(out)
	return out
}

// StopOthers stops every plugin but keep, in the background: a command that
// has found its plugin needs no other (six plugins idled through a whole
// export). Close waits for them.
func (r *Registry) StopOthers(keep *Plugin) {
	for _, p := range r.Plugins {
		if p != nil && p != keep {
			r.stopping.Add(1)
			go func() { defer r.stopping.Done(); p.Kill() }()
		}
	}
}

// Close stops every plugin process.
func (r *Registry) Close() {
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
		if p.Err != nil {
			fmt.Fprintf(&b, "\n  plugin %s failed: %v", p.Path, p.Err)
		}
	}
	b.WriteString("\ninstall a plugin for it there, or point --plugin-dir at one")
	return b.String()
}
