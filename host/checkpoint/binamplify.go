package checkpoint

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/strata-llm/strata/host/progress"
)

// storageUse is what a .bin file's tensors write from one storage.
type storageUse struct {
	storage string
	size    int64 // the storage's bytes
	written int64 // bytes its tensors write
	tensors int
	keys    []string // the first few
}

// checkAmplification refuses a .bin file whose tensors would write more
// than max times the bytes of the storages they read, before anything is
// written, naming the storage written most and its tensors. safetensors
// holds no views: each tensor sharing a storage is written in full, so a
// file of megabytes could otherwise fill a disk.
func (a *binArchive) checkAmplification(tensors []binTensor, max float64) error {
	uses := map[string]*storageUse{}
	var written, stored int64
	for _, t := range tensors {
		f, size, err := a.storage(t)
		if err != nil {
			return fmt.Errorf("%s: tensor %s: %w", a.path, t.key, err)
		}
		n, _, err := checkView(t, int64(f.UncompressedSize64)/size)
		if err != nil {
			return fmt.Errorf("%s: tensor %s: %w", a.path, t.key, err)
		}
		u := uses[t.storage]
		if u == nil {
			u = &storageUse{storage: t.storage, size: int64(f.UncompressedSize64)}
			uses[t.storage] = u
			stored += u.size
		}
		b := int64(math.MaxInt64 / 2) // saturates: refused below
		if n <= b/size {
			b = n * size
		}
		u.written += b
		u.tensors++
		if len(u.keys) < 3 {
			u.keys = append(u.keys, t.key)
		}
		written = min(written+b, math.MaxInt64/2)
	}
	if float64(written) <= max*float64(stored) {
		return nil
	}
	worst := make([]*storageUse, 0, len(uses))
	for _, u := range uses {
		worst = append(worst, u)
	}
	sort.Slice(worst, func(i, j int) bool {
		if worst[i].written != worst[j].written {
			return worst[i].written > worst[j].written
		}
		return worst[i].storage < worst[j].storage
	})
	u := worst[0]
	names := strings.Join(u.keys, ", ")
	if u.tensors > len(u.keys) {
		names += fmt.Sprintf(" and %d more", u.tensors-len(u.keys))
	}
	ratio := float64(written) / float64(stored)
	return fmt.Errorf("%s: its %d tensors would write %s from %s of storage (%.1f×, more than the %g× strata allows): storage %s (%s) alone is written %s by %d tensors (%s), each in full as safetensors has no shared storage; "+
		"the file is crafted, or if it is genuine convert it with strata convert-bin --max-amplification %d",
		a.path, len(tensors), progress.Bytes(written), progress.Bytes(stored), ratio, max,
		u.storage, progress.Bytes(u.size), progress.Bytes(u.written), u.tensors, names, int(math.Ceil(ratio)))
}
