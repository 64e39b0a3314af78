package sdk

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// Serve runs impl as a strata plugin until the host stops it. It never
// returns. Run by hand, the binary explains that strata starts it.
//
// Logs go to stderr through hclog (the host shows them with --verbose);
// nothing may write to stdout, where go-plugin's handshake lives.
func Serve(impl Architecture) {
	logger := hclog.New(&hclog.LoggerOptions{
		Output:     os.Stderr,
		JSONFormat: true,
		Level:      hclog.Trace,
	})
	hclog.SetDefault(logger)
	go exitWithParent(hostPID(), time.Second)
	stopProfile := profileCPU(logger)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			ProtocolVersion: {PluginName: &GRPCPlugin{Impl: impl}},
		},
		GRPCServer: newGRPCServer,
		Logger:     logger,
	})
	stopProfile()
	os.Exit(0)
}

// HostPIDEnv names the variable in which the host tells a plugin its
// process id: a host killed before the plugin's main ran has already left
// it an orphan, whose parent id names the host no more.
const HostPIDEnv = "STRATA_HOST_PID"

// hostPID is the process id of the host that started this plugin.
func hostPID() int {
	if pid, err := strconv.Atoi(os.Getenv(HostPIDEnv)); err == nil && pid > 0 {
		return pid
	}
	return os.Getppid()
}

// exitWithParent ends the plugin when the host that started it is gone (it
// was SIGKILLed, or crashed), so no plugin process outlives its host.
func exitWithParent(parent int, every time.Duration) {
	for {
		if os.Getppid() != parent {
			os.Exit(3)
		}
		time.Sleep(every)
	}
}

// profileCPU writes a CPU profile of this plugin process to
// $STRATA_PLUGIN_CPUPROFILE.<pid> when that is set (strata's --cpuprofile
// covers the host alone); the returned func ends it.
func profileCPU(logger hclog.Logger) func() {
	prefix := os.Getenv("STRATA_PLUGIN_CPUPROFILE")
	if prefix == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s.%d", prefix, os.Getpid()))
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		logger.Error("STRATA_PLUGIN_CPUPROFILE", "error", err)
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}
