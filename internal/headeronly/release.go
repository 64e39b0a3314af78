package headeronly

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Release is a shipped real config (bench/configs/<name>/): config.json as
// released and release.json, how the release is sharded.
type Release struct {
	Name          string
	Config        []byte
	Repo          string `json:"repo"`
	MaxShardBytes int64  `json:"max_shard_bytes"` // save_pretrained's max_shard_size
	Shards        int    `json:"shards"`          // the release's shard count
	// Modes are export modes the bench runs on this release beyond its
	// common ones (glm's --mtp draft).
	Modes []ReleaseMode `json:"extra_modes,omitempty"`
	// CommonModes names the common modes the bench runs on this release
	// (default: all of them).
	CommonModes []string `json:"modes,omitempty"`
}

// ReleaseMode is one extra export mode: a name and strata's flags.
type ReleaseMode struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
}

// LoadRelease reads the release in dir.
func LoadRelease(dir string) (Release, error) {
	r := Release{Name: filepath.Base(dir)}
	meta, err := os.ReadFile(filepath.Join(dir, "release.json"))
	if err != nil {
		return Release{}, err
	}
	if err := json.Unmarshal(meta, &r); err != nil {
		return Release{}, fmt.Errorf("%s: %w", filepath.Join(dir, "release.json"), err)
	}
	if r.Config, err = os.ReadFile(filepath.Join(dir, configFile)); err != nil {
		return Release{}, err
	}
	return r, nil
}

// WriteRelease writes r as a header-only checkpoint into dir — BF16, with
// quantised weights as its quantization_config stores them — and checks the
// shard count is the release's.
func WriteRelease(dir string, r Release) (Stats, error) {
	tensors, err := Tensors(r.Config, "BF16")
	if err != nil {
		return Stats{}, fmt.Errorf("%s: %w", r.Name, err)
	}
	st, err := Write(dir, r.Config, tensors, r.MaxShardBytes)
	if err != nil {
		return Stats{}, err
	}
	if st.Shards != r.Shards {
		return st, fmt.Errorf("%s: wrote %d shards, the release has %d", r.Name, st.Shards, r.Shards)
	}
	return st, nil
}
