package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// pluginLogger receives the plugins' stderr and go-plugin's own log. With
// -v every line shows, as hclog writes it; without, none of those raw lines
// ([WARN], [ERROR], timestamps) reach stderr, except a plugin's panic or
// fatal error, shown as strata's own lines: strata's error already says
// which call failed, the panic says why.
func pluginLogger(stderr io.Writer, verbose bool) hclog.Logger {
	if verbose {
		return hclog.New(&hclog.LoggerOptions{Name: "plugin", Output: stderr, Level: hclog.Debug})
	}
	return hclog.New(&hclog.LoggerOptions{Name: "plugin", Output: &crashLog{w: stderr, inPanic: map[string]bool{}},
		Level: hclog.Error, JSONFormat: true})
}

// crashLog keeps, of hclog's JSON lines, a plugin's panic and the stack
// trace after it (go-plugin logs both at error level, line by line).
type crashLog struct {
	mu      sync.Mutex
	w       io.Writer
	inPanic map[string]bool // by hclog module: one per plugin
}

func (l *crashLog) Write(b []byte) (int, error) {
	var e struct {
		Message string `json:"@message"`
		Module  string `json:"@module"`
	}
	if json.Unmarshal(b, &e) != nil {
		return len(b), nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if strings.HasPrefix(e.Message, "panic: ") || strings.HasPrefix(e.Message, "fatal error: ") {
		l.inPanic[e.Module] = true
	}
	if l.inPanic[e.Module] {
		name := e.Module[strings.LastIndex(e.Module, ".")+1:] // plugin.<name>.<binary>
		fmt.Fprintf(l.w, "strata: plugin %s: %s\n", name, e.Message)
	}
	return len(b), nil
}
