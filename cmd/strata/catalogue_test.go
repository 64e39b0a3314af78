package main

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/strata-llm/strata/host/convert"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/internal/testbin"
)

// The catalogue of hostile inputs of issue 11 and their neighbours: each
// case builds a scene under a fresh root, runs strata, and asserts the
// error, that nothing outside the output directory (for a refusal: nothing
// at all) changed by byte or by inode, and that no plugin process is left.

// tree is a snapshot of every path under a root: type, device, inode, mode,
// size, content hash or link target; links are never followed.
func tree(t *testing.T, root, skip string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if skip != "" && (p == skip || strings.HasPrefix(p, skip+string(filepath.Separator))) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		st := info.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v dev=%d ino=%d size=%d", info.Mode(), st.Dev, st.Ino, info.Size())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case info.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			sum := sha256.Sum256(data)
			desc += " sha256=" + hex.EncodeToString(sum[:8])
		}
		out[p] = desc
		return nil
	})
	return out
}

func sameTree(t *testing.T, before, after map[string]string) {
	t.Helper()
	var diffs []string
	for p, d := range before {
		if after[p] != d {
			diffs = append(diffs, fmt.Sprintf("%s: %s -> %q", p, d, after[p]))
		}
	}
	for p, d := range after {
		if _, ok := before[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: new %s", p, d))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Errorf("changed:\n  %s", strings.Join(diffs, "\n  "))
	}
}

// tiny writes a copy of the tiny Llama into dir.
func tiny(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config.json", "generation_config.json", "model.safetensors"} {
		data, err := os.ReadFile(filepath.Join(tinyLlama, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func put(t *testing.T, path, data string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	must(t, os.WriteFile(path, []byte(data), 0o644))
}

type scene struct {
	args []string // after "strata"
	out  string   // the output directory
	// check runs after a successful run.
	check func(t *testing.T)
	// release undoes what the scene holds (a lock).
	release func()
}

type catalogueCase struct {
	name  string
	setup func(t *testing.T, root string, plugins string) scene
	want  string // in stderr; "" for success
	// outMayChange: the output directory is left out of the comparison
	// even on a refusal (compile's is not under host/outdir yet and is
	// created before the model is read).
	outMayChange bool
}

func exportScene(src, out string, plugins string, flags ...string) scene {
	return scene{args: append([]string{"export", src, "--out", out, "--plugin-dir", plugins}, flags...), out: out}
}

// earlier runs an export into out first, for cases that tamper with one.
func earlier(t *testing.T, src, out, plugins string, flags ...string) {
	t.Helper()
	args := append([]string{"export", src, "--out", out, "--plugin-dir", plugins}, flags...)
	if code, _, errOut := strata(t, args...); code != 0 {
		t.Fatalf("the earlier export failed: %s", errOut)
	}
}

func catalogue() []catalogueCase {
	var cases []catalogueCase
	add := func(c catalogueCase) { cases = append(cases, c) }
	compileScene := func(src, out, plugins string, flags ...string) scene {
		return scene{args: append([]string{"compile", src, "--out", out, "--dry-run", "--plugin-dir", plugins}, flags...), out: out}
	}

	// 1. The source named like an output entry, --out its parent.
	for _, tc := range []struct{ dirName, flag string }{
		{"checkpoint", ""}, {"checkpoint", "--link=copy"}, {"windows", "--layerwise"},
		{"weights", "--weights=materialize"}, {"weights", ""},
	} {
		add(catalogueCase{name: fmt.Sprintf("source named %s, --out its parent %s", tc.dirName, tc.flag), want: "contains the source",
			setup: func(t *testing.T, root, plugins string) scene {
				src := tiny(t, filepath.Join(root, "parent", tc.dirName))
				var flags []string
				if tc.flag != "" {
					flags = append(flags, tc.flag)
				}
				return exportScene(src, filepath.Join(root, "parent"), plugins, flags...)
			}})
	}
	add(catalogueCase{name: "--out is the source", want: "is the source", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		return exportScene(src, src, plugins)
	}})
	add(catalogueCase{name: "--out is the source through a symlink", want: "is the source", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		must(t, os.Symlink(src, filepath.Join(root, "alias")))
		return exportScene(src, filepath.Join(root, "alias"), plugins)
	}})
	add(catalogueCase{name: "--out holds the source through a symlinked parent", want: "contains the source", setup: func(t *testing.T, root, plugins string) scene {
		tiny(t, filepath.Join(root, "real", "checkpoint"))
		must(t, os.Symlink(filepath.Join(root, "real"), filepath.Join(root, "alias")))
		return exportScene(filepath.Join(root, "alias", "checkpoint"), filepath.Join(root, "real"), plugins)
	}})
	add(catalogueCase{name: "--out inside the source (nothing collides)", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		s := exportScene(src, filepath.Join(src, "exported"), plugins)
		s.check = func(t *testing.T) { mustExist(t, filepath.Join(src, "exported", "model.onnx")) }
		return s
	}})
	// 2. An earlier output whose checkpoint/ is a symlink into the source.
	add(catalogueCase{name: "earlier output's checkpoint/ is a symlink to the source", want: "checkpoint", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins)
		must(t, os.RemoveAll(filepath.Join(out, "checkpoint")))
		must(t, os.Symlink(src, filepath.Join(out, "checkpoint")))
		return exportScene(src, out, plugins, "--link=copy")
	}})
	add(catalogueCase{name: "earlier output's shard link replaced by a symlink to the source", want: "checkpoint/model.safetensors", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins)
		shard := filepath.Join(out, "checkpoint", "model.safetensors")
		must(t, os.Remove(shard))
		must(t, os.Symlink(filepath.Join(src, "model.safetensors"), shard))
		return exportScene(src, out, plugins, "--link=copy")
	}})
	add(catalogueCase{name: "earlier output's weights/ is a symlink to the source", want: "weights", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins, "--weights=materialize")
		must(t, os.RemoveAll(filepath.Join(out, "weights")))
		must(t, os.Symlink(src, filepath.Join(out, "weights")))
		return exportScene(src, out, plugins, "--weights=materialize")
	}})
	// 3. Foreign files under every name strata writes.
	for _, name := range []string{"model.onnx", "weight_spec.json", "export-manifest.json", "weight_spec_qaic.json",
		"checkpoint/model.safetensors", "windows/window_0_0.onnx", "weights/model.safetensors", "checkpoint", "windows", "weights"} {
		add(catalogueCase{name: "foreign " + name + " in --out", want: strings.Split(name, "/")[0], setup: func(t *testing.T, root, plugins string) scene {
			src := tiny(t, filepath.Join(root, "src"))
			out := filepath.Join(root, "out")
			put(t, filepath.Join(out, name), "the user's")
			return exportScene(src, out, plugins, "--layerwise", "--keep-windows", "--weights=materialize")
		}})
	}
	for _, name := range []string{"model.onnx", "checkpoint/model.safetensors", "weights/model.safetensors", "weight_spec.json"} {
		add(catalogueCase{name: "earlier export's " + name + " rewritten by the user", want: name, setup: func(t *testing.T, root, plugins string) scene {
			src := tiny(t, filepath.Join(root, "src"))
			out := filepath.Join(root, "out")
			earlier(t, src, out, plugins, "--weights=materialize", "--link=copy")
			put(t, filepath.Join(out, name), "the user's now")
			return exportScene(src, out, plugins, "--weights=materialize", "--link=copy")
		}})
	}
	// --overwrite takes over strata's own files that changed, where that
	// touches nothing else, and nothing the manifest does not record.
	for _, tc := range []struct {
		name, want string
		tamper     func(t *testing.T, root, src, out string)
	}{
		{"a changed model.onnx is replaced", "", func(t *testing.T, root, src, out string) {
			put(t, filepath.Join(out, "model.onnx"), "damaged")
		}},
		{"a shard link replaced by a symlink to the source is replaced, the source untouched", "", func(t *testing.T, root, src, out string) {
			shard := filepath.Join(out, "checkpoint", "model.safetensors")
			must(t, os.Remove(shard))
			must(t, os.Symlink(filepath.Join(src, "model.safetensors"), shard))
		}},
		{"a changed file hard-linked outside is refused", "weight_spec.json", func(t *testing.T, root, src, out string) {
			spec := filepath.Join(out, "weight_spec.json")
			must(t, os.Remove(spec))
			put(t, filepath.Join(root, "outside"), "the user's")
			must(t, os.Link(filepath.Join(root, "outside"), spec))
		}},
		{"a foreign file is still refused", "notes.txt", func(t *testing.T, root, src, out string) {
			put(t, filepath.Join(out, "notes.txt"), "mine")
		}},
		{"a replaced checkpoint/ directory is still refused", "checkpoint", func(t *testing.T, root, src, out string) {
			// (moved away, not removed: a new directory could reuse its inode)
			must(t, os.Rename(filepath.Join(out, "checkpoint"), filepath.Join(root, "moved")))
			put(t, filepath.Join(out, "checkpoint", "model.safetensors"), "mine")
		}},
	} {
		add(catalogueCase{name: "--overwrite: " + tc.name, want: tc.want, setup: func(t *testing.T, root, plugins string) scene {
			src := tiny(t, filepath.Join(root, "src"))
			out := filepath.Join(root, "out")
			earlier(t, src, out, plugins, "--link=copy")
			tc.tamper(t, root, src, out)
			s := exportScene(src, out, plugins, "--link=copy", "--overwrite")
			if tc.want != "" {
				return s
			}
			s.check = func(t *testing.T) {
				if code, text, errOut := strata(t, "check", out); code != 0 {
					t.Errorf("check after --overwrite: exit %d\n%s%s", code, text, errOut)
				}
			}
			return s
		}})
	}
	add(catalogueCase{name: "a changed file of an earlier export: the refusal names --overwrite", want: "--overwrite", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins, "--link=copy")
		put(t, filepath.Join(out, "model.onnx"), "damaged")
		return exportScene(src, out, plugins, "--link=copy")
	}})
	add(catalogueCase{name: "a file added inside an earlier export's checkpoint/", want: "checkpoint/notes.txt", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins)
		put(t, filepath.Join(out, "checkpoint", "notes.txt"), "mine")
		return exportScene(src, out, plugins)
	}})
	add(catalogueCase{name: "a re-export of strata's own output", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins, "--weights=materialize", "--layerwise", "--keep-windows")
		return exportScene(src, out, plugins, "--link=copy")
	}})
	// Control files strata did not write (issue 30), judged by what they
	// are: export and compile refuse, writing and removing nothing.
	for _, tc := range []struct{ name, file, want string }{
		{"a foreign .strata-lock", ".strata-lock", "does not hold what strata writes"},
		{"a .strata-lock hard-linked to a file outside", ".strata-lock", "2 hard links"},
		{"a .strata-lock symlinked to a file outside", ".strata-lock", "is a symlink"},
		{"a foreign .strata-owned.json", ".strata-owned.json", "does not hold what strata writes"},
		{"a foreign .strata-owned.json.new", ".strata-owned.json.new", "does not hold what strata writes"},
		{"a .strata-owned.json.new hard-linked to a file outside", ".strata-owned.json.new", "2 hard links"},
		{"a .strata-owned.lock hard-linked to a file outside", ".strata-owned.lock", "2 hard links"},
	} {
		for _, cmd := range []string{"export", "compile"} {
			add(catalogueCase{name: cmd + ": " + tc.name, want: tc.want, setup: func(t *testing.T, root, plugins string) scene {
				src := tiny(t, filepath.Join(root, "src"))
				out, outside := filepath.Join(root, "out"), filepath.Join(root, "outside")
				must(t, os.MkdirAll(out, 0o755))
				target := filepath.Join(out, tc.file)
				switch {
				case strings.Contains(tc.name, "hard-linked"):
					put(t, outside, "")
					must(t, os.Link(outside, target))
				case strings.Contains(tc.name, "symlinked"):
					put(t, outside, "")
					must(t, os.Symlink(outside, target))
				default:
					put(t, target, "the user's notes")
				}
				if cmd == "compile" {
					return compileScene(src, out, plugins)
				}
				return exportScene(src, out, plugins)
			}})
		}
	}
	add(catalogueCase{name: "an earlier export's .strata-owned.json hard-linked outside", want: "2 hard links", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins)
		must(t, os.Link(filepath.Join(out, ".strata-owned.json"), filepath.Join(root, "outside")))
		return exportScene(src, out, plugins)
	}})
	// 4. Special files as checkpoint data.
	for _, tc := range []struct{ name, file, want string }{
		{"a FIFO as the shard", "model.safetensors", "named pipe"},
		{"a FIFO as config.json", "config.json", "named pipe"},
		{"a FIFO as the index", "model.safetensors.index.json", "named pipe"},
	} {
		for _, cmd := range []string{"export", "inspect"} {
			add(catalogueCase{name: cmd + ": " + tc.name, want: tc.want, setup: func(t *testing.T, root, plugins string) scene {
				src := tiny(t, filepath.Join(root, "src"))
				os.Remove(filepath.Join(src, tc.file))
				must(t, syscall.Mkfifo(filepath.Join(src, tc.file), 0o644))
				if cmd == "inspect" {
					return scene{args: []string{"inspect", src, "--plugin-dir", plugins}}
				}
				return exportScene(src, filepath.Join(root, "out"), plugins)
			}})
		}
	}
	add(catalogueCase{name: "a FIFO named by the index", want: "named pipe", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		must(t, os.Rename(filepath.Join(src, "model.safetensors"), filepath.Join(src, "model-00001-of-00002.safetensors")))
		must(t, syscall.Mkfifo(filepath.Join(src, "model-00002-of-00002.safetensors"), 0o644))
		put(t, filepath.Join(src, "model.safetensors.index.json"), `{"weight_map":{"model.norm.weight":"model-00002-of-00002.safetensors"}}`)
		return exportScene(src, filepath.Join(root, "out"), plugins)
	}})
	add(catalogueCase{name: "a character device as the shard", want: "character device", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		must(t, os.Remove(filepath.Join(src, "model.safetensors")))
		must(t, os.Symlink("/dev/zero", filepath.Join(src, "model.safetensors")))
		return exportScene(src, filepath.Join(root, "out"), plugins)
	}})
	add(catalogueCase{name: "a directory as the shard", want: "a directory", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		must(t, os.Remove(filepath.Join(src, "model.safetensors")))
		must(t, os.Mkdir(filepath.Join(src, "model.safetensors"), 0o755))
		return exportScene(src, filepath.Join(root, "out"), plugins)
	}})
	// 9. The Hugging Face cache layout: snapshots/<rev>/x -> ../../blobs/<sha>.
	for _, link := range []string{"hardlink", "copy"} {
		add(catalogueCase{name: "Hugging Face cache layout, --link " + link, setup: func(t *testing.T, root, plugins string) scene {
			snap := hfCache(t, root)
			out := filepath.Join(root, "out")
			s := exportScene(snap, out, plugins, "--link="+link)
			s.check = func(t *testing.T) {
				shard := filepath.Join(out, "checkpoint", "model.safetensors")
				got, err := os.Lstat(shard)
				if err != nil || !got.Mode().IsRegular() {
					t.Fatalf("%s is not a regular file: %v", shard, err)
				}
				blob, _ := os.Stat(filepath.Join(snap, "model.safetensors"))
				if same := os.SameFile(got, blob); same != (link == "hardlink") {
					t.Errorf("--link %s: shard is the blob: %v", link, same)
				}
				if got.Mode().Perm()&0o044 != 0o044 {
					t.Errorf("shard mode %v, want 0644 less the umask", got.Mode().Perm())
				}
			}
			return s
		}})
	}
	// A Hugging Face cache's ref that is no small regular file (issue 30:
	// a FIFO hung, /dev/zero grew to 8 GB, 200 MB were read).
	for _, tc := range []struct{ name, want string }{
		{"a FIFO", "named pipe"}, {"/dev/zero", "character device"}, {"200 MB", "more than the 4096"},
	} {
		add(catalogueCase{name: "Hugging Face cache: refs/main is " + tc.name, want: tc.want, setup: func(t *testing.T, root, plugins string) scene {
			snap := hfCache(t, root)
			repo := filepath.Dir(filepath.Dir(snap))
			ref := filepath.Join(repo, "refs", "main")
			must(t, os.MkdirAll(filepath.Dir(ref), 0o755))
			switch tc.name {
			case "a FIFO":
				must(t, syscall.Mkfifo(ref, 0o644))
			case "/dev/zero":
				must(t, os.Symlink("/dev/zero", ref))
			default:
				put(t, ref, "")
				must(t, os.Truncate(ref, 200<<20))
			}
			return exportScene(repo, filepath.Join(root, "out"), plugins)
		}})
	}
	// 7. Two exports into one directory at once.
	add(catalogueCase{name: "a second export into a directory being written", want: "another strata process", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlier(t, src, out, plugins)
		d, err := outdir.Open(context.Background(), out, outdir.Options{Tool: "export"})
		must(t, err)
		s := exportScene(src, out, plugins)
		s.release = func() { d.Close() }
		return s
	}})
	// 3. convert-bin.
	binSrc := func(t *testing.T, root string) string {
		dst := filepath.Join(root, "bin")
		must(t, os.MkdirAll(dst, 0o755))
		src := filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model-bin")
		entries, _ := os.ReadDir(src)
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(src, e.Name()))
			must(t, err)
			must(t, os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644))
		}
		return dst
	}
	add(catalogueCase{name: "convert-bin --out a Hugging Face checkpoint", want: "did not write", setup: func(t *testing.T, root, plugins string) scene {
		src := binSrc(t, root)
		hf := tiny(t, filepath.Join(root, "hf"))
		return scene{args: []string{"convert-bin", src, "--out", hf}, out: hf}
	}})
	add(catalogueCase{name: "convert-bin --out the source", want: "is the source", setup: func(t *testing.T, root, plugins string) scene {
		src := binSrc(t, root)
		return scene{args: []string{"convert-bin", src, "--out", src}, out: src}
	}})
	add(catalogueCase{name: "convert-bin --out holding the source", want: "contains the source", setup: func(t *testing.T, root, plugins string) scene {
		src := binSrc(t, root)
		return scene{args: []string{"convert-bin", src, "--out", root}, out: root}
	}})
	for _, name := range []string{"model-00001-of-00002.safetensors", "model.safetensors.index.json", "config.json", "strata-converted-from.json", "notes.txt"} {
		add(catalogueCase{name: "convert-bin: foreign " + name + " in --out", want: name, setup: func(t *testing.T, root, plugins string) scene {
			src := binSrc(t, root)
			out := filepath.Join(root, "out")
			put(t, filepath.Join(out, name), "{}")
			return scene{args: []string{"convert-bin", src, "--out", out}, out: out}
		}})
	}
	for _, file := range []string{"pytorch_model-00001-of-00002.bin", "pytorch_model.bin.index.json"} {
		add(catalogueCase{name: "convert-bin: a FIFO as " + file, want: "named pipe", setup: func(t *testing.T, root, plugins string) scene {
			src := binSrc(t, root)
			must(t, os.Remove(filepath.Join(src, file)))
			must(t, syscall.Mkfifo(filepath.Join(src, file), 0o644))
			return scene{args: []string{"convert-bin", src, "--out", filepath.Join(root, "out")}, out: filepath.Join(root, "out")}
		}})
	}
	add(catalogueCase{name: "convert-bin: a pickled view of negative shape", want: "negative size or stride", setup: func(t *testing.T, root, plugins string) scene {
		src := filepath.Join(root, "neg")
		must(t, os.MkdirAll(src, 0o755))
		must(t, os.WriteFile(filepath.Join(src, "pytorch_model.bin"), negativeShapeBin(t), 0o644))
		return scene{args: []string{"convert-bin", src, "--out", filepath.Join(root, "out")}, out: filepath.Join(root, "out")}
	}})
	// 4. convert: one layer at a time into a directory of its own.
	convertScene := func(src, out, plugins string, flags ...string) scene {
		return scene{args: append([]string{"convert", src, "--out", out, "--plugin-dir", plugins}, flags...), out: out}
	}
	earlierConvert := func(t *testing.T, src, out, plugins string) {
		t.Helper()
		if code, _, errOut := strata(t, convertScene(src, out, plugins, "--dtype", "float32").args...); code != 0 {
			t.Fatalf("the earlier convert failed: %s", errOut)
		}
	}
	add(catalogueCase{name: "convert --out a Hugging Face checkpoint", want: "did not write", setup: func(t *testing.T, root, plugins string) scene {
		return convertScene(tiny(t, filepath.Join(root, "src")), tiny(t, filepath.Join(root, "hf")), plugins)
	}})
	add(catalogueCase{name: "convert --out the source", want: "is the source", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		return convertScene(src, src, plugins)
	}})
	// --out inside the source, also through a symlink or a bind mount
	// (issue 30): export's check (host/outdir), judged by identity.
	for _, how := range []string{"directly", "through a symlink", "through a symlinked parent", "through a bind mount"} {
		add(catalogueCase{name: "convert --out inside the source " + how, want: "lies inside the source", setup: func(t *testing.T, root, plugins string) scene {
			src := tiny(t, filepath.Join(root, "src"))
			return convertScene(src, filepath.Join(aliasOf(t, root, src, how), "conv"), plugins)
		}})
	}
	add(catalogueCase{name: "export --out the source through a bind mount", want: "is the source", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		return exportScene(src, aliasOf(t, root, src, "through a bind mount"), plugins)
	}})
	add(catalogueCase{name: "export --out holding the source through a bind mount", want: "contains the source", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "parent", "src"))
		return exportScene(src, aliasOf(t, root, filepath.Join(root, "parent"), "through a bind mount"), plugins)
	}})
	add(catalogueCase{name: "convert --out holding the source", want: "contains the source", setup: func(t *testing.T, root, plugins string) scene {
		return convertScene(tiny(t, filepath.Join(root, "parent", "weights")), filepath.Join(root, "parent"), plugins)
	}})
	add(catalogueCase{name: "convert --out an export", want: "strata export", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		earlier(t, src, filepath.Join(root, "exp"), plugins)
		return convertScene(src, filepath.Join(root, "exp"), plugins)
	}})
	add(catalogueCase{name: "export into a convert output", want: "strata convert", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		earlierConvert(t, src, filepath.Join(root, "conv"), plugins)
		return exportScene(src, filepath.Join(root, "conv"), plugins)
	}})
	for _, name := range []string{"model-layer-00000.safetensors", "model-tail.safetensors", "model.safetensors.index.json", "config.json", "convert-report.json", "tokenizer.json", "convert-manifest/run.json", "convert-manifest/layer-00000.json"} {
		add(catalogueCase{name: "convert: foreign " + name + " in --out", want: strings.Split(name, "/")[0], setup: func(t *testing.T, root, plugins string) scene {
			out := filepath.Join(root, "out")
			put(t, filepath.Join(out, name), "{}")
			return convertScene(tiny(t, filepath.Join(root, "src")), out, plugins)
		}})
	}
	add(catalogueCase{name: "convert: earlier conversion's convert-manifest/ is a symlink to the source", want: "convert-manifest", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlierConvert(t, src, out, plugins)
		must(t, os.RemoveAll(filepath.Join(out, "convert-manifest")))
		must(t, os.Symlink(src, filepath.Join(out, "convert-manifest")))
		return convertScene(src, out, plugins, "--dtype", "float32")
	}})
	add(catalogueCase{name: "convert: earlier conversion's layer shard replaced by a symlink to the source", want: "model-layer-00000.safetensors", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlierConvert(t, src, out, plugins)
		shard := filepath.Join(out, "model-layer-00000.safetensors")
		must(t, os.Remove(shard))
		must(t, os.Symlink(filepath.Join(src, "model.safetensors"), shard))
		return convertScene(src, out, plugins, "--dtype", "float32")
	}})
	add(catalogueCase{name: "convert: a FIFO as the shard", want: "named pipe", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		must(t, os.Remove(filepath.Join(src, "model.safetensors")))
		must(t, syscall.Mkfifo(filepath.Join(src, "model.safetensors"), 0o644))
		return convertScene(src, filepath.Join(root, "out"), plugins)
	}})
	add(catalogueCase{name: "convert: Hugging Face cache layout", setup: func(t *testing.T, root, plugins string) scene {
		out := filepath.Join(root, "out")
		s := convertScene(hfCache(t, root), out, plugins, "--dtype", "bfloat16")
		s.check = func(t *testing.T) {
			info, err := os.Stat(filepath.Join(out, "model-layer-00000.safetensors"))
			if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o044 != 0o044 {
				t.Errorf("converted shard: %v %v", err, info)
			}
			mustExist(t, filepath.Join(out, convert.IndexFile))
		}
		return s
	}})
	add(catalogueCase{name: "convert re-run over its own conversion", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		earlierConvert(t, src, out, plugins)
		must(t, os.Remove(filepath.Join(out, "model-layer-00001.safetensors")))
		s := convertScene(src, out, plugins, "--dtype", "float32")
		s.check = func(t *testing.T) { mustExist(t, filepath.Join(out, "model-layer-00001.safetensors")) }
		return s
	}})
	add(catalogueCase{name: "a convert into a directory another convert is writing (other layers)", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		d, err := outdir.Open(context.Background(), out, outdir.Options{Tool: "convert", Shared: true})
		must(t, err)
		s := convertScene(src, out, plugins, "--layers", "0-0")
		s.release = func() { d.Close() }
		return s
	}})
	add(catalogueCase{name: "compile: a FIFO as model.onnx", want: "named pipe", setup: func(t *testing.T, root, plugins string) scene {
		exp := filepath.Join(root, "export")
		must(t, os.MkdirAll(exp, 0o755))
		must(t, syscall.Mkfifo(filepath.Join(exp, "model.onnx"), 0o644))
		return scene{args: []string{"compile", exp, "--out", filepath.Join(root, "out"), "--dry-run", "--plugin-dir", plugins}, out: filepath.Join(root, "out")}
	}})
	// 5. compile.
	add(catalogueCase{name: "compile --out a Hugging Face checkpoint", want: "did not write", setup: func(t *testing.T, root, plugins string) scene {
		return compileScene(tiny(t, filepath.Join(root, "src")), tiny(t, filepath.Join(root, "hf")), plugins)
	}})
	add(catalogueCase{name: "compile --out the export it compiles", want: "is the source", setup: func(t *testing.T, root, plugins string) scene {
		exp := filepath.Join(root, "exp")
		earlier(t, tiny(t, filepath.Join(root, "src")), exp, plugins)
		return compileScene(exp, exp, plugins)
	}})
	add(catalogueCase{name: "compile --out holding the checkpoint", want: "contains the source", setup: func(t *testing.T, root, plugins string) scene {
		return compileScene(tiny(t, filepath.Join(root, "parent", "ckpt")), filepath.Join(root, "parent"), plugins)
	}})
	add(catalogueCase{name: "compile --out holding the checkpoint as export/", want: "did not write", setup: func(t *testing.T, root, plugins string) scene {
		return compileScene(tiny(t, filepath.Join(root, "parent", "export")), filepath.Join(root, "parent"), plugins)
	}})
	for _, name := range []string{"compile.sh", "specializations.json", "custom_io.yaml", "qpc/programqpc.bin", "export/model.onnx", "windows/window_0_1/compile.sh", "model.optimized.onnx"} {
		add(catalogueCase{name: "compile: foreign " + name + " in --out", want: strings.Split(name, "/")[0], setup: func(t *testing.T, root, plugins string) scene {
			out := filepath.Join(root, "out")
			put(t, filepath.Join(out, name), "#!/bin/sh\n")
			return compileScene(tiny(t, filepath.Join(root, "src")), out, plugins)
		}})
	}
	add(catalogueCase{name: "compile: an earlier compile's export/ replaced by a symlink to the source", want: "export", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		if code, _, errOut := strata(t, compileScene(src, out, plugins).args...); code != 0 {
			t.Fatal(errOut)
		}
		must(t, os.RemoveAll(filepath.Join(out, "export")))
		must(t, os.Symlink(src, filepath.Join(out, "export")))
		return compileScene(src, out, plugins)
	}})
	add(catalogueCase{name: "compile re-run over its own output", setup: func(t *testing.T, root, plugins string) scene {
		src := tiny(t, filepath.Join(root, "src"))
		out := filepath.Join(root, "out")
		if code, _, errOut := strata(t, compileScene(src, out, plugins).args...); code != 0 {
			t.Fatal(errOut)
		}
		s := compileScene(src, out, plugins, "--ctx-len", "64")
		s.check = func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(out, "specializations.json"))
			if err != nil || !strings.Contains(string(data), `"64"`) {
				t.Errorf("specializations.json not rewritten: %v %s", err, data)
			}
		}
		return s
	}})
	add(catalogueCase{name: "inspect: Hugging Face cache layout", setup: func(t *testing.T, root, plugins string) scene {
		return scene{args: []string{"inspect", hfCache(t, root), "--plugin-dir", plugins}}
	}})
	add(catalogueCase{name: "export --bin-to the source", want: "is the source", setup: func(t *testing.T, root, plugins string) scene {
		src := binSrc(t, root)
		return exportScene(src, filepath.Join(root, "out"), plugins, "--bin-to", src)
	}})
	add(catalogueCase{name: "export into a convert-bin output", want: "strata convert-bin", setup: func(t *testing.T, root, plugins string) scene {
		src := binSrc(t, root)
		conv := filepath.Join(root, "conv")
		if code, _, errOut := strata(t, "convert-bin", src, "--out", conv); code != 0 {
			t.Fatal(errOut)
		}
		return exportScene(tiny(t, filepath.Join(root, "src")), conv, plugins)
	}})
	add(catalogueCase{name: "convert-bin re-run over its own conversion", setup: func(t *testing.T, root, plugins string) scene {
		src := binSrc(t, root)
		conv := filepath.Join(root, "conv")
		if code, _, errOut := strata(t, "convert-bin", src, "--out", conv); code != 0 {
			t.Fatal(errOut)
		}
		// A changed source: the conversion is redone in place.
		info, _ := os.Stat(filepath.Join(src, "config.json"))
		must(t, os.Chtimes(filepath.Join(src, "pytorch_model-00001-of-00002.bin"), info.ModTime(), info.ModTime().Add(-3600e9)))
		s := scene{args: []string{"convert-bin", src, "--out", conv}, out: conv}
		s.check = func(t *testing.T) {
			info, err := os.Stat(filepath.Join(conv, "model-00001-of-00002.safetensors"))
			if err != nil || info.Mode().Perm()&0o044 != 0o044 {
				t.Errorf("converted shard: %v, mode %v", err, info.Mode().Perm())
			}
		}
		return s
	}})
	// Issue 30: compile's tools. One that cannot be used is refused before
	// anything is written; a child the compiler leaves holding its output
	// is killed when it exits, not waited for.
	for _, tc := range []struct{ name, want, flag, body string }{
		{"--compiler is a directory", "a directory, not the compiler", "--compiler", ""},
		{"--compiler is not executable", "not executable", "--compiler", "-"},
		{"--python cannot import onnxruntime", "cannot import it", "--python", "exit 1\n"},
	} {
		add(catalogueCase{name: "compile: " + tc.name, want: tc.want, setup: func(t *testing.T, root, plugins string) scene {
			tool := filepath.Join(root, "tools", "tool")
			switch tc.body {
			case "":
				must(t, os.MkdirAll(tool, 0o755))
			case "-":
				put(t, tool, "#!/bin/sh\n")
			default:
				put(t, tool, "#!/bin/sh\n"+tc.body)
				must(t, os.Chmod(tool, 0o755))
			}
			args := []string{"compile", tiny(t, filepath.Join(root, "src")), "--out", filepath.Join(root, "out"), "--plugin-dir", plugins, tc.flag, tool}
			if tc.flag == "--python" {
				args = append(args, "--backend", "ort")
			}
			return scene{args: args, out: filepath.Join(root, "out")}
		}})
	}
	add(catalogueCase{name: "compile: the compiler leaves a child holding its output", setup: func(t *testing.T, root, plugins string) scene {
		compiler, pids := filepath.Join(root, "tools", "qaic-compile"), t.TempDir() // the pids outside root
		put(t, compiler, "#!/bin/sh\n"+makeQPC+childScript(pids))
		must(t, os.Chmod(compiler, 0o755))
		out := filepath.Join(root, "out")
		s := scene{args: []string{"compile", tiny(t, filepath.Join(root, "src")), "--out", out, "--plugin-dir", plugins, "--compiler", compiler}, out: out}
		s.check = func(t *testing.T) {
			mustExist(t, filepath.Join(out, "qpc", "programqpc.bin"))
			for _, pid := range children(t, pids) {
				requireDead(t, pid, "the compiler's child")
			}
		}
		return s
	}})
	return append(cases, dataCases()...)
}

// aliasOf is another path to directory dir: dir itself, a symlink to it,
// a path under a symlink to its parent, or a bind mount of it (skipped
// where mounting is not allowed; unmounted when the test ends).
func aliasOf(t *testing.T, root, dir, how string) string {
	t.Helper()
	alias := filepath.Join(root, "alias")
	switch how {
	case "directly":
		return dir
	case "through a symlink":
		must(t, os.Symlink(dir, alias))
		return alias
	case "through a symlinked parent":
		must(t, os.Symlink(filepath.Dir(dir), alias))
		return filepath.Join(alias, filepath.Base(dir))
	}
	must(t, os.Mkdir(alias, 0o755))
	if err := syscall.Mount(dir, alias, "", syscall.MS_BIND, ""); err != nil {
		t.Skipf("no bind mount here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(alias, syscall.MNT_DETACH) })
	return alias
}

// negativeShapeBin is a torch.save archive whose one tensor has shape [-1].
func negativeShapeBin(t *testing.T) []byte {
	t.Helper()
	// PROTO 2, {"w": _rebuild_tensor_v2(storage "0" of 4 floats, 0, (-1,), (1,), False, {})}
	pkl := "\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00J\xff\xff\xff\xff\x85K\x01\x85\x89}tRs."
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	for name, data := range map[string]string{"data.pkl": pkl, "byteorder": "little", "data/0": string(make([]byte, 16))} {
		w, err := z.CreateHeader(&zip.FileHeader{Name: "archive/" + name, Method: zip.Store})
		must(t, err)
		w.Write([]byte(data))
	}
	must(t, z.Close())
	return buf.Bytes()
}

func mustExist(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Error(err)
	}
}

// hfCache lays the tiny Llama out as the Hugging Face hub cache does and
// returns the snapshot directory.
func hfCache(t *testing.T, root string) string {
	t.Helper()
	blobs := filepath.Join(root, "hub", "models--tiny", "blobs")
	snap := filepath.Join(root, "hub", "models--tiny", "snapshots", "0123abcd")
	must(t, os.MkdirAll(blobs, 0o755))
	must(t, os.MkdirAll(snap, 0o755))
	for _, name := range []string{"config.json", "generation_config.json", "model.safetensors"} {
		data, err := os.ReadFile(filepath.Join(tinyLlama, name))
		must(t, err)
		sum := sha256.Sum256(data)
		blob := hex.EncodeToString(sum[:])
		must(t, os.WriteFile(filepath.Join(blobs, blob), data, 0o644))
		must(t, os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, name)))
	}
	return snap
}

func TestCatalogue(t *testing.T) {
	t.Parallel()
	// A plugin binary of the catalogue's own, so its processes are told
	// apart from other tests'.
	plugins := t.TempDir()
	must(t, os.Link(filepath.Join(llamaDir, "strata-plugin-llama"), filepath.Join(plugins, "strata-plugin-llama")))
	for _, tc := range catalogue() {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			s := tc.setup(t, root, plugins)
			if s.release != nil {
				defer s.release()
			}
			skip := ""
			if tc.want == "" || tc.outMayChange {
				skip = s.out // a successful run changes its output only
			}
			before := tree(t, root, skip)
			code, _, errOut := strata(t, s.args...)
			switch {
			case tc.want == "" && code != 0:
				t.Fatalf("exit %d:\n%s", code, errOut)
			case tc.want != "" && (code == 0 || !strings.Contains(errOut, tc.want)):
				t.Fatalf("exit %d, want an error saying %q:\n%s", code, tc.want, errOut)
			}
			sameTree(t, before, tree(t, root, skip))
			if s.release != nil {
				s.release()
				s.release = nil
			}
			if s.check != nil {
				s.check(t)
			}
			requireNoProcesses(t, plugins)
		})
	}
}
