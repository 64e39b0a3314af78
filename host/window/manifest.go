package window

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// ManifestFile records, in the output directory, what each window was made
// from and what it hashed to, so a re-run can skip unchanged windows and an
// interrupted run can be finished.
const ManifestFile = "export-manifest.json"

// Manifest format and version.
const (
	ManifestFormat  = "strata.export_manifest"
	ManifestVersion = 1
)

// Manifest is the content of ManifestFile.
type Manifest struct {
	Format  string  `json:"format"`
	Version int     `json:"version"`
	Windows []Entry `json:"windows,omitempty"`
	// Model is set once model.onnx is complete.
	Model *Output `json:"model,omitempty"`
}

// Entry is one window written to disk.
type Entry struct {
	Span  string `json:"span"`
	First int32  `json:"first"`
	Last  int32  `json:"last"`
	File  string `json:"file"`
	// Inputs hashes everything that determines the window: strata and
	// plugin versions, options, config.json, and the header entries of the
	// tensors the window uses.
	Inputs string `json:"inputs_sha256"`
	// Output hashes the window file.
	Output string `json:"output_sha256"`
	// Files hashes other files the window needs (its materialised weights),
	// by path relative to the output directory.
	Files map[string]string `json:"files_sha256,omitempty"`
}

// Output is a finished file and its hash.
type Output struct {
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
}

// Load reads dir's manifest. A missing manifest is an empty one; an
// unreadable or foreign one is reported with an empty manifest, so the
// export starts over rather than trusting it.
func Load(dir string) (*Manifest, error) {
	m := &Manifest{Format: ManifestFormat, Version: ManifestVersion}
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, err
	}
	read, err := ParseManifest(data)
	if err != nil {
		return m, fmt.Errorf("%s: %w; every window will be rebuilt", ManifestFile, err)
	}
	return read, nil
}

// ParseManifest reads a manifest's JSON.
func ParseManifest(data []byte) (*Manifest, error) {
	var read Manifest
	if err := json.Unmarshal(data, &read); err != nil || read.Format != ManifestFormat || read.Version != ManifestVersion {
		return nil, fmt.Errorf("not a version %d strata manifest", ManifestVersion)
	}
	return &read, nil
}

// FileWriter writes a file atomically, not necessarily synced, by its path
// relative to an output directory (host/outdir.Dir). The manifest need not
// be synced: a torn one is ignored (Load warns), and every window it names
// is checked against its hash before it is reused.
type FileWriter interface {
	WriteFileUnsynced(rel string, data []byte) error
}

// Save writes the manifest into the output directory atomically, windows in
// layer order.
func (m *Manifest) Save(dir FileWriter) error {
	sort.Slice(m.Windows, func(i, j int) bool { return m.Windows[i].First < m.Windows[j].First })
	// Compact: it is rewritten after every window (93 times for GLM-4.6
	// with --window-size 1), and indenting it doubled the cost.
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return dir.WriteFileUnsynced(ManifestFile, append(data, '\n'))
}

// Record adds or replaces the entry for e's span.
func (m *Manifest) Record(e Entry) {
	for i := range m.Windows {
		if m.Windows[i].Span == e.Span {
			m.Windows[i] = e
			return
		}
	}
	m.Windows = append(m.Windows, e)
}

// Unchanged reports whether the window for span was made from inputs and
// its file in dir still hashes to what was recorded.
func (m *Manifest) Unchanged(dir string, s Span, inputs string) bool {
	for _, e := range m.Windows {
		if e.Span != s.String() || e.File != s.File() || e.Inputs != inputs {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(e.File)))
		if err != nil || Hash(data) != e.Output {
			return false
		}
		for file, sum := range e.Files {
			if got, err := HashFile(filepath.Join(dir, filepath.FromSlash(file))); err != nil || got != sum {
				return false
			}
		}
		return true
	}
	return false
}

// HashFile is the hex sha256 of a file's content, read in a stream.
func HashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Hash is the hex sha256 of data.
func Hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
