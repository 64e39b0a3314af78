package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// previousProtocolCommit is the last commit whose sdk/proto/pluginv1 lacks
// the fields protocol 1 gained since (options, models, position_ids_rank,
// inputs_embeds, extra_outputs, mtp): its plugins must keep working.
const previousProtocolCommit = "51febc6"

// A plugin built from the previous protocol-1 proto (the llama plugin of
// that commit, built from its own tree) still works with this host: it is
// found, described and exports the same model the current plugin does.
func TestPluginFromThePreviousProtocol(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	archive := exec.Command("git", "archive", "--format=tar", previousProtocolCommit)
	archive.Dir = testbin.Root()
	tarball, err := archive.Output()
	if err != nil {
		t.Fatalf("git archive %s (the test needs the repository's history): %v", previousProtocolCommit, err)
	}
	untar := exec.Command("tar", "-x", "-C", src)
	untar.Stdin = bytes.NewReader(tarball)
	if msg, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("untar: %v\n%s", err, msg)
	}
	oldDir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(oldDir, "strata-plugin-llama"), "./plugins/llama")
	build.Dir = src
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the previous llama plugin: %v\n%s", err, msg)
	}

	code, out, errOut := strata(t, "archs", "--plugin-dir", oldDir)
	if code != 0 || !strings.Contains(out, "llama 0.1.0") || !strings.Contains(out, "layerwise: yes") {
		t.Fatalf("archs with the previous plugin: exit %d\n%s%s", code, out, errOut)
	}
	fixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-f32-base", "model")
	// The graphs differ where the SDK's blocks changed since (Linear became
	// Gemm); the model's interface and its weights must not.
	specs, io := map[string][]byte{}, map[string]string{}
	for name, dir := range map[string]string{"previous": oldDir, "current": llamaDir} {
		outDir := filepath.Join(t.TempDir(), "out")
		if code, _, errOut := strata(t, "export", fixture, "--out", outDir, "--plugin-dir", dir, "--layerwise", "--subfunctions"); code != 0 {
			t.Fatalf("export with the %s plugin: exit %d: %s", name, code, errOut)
		}
		if specs[name], err = os.ReadFile(filepath.Join(outDir, "weight_spec.json")); err != nil {
			t.Fatal(err)
		}
		g := readModel(t, filepath.Join(outDir, "model.onnx")).GetGraph()
		var names []string
		for _, v := range append(g.GetInput(), g.GetOutput()...) {
			names = append(names, v.GetName()+" "+v.GetType().String())
		}
		io[name] = strings.Join(names, "\n")
	}
	if !bytes.Equal(specs["previous"], specs["current"]) {
		t.Error("the previous llama plugin's weight spec differs from the current one's")
	}
	if io["previous"] != io["current"] {
		t.Errorf("the previous llama plugin's model has another interface:\n%s\n---\n%s", io["previous"], io["current"])
	}
	requireNoProcesses(t, oldDir)
}
