// Package connlog owns svcproxy's per-connection debug log: the Record the
// forwarder fills for every finished connection (or UDP flow), the one-line
// JSON format it is written in, and the file it goes to, with its mode,
// rotation and retention.
//
// # The hot path never waits on disk
//
// (*Log).Log copies the fixed-size Record (attempts are inline, so nothing is
// allocated) into a bounded queue and returns. When the queue is full the
// record is dropped and counted (Dropped), never waited for. A single
// goroutine per Log takes records off the queue, encodes them with its own
// zap JSON encoder (never the global logger) into a buffer, and flushes the
// buffer to the file about once a second and when it fills. That goroutine
// is the only one that writes or rotates the file. Close drains the queue and
// flushes before it returns.
//
// Successful connections can be sampled (Options.SampleEvery keeps the ones
// whose ID is a multiple of N); failed ones are always kept. Sampled lets the
// caller skip filling a record that would be thrown away.
//
// # Format
//
// One JSON object per line, with exactly these keys in this order:
//
//	{"time":"2025-03-01T12:00:00.123456789Z","id":42,"proto":"TCP",
//	 "client":"10.0.0.7:51234","frontend":"10.96.0.10:443","service":"default/web:https",
//	 "attempts":[{"backend":"10.1.0.5:8443","connect_ms":0.21,"error":"connection refused"},
//	             {"backend":"10.1.0.6:8443","connect_ms":0.187}],
//	 "backend":"10.1.0.6:8443","bytes_in":517,"bytes_out":20480,"duration_ms":1503.25,
//	 "close":"backend_eof"}
//
// (shown wrapped; on disk it is one line). time is the connection's start in
// RFC 3339 with nanoseconds; connect_ms and duration_ms are milliseconds
// rounded to the microsecond; error is present only on failed attempts,
// backend only when one was chosen, and "failed":true only when the client
// got no backend. There are no level, message or caller keys.
//
// # File
//
// The log's directory is created with mode 0750 and the file is kept at mode
// 0640, whatever the umask: it is created (or corrected) that way by Open and
// set again after every rotation. The file is rotated when the next write
// would take it past Options.MaxSizeMB; rotated files are named, pruned
// (MaxBackups, MaxAgeDays) and optionally gzipped by lumberjack, and keep the
// mode. Lines are never split across files.
package connlog
