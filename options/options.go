// Package options carries the source of the saga.v1 contract options
// (saga/v1/saga.proto) inside every binary that imports it, and writes it
// into a user's proto tree (protoc-gen-saga export-options).
//
// The embedded file is options/saga/v1/saga.proto itself (go:embed), so the
// copy a user exports is byte for byte the file this module's Go package
// github.com/protosaga/saga/options/saga/v1 was generated from: the exported
// file's go_package names that package, and no Go code is generated for it
// in the user's tree.
package options

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

//go:embed saga/v1/saga.proto
var files embed.FS

// Files returns the options' .proto files, keyed by import path
// ("saga/v1/saga.proto"), the paths a contract imports them by.
func Files() map[string][]byte {
	out := map[string][]byte{}
	err := fs.WalkDir(files, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = b
		return nil
	})
	if err != nil {
		// The embedded tree is fixed at build time; reading it cannot fail.
		panic(fmt.Sprintf("read the embedded saga.v1 options: %v", err))
	}
	return out
}

// Outcome says what Export did with one file.
type Outcome int

const (
	// Unchanged: the file already held exactly the embedded content.
	Unchanged Outcome = iota
	// Created: the file did not exist and was written.
	Created
	// Replaced: the file held other content and was overwritten (force).
	Replaced
)

// String returns the outcome as the word export-options prints.
func (o Outcome) String() string {
	switch o {
	case Unchanged:
		return "unchanged"
	case Created:
		return "created"
	case Replaced:
		return "replaced"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Written is one file Export handled.
type Written struct {
	// Path is the file's path: dir joined with its import path.
	Path    string
	Outcome Outcome
}

// ErrDiffers is wrapped by Export's error when a file exists with content
// other than the embedded one and force is false.
var ErrDiffers = errors.New("differs from the saga.v1 options of this protoc-gen-saga")

// Export writes every options file under dir at its import path (so dir is
// an import root: protoc -I dir, or a module of a buf workspace). It is
// idempotent: a file that already holds the embedded bytes is left alone. A
// file with other content is only replaced when force is true; otherwise
// Export writes nothing and returns an error wrapping ErrDiffers that names
// every such file. Files are written through a temporary file and a rename,
// so a reader never sees half a file.
func Export(dir string, force bool) ([]Written, error) {
	if dir == "" {
		return nil, errors.New("export the saga.v1 options: no directory given")
	}
	want := Files()
	paths := make([]string, 0, len(want))
	for p := range want {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	plan := make([]Written, 0, len(paths))
	var differ []error
	for _, p := range paths {
		target := filepath.Join(dir, filepath.FromSlash(p))
		have, err := os.ReadFile(target)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			plan = append(plan, Written{Path: target, Outcome: Created})
		case err != nil:
			return nil, fmt.Errorf("export the saga.v1 options: read %s: %w", target, err)
		case bytes.Equal(have, want[p]):
			plan = append(plan, Written{Path: target, Outcome: Unchanged})
		case force:
			plan = append(plan, Written{Path: target, Outcome: Replaced})
		default:
			differ = append(differ, fmt.Errorf("%s %w (edited, or exported by another version): rerun with -force to replace it", target, ErrDiffers))
		}
	}
	if len(differ) > 0 {
		return nil, fmt.Errorf("export the saga.v1 options into %s: %w", dir, errors.Join(differ...))
	}
	for i, w := range plan {
		if w.Outcome == Unchanged {
			continue
		}
		if err := writeFile(w.Path, want[paths[i]]); err != nil {
			return nil, fmt.Errorf("export the saga.v1 options: %w", err)
		}
	}
	return plan, nil
}

// writeFile replaces path with b through a temporary file in the same
// directory, creating the directories it needs.
func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create the directory of %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
