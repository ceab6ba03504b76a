package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// Default debouncing of changes to the services file (Watcher.Debounce).
const (
	defaultDebounce = 200 * time.Millisecond
	maxDelayFactor  = 10 // a burst that never goes quiet is read this many Debounces after it began
)

// Watcher makes Store hold exactly the Services of a services file, and
// reloads it on SIGHUP and whenever the file changes. A load is
// all-or-nothing, like `nginx -t` before a reload: a file with any problem
// (a bad field, a conflict, an empty or truncated file, a syntax error)
// is not applied at all, every problem is logged with its line, and the
// Store keeps the Services it had. Do not copy a Watcher once used.
type Watcher struct {
	Path   string      // the services file; "" means Data
	Data   []byte      // the services file's content when Path is "" (the embedded default); never watched
	Store  *lb.Store   // required
	Logger *zap.Logger // nil: no logging

	// Debounce is how long the file's directory must stay quiet after a
	// change before the file is read, so a burst of writes (an editor's
	// write-and-rename, a truncate then a rewrite) is read once, after the
	// last; a burst that goes on is read ten Debounces after it began.
	// Zero: 200ms.
	Debounce time.Duration

	// OnReload, if set, is called after every load, for metrics, with the
	// number of Service ports now in the Store and the load's error: nil,
	// or why the file was not applied (the Store then keeps its previous
	// state). Loads are serialised, so it is never called concurrently; it
	// must not call Reload.
	OnReload func(services int, err error)

	mu      sync.Mutex // serialises loads
	last    []byte     // the content last read, to skip change events that change nothing
	applied bool       // last was applied
}

// Run loads the services file and applies it (unless Reload has just
// applied this very content), then reloads it on SIGHUP and on changes to
// the file (its directory is watched, so editors that replace the file by
// renaming work) until ctx is done, when it returns nil. It returns an
// error, listing every problem, if the first load fails (see Reload) or the
// file cannot be watched; later failed reloads are logged and keep the
// previous Services.
func (w *Watcher) Run(ctx context.Context) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// Watch before the first load, so no change slips between the two.
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if w.Path != "" {
		fw, err := fsnotify.NewWatcher()
		if err != nil {
			return fmt.Errorf("watching %s: %w", w.Path, err)
		}
		defer fw.Close()
		if err := fw.Add(filepath.Dir(w.Path)); err != nil {
			return fmt.Errorf("watching %s: %w", w.Path, err)
		}
		events, watchErrs = fw.Events, fw.Errors
	}
	w.mu.Lock()
	applied := w.applied
	w.mu.Unlock()
	if err := w.reload(!applied); err != nil {
		return err
	}

	log := w.logger()
	quiet := w.Debounce
	if quiet <= 0 {
		quiet = defaultDebounce
	}
	burst := debouncer{quiet: quiet, max: maxDelayFactor * quiet}
	timer := time.NewTimer(quiet)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			log.Info("reloading on SIGHUP")
			_ = w.Reload() // logged
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			log.Debug("services file directory changed", zap.Stringer("event", ev))
			timer.Reset(burst.event(time.Now()))
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			log.Warn("watching services file", zap.Error(err))
		case <-timer.C:
			if wait := burst.wait(time.Now()); wait > 0 {
				timer.Reset(wait)
				continue
			}
			burst = debouncer{quiet: burst.quiet, max: burst.max}
			_ = w.reload(false) // logged
		}
	}
}

// debouncer turns a burst of change events into one read: due quiet after
// the last event, or max after the first, whichever comes sooner.
type debouncer struct {
	quiet, max  time.Duration
	first, last time.Time // zero: no event since the last read
}

// event records a change at now and returns how long until the burst is
// due.
func (d *debouncer) event(now time.Time) time.Duration {
	if d.first.IsZero() {
		d.first = now
	}
	d.last = now
	return d.wait(now)
}

// wait returns how long after now the burst is due; 0: it is.
func (d *debouncer) wait(now time.Time) time.Duration {
	due := d.last.Add(d.quiet)
	if limit := d.first.Add(d.max); limit.Before(due) {
		due = limit
	}
	return max(due.Sub(now), 0)
}

// Reload reads the services file (or Data) and, if it has no problem at
// all, makes the Store hold exactly its Services. Otherwise it applies
// nothing, logs every problem with its line, and returns an error joining
// them (wrapping ErrInvalidFile when the file is unusable as a whole, or
// the read error); the Store keeps its previous Services.
func (w *Watcher) Reload() error { return w.reload(true) }

// reload loads the file; unless force, only if its content changed since
// it was last read.
func (w *Watcher) reload(force bool) error {
	if w.Store == nil {
		return errors.New("file.Watcher: Store is nil")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	start := time.Now()
	log := w.logger()

	data, err := w.read()
	if err != nil {
		return w.reject(err)
	}
	if !force && w.last != nil && bytes.Equal(data, w.last) {
		log.Debug("services file unchanged")
		return nil
	}
	w.last, w.applied = data, false

	services, err := Parse(data)
	if err != nil {
		return w.reject(err)
	}
	snap, err := w.Store.Replace(services)
	w.applied = true
	// Parse leaves the Store nothing to reject; if it did, say so.
	forEach(err, func(err error) { log.Error("service rejected by the store", zap.Error(err)) })
	log.Info("loaded services",
		zap.Int("services", snap.Len()),
		zap.Uint64("version", snap.Version),
		zap.Duration("duration", time.Since(start)))
	if err != nil {
		err = fmt.Errorf("loading %s: %w", w.source(), err)
	}
	w.report(err)
	return nil
}

// reject logs each of problems, the reasons a load applied nothing, and
// reports and returns them.
func (w *Watcher) reject(problems error) error {
	log := w.logger()
	n := 0
	forEach(problems, func(e error) {
		n++
		log.Error("services file problem", zap.Error(e))
	})
	log.Error("services file not applied: keeping the previous services",
		zap.Int("problems", n), zap.Int("services", w.Store.Snapshot().Len()))
	err := fmt.Errorf("loading %s: %w", w.source(), problems)
	w.report(err)
	return err
}

func (w *Watcher) read() ([]byte, error) {
	if w.Path == "" {
		return w.Data, nil
	}
	data, err := os.ReadFile(w.Path)
	if err != nil {
		return nil, fmt.Errorf("reading services file: %w", err)
	}
	return data, nil
}

func (w *Watcher) report(err error) {
	if w.OnReload != nil {
		w.OnReload(w.Store.Snapshot().Len(), err)
	}
}

// source names where the services come from, for logs and errors.
func (w *Watcher) source() string {
	if w.Path == "" {
		return "embedded services file"
	}
	return w.Path
}

func (w *Watcher) logger() *zap.Logger {
	if w.Logger == nil {
		return zap.NewNop()
	}
	return w.Logger.Named("source.file").With(zap.String("file", w.source()))
}
