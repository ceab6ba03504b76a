package connlog

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultPath is where the log goes when Options.Path is empty.
const DefaultPath = "/var/log/svcproxy/connections.log"

const (
	defaultMaxSizeMB  = 100
	defaultMaxBackups = 5
	defaultQueueSize  = 8192

	// flushInterval bounds how long an encoded record may sit in the
	// buffer before it reaches the file.
	flushInterval = time.Second
	// maxBufferSize is the most encoded output kept before a flush.
	maxBufferSize = 256 << 10
)

// Options configures a Log. Zero values mean the stated defaults.
type Options struct {
	Path        string // file to write; "": DefaultPath; "-": stdout (for tests and demos; no rotation)
	MaxSizeMB   int    // rotate when the file would pass this many MiB; 0: 100
	MaxBackups  int    // rotated files kept; 0: 5; negative: all
	MaxAgeDays  int    // days rotated files are kept; 0 or negative: no limit
	Compress    bool   // gzip rotated files
	SampleEvery int    // keep 1 of every N successful records (those whose ID is a multiple of N); failed ones always; 0 or 1: all
	QueueSize   int    // records buffered for the writer before Log drops; 0: 8192

	// Test hooks.
	maxBytes    int64     // rotation size in bytes; 0: MaxSizeMB MiB
	bufSize     int       // encoded bytes buffered before a flush; 0: min(256 KiB, rotation size)
	out         io.Writer // written instead of the file
	beforeWrite func()    // called by the writer goroutine before it encodes each record
}

func (o Options) withDefaults() (Options, error) {
	if o.Path == "" {
		o.Path = DefaultPath
	}
	if o.MaxSizeMB == 0 {
		o.MaxSizeMB = defaultMaxSizeMB
	}
	if o.MaxSizeMB < 0 {
		return o, fmt.Errorf("connection log maxSizeMB: must not be negative, got %d", o.MaxSizeMB)
	}
	if o.MaxBackups == 0 {
		o.MaxBackups = defaultMaxBackups
	}
	if o.SampleEvery < 0 {
		return o, fmt.Errorf("connection log sampleEvery: must not be negative, got %d", o.SampleEvery)
	}
	if o.QueueSize == 0 {
		o.QueueSize = defaultQueueSize
	}
	if o.QueueSize < 0 {
		return o, fmt.Errorf("connection log queueSize: must not be negative, got %d", o.QueueSize)
	}
	if o.maxBytes == 0 {
		o.maxBytes = int64(o.MaxSizeMB) << 20
	}
	if o.bufSize == 0 {
		o.bufSize = int(min(maxBufferSize, o.maxBytes))
	}
	return o, nil
}

// Log is an open connection log. Its methods are safe for concurrent use,
// and on a nil *Log, which logs nothing.
type Log struct {
	sampleEvery uint64

	// mu is held for reading while sending on queue and for writing to
	// close it, so Close never races a send.
	mu     sync.RWMutex
	closed bool
	queue  chan Record

	dropped atomic.Uint64
	written atomic.Uint64

	done     chan struct{} // closed when the writer goroutine has finished
	closeErr error         // set by the writer goroutine before done is closed
}

// Open opens (creating if needed) the log file and starts the writer
// goroutine. Close stops it.
func Open(opts Options) (*Log, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var out io.Writer
	var closer io.Closer
	switch {
	case opts.out != nil:
		out = opts.out
	case opts.Path == "-":
		// Hide (*os.File).Sync: fsync of a pipe or terminal fails.
		out = struct{ io.Writer }{os.Stdout}
	default:
		f, err := openFile(opts)
		if err != nil {
			return nil, err
		}
		out, closer = f, f
	}
	w := newWriter(opts, out, closer)

	l := &Log{
		sampleEvery: uint64(max(opts.SampleEvery, 1)),
		queue:       make(chan Record, opts.QueueSize),
		done:        make(chan struct{}),
	}
	w.l = l
	go l.run(w)
	return l, nil
}

// Log queues a copy of *r to be written. It never blocks: when the queue is
// full, or the Log is closed, the record is dropped and counted. A
// successful record (r.Failed false) that sampling leaves out is ignored
// and not counted. The caller may reuse *r as soon as Log returns.
func (l *Log) Log(r *Record) {
	if l == nil || r == nil {
		return
	}
	if !r.Failed && !l.Sampled(r.ID) {
		return
	}
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		l.dropped.Add(1)
		return
	}
	select {
	case l.queue <- *r:
	default:
		l.dropped.Add(1)
	}
	l.mu.RUnlock()
}

// Sampled reports whether a successful record with this id would be kept,
// so the caller can skip filling one that would not. False on a nil *Log.
func (l *Log) Sampled(id uint64) bool {
	return l != nil && (l.sampleEvery == 1 || id%l.sampleEvery == 0)
}

// Dropped is the number of records lost: queue full, Log closed, or the
// write failed.
func (l *Log) Dropped() uint64 {
	if l == nil {
		return 0
	}
	return l.dropped.Load()
}

// Written is the number of records encoded and handed to the file's buffer,
// which is flushed about once a second and by Close.
func (l *Log) Written() uint64 {
	if l == nil {
		return 0
	}
	return l.written.Load()
}

// Close writes every queued record, flushes and closes the file. It returns
// the first error met while writing since Open, if any, joined with any
// error from flushing and closing. Records logged after Close are dropped.
// Calling it again waits for the first call and returns the same.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.queue)
	}
	l.mu.Unlock()
	<-l.done
	return l.closeErr
}

func (l *Log) run(w *writer) {
	defer close(l.done)
	tick := time.NewTicker(flushInterval)
	defer tick.Stop()
	var ok bool
	for {
		select {
		case w.rec, ok = <-l.queue:
			if !ok {
				l.closeErr = w.close()
				return
			}
			w.write()
		case <-tick.C:
			w.flush()
		}
	}
}

// writer is the state of the writer goroutine, the only one that encodes
// records or touches the file.
type writer struct {
	l           *Log
	out         io.Writer // the file (or stdout)
	closer      io.Closer // nil for stdout
	bufSize     int
	beforeWrite func()

	enc  zapcore.Encoder
	buf  *zapcore.BufferedWriteSyncer
	core zapcore.Core

	rec    Record // the record being written, received straight from the queue
	re     recordEncoder
	fields []zapcore.Field // the one inline field, re

	err error // first write error; reported by Close
}

func newWriter(opts Options, out io.Writer, closer io.Closer) *writer {
	w := &writer{
		out:         out,
		closer:      closer,
		bufSize:     opts.bufSize,
		beforeWrite: opts.beforeWrite,
		enc:         zapcore.NewJSONEncoder(encoderConfig),
	}
	w.re.r = &w.rec
	w.fields = []zapcore.Field{zap.Inline(&w.re)}
	w.newBuffer()
	return w
}

func (w *writer) newBuffer() {
	w.buf = &zapcore.BufferedWriteSyncer{
		WS:   zapcore.AddSync(w.out),
		Size: w.bufSize,
		// The writer goroutine flushes on its own ticker (see run), so the
		// syncer's flush loop is made never to fire: one goroutine alone
		// touches the file.
		FlushInterval: math.MaxInt64,
	}
	w.core = zapcore.NewCore(w.enc, w.buf, zapcore.DebugLevel)
}

func (w *writer) write() {
	if w.beforeWrite != nil {
		w.beforeWrite()
	}
	if err := w.core.Write(zapcore.Entry{}, w.fields); err != nil {
		w.l.dropped.Add(1)
		w.fail(err)
		return
	}
	w.l.written.Add(1)
}

func (w *writer) flush() {
	if err := w.buf.Sync(); err != nil {
		w.fail(err)
	}
}

// fail remembers the first error and starts a new buffer: a bufio.Writer
// refuses every write after its first failure, and the log should recover
// once the disk does (the failed buffer's contents are lost).
func (w *writer) fail(err error) {
	if w.err == nil {
		w.err = fmt.Errorf("writing connection log: %w", err)
	}
	_ = w.buf.Stop() // only stops its flush loop: the flush fails again
	w.newBuffer()
}

func (w *writer) close() error {
	errs := []error{w.err}
	if err := w.buf.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("flushing connection log: %w", err))
	}
	if w.closer != nil {
		if err := w.closer.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing connection log: %w", err))
		}
	}
	return errors.Join(errs...)
}
