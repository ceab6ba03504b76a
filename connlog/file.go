package connlog

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"gopkg.in/natefinch/lumberjack.v2"
)

const (
	fileMode fs.FileMode = 0o640
	dirMode  fs.FileMode = 0o750
)

// rotatingFile is the log file. Rotation is decided here, not by
// lumberjack, so that the mode can be set right after each one (lumberjack
// creates the new file with the old one's mode filtered by the umask, or
// 0600 when there was none); lumberjack names, prunes and compresses the
// rotated files. Only the writer goroutine uses it.
type rotatingFile struct {
	path string
	lj   *lumberjack.Logger
	max  int64 // rotate when a write would take the file past this many bytes
	size int64 // bytes in the current file
	err  error // first failure to set the mode after a rotation; see Close
}

// openFile creates dir and file if needed and sets the file's mode, so the
// file exists with the right mode before the first record is written.
func openFile(opts Options) (*rotatingFile, error) {
	path := opts.Path
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, dirMode); err != nil {
			return nil, fmt.Errorf("creating connection log directory %s: %w", dir, err)
		}
		// MkdirAll's mode is filtered by the umask.
		if err := os.Chmod(dir, dirMode); err != nil {
			return nil, fmt.Errorf("setting mode of connection log directory %s: %w", dir, err)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, fileMode)
	if err != nil {
		return nil, fmt.Errorf("opening connection log: %w", err)
	}
	defer f.Close()
	// Also corrects a file left with another mode, and defeats the umask.
	if err := f.Chmod(fileMode); err != nil {
		return nil, fmt.Errorf("setting mode of connection log %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("connection log %s: %w", path, err)
	}
	backups := opts.MaxBackups
	if backups < 0 {
		backups = 0 // lumberjack: keep all
	}
	return &rotatingFile{
		path: path,
		lj: &lumberjack.Logger{
			Filename: path,
			// Never reached: rotation is triggered by Write below.
			MaxSize:    math.MaxInt32,
			MaxBackups: backups,
			MaxAge:     opts.MaxAgeDays,
			Compress:   opts.Compress,
		},
		max:  opts.maxBytes,
		size: info.Size(),
	}, nil
}

// Write appends p to the file, rotating first if p would take a non-empty
// file past max. The buffered syncer above hands over whole lines, so lines
// are never split across files.
func (f *rotatingFile) Write(p []byte) (int, error) {
	if f.size > 0 && f.size+int64(len(p)) > f.max {
		if err := f.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := f.lj.Write(p)
	f.size += int64(n)
	return n, err
}

func (f *rotatingFile) rotate() error {
	if err := f.lj.Rotate(); err != nil {
		return fmt.Errorf("rotating connection log: %w", err)
	}
	f.size = 0
	// A failure here loses no record: remember it for Close.
	if err := os.Chmod(f.path, fileMode); err != nil && f.err == nil {
		f.err = fmt.Errorf("setting mode of connection log %s after rotation: %w", f.path, err)
	}
	return nil
}

// Close closes the file and reports the first failure to set its mode.
func (f *rotatingFile) Close() error { return errors.Join(f.err, f.lj.Close()) }
