package connlog

import (
	"math"
	"net/netip"
	"time"

	"go.uber.org/zap/zapcore"
)

// MaxAttempts is the number of backend dials a Record can hold.
const MaxAttempts = 16

// Attempt is one dial of a backend.
type Attempt struct {
	Backend netip.AddrPort
	Latency time.Duration // connect latency (or time until failure)
	Err     error         // nil: connected
}

// Record describes one finished connection (or UDP flow). It is a plain
// value of fixed size: Log copies it, so the caller may reuse it at once.
type Record struct {
	Start       time.Time
	ID          uint64
	Protocol    string               // "TCP" or "UDP"
	Client      netip.AddrPort       // the client's address
	Frontend    netip.AddrPort       // the address the client connected to (original destination)
	Service     string               // "namespace/name:port", "" when none matched
	Attempts    [MaxAttempts]Attempt // first NAttempts used (inline: no allocation per connection)
	NAttempts   int                  // attempts used; values outside 0..MaxAttempts are clamped
	Backend     netip.AddrPort       // chosen backend; zero value when none
	BytesIn     int64                // client → backend
	BytesOut    int64                // backend → client
	Duration    time.Duration        // how long the connection (or flow) lasted
	CloseReason string               // "client_eof", "backend_eof", "client_reset", "backend_reset", "idle_timeout", "drain", "shutdown", "no_endpoints", "dial_failed", "limit", "error"
	Failed      bool                 // the client got no backend
}

// encoderConfig writes only the fields recordEncoder adds: no level,
// message, caller or entry time.
var encoderConfig = zapcore.EncoderConfig{
	EncodeTime: zapcore.RFC3339NanoTimeEncoder,
	LineEnding: "\n",
}

// recordEncoder turns the Record it points at into the fields of one log
// line, in the documented order. It is owned by the writer goroutine and
// reused for every record; the scratch buffer keeps address formatting
// allocation-free.
type recordEncoder struct {
	r       *Record
	scratch []byte
	attempt attemptEncoder
}

func (e *recordEncoder) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	r := e.r
	enc.AddTime("time", r.Start)
	enc.AddUint64("id", r.ID)
	enc.AddString("proto", r.Protocol)
	e.addAddr(enc, "client", r.Client)
	e.addAddr(enc, "frontend", r.Frontend)
	enc.AddString("service", r.Service)
	if err := enc.AddArray("attempts", (*attemptsEncoder)(e)); err != nil {
		return err
	}
	if r.Backend.IsValid() {
		e.addAddr(enc, "backend", r.Backend)
	}
	enc.AddInt64("bytes_in", r.BytesIn)
	enc.AddInt64("bytes_out", r.BytesOut)
	enc.AddFloat64("duration_ms", millis(r.Duration))
	enc.AddString("close", r.CloseReason)
	if r.Failed {
		enc.AddBool("failed", true)
	}
	return nil
}

// addAddr writes a as a string ("" for the zero value) without allocating.
func (e *recordEncoder) addAddr(enc zapcore.ObjectEncoder, key string, a netip.AddrPort) {
	e.scratch = a.AppendTo(e.scratch[:0])
	enc.AddByteString(key, e.scratch)
}

// attemptsEncoder is the "attempts" array of a recordEncoder's record.
type attemptsEncoder recordEncoder

func (e *attemptsEncoder) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	r := e.r
	n := min(max(r.NAttempts, 0), MaxAttempts)
	e.attempt.scratch = &e.scratch
	for i := range n {
		e.attempt.a = &r.Attempts[i]
		if err := enc.AppendObject(&e.attempt); err != nil {
			return err
		}
	}
	return nil
}

// attemptEncoder is one element of the "attempts" array.
type attemptEncoder struct {
	a       *Attempt
	scratch *[]byte
}

func (e *attemptEncoder) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	*e.scratch = e.a.Backend.AppendTo((*e.scratch)[:0])
	enc.AddByteString("backend", *e.scratch)
	enc.AddFloat64("connect_ms", millis(e.a.Latency))
	if e.a.Err != nil {
		enc.AddString("error", e.a.Err.Error())
	}
	return nil
}

// millis is d in milliseconds, rounded to three decimals (the microsecond).
func millis(d time.Duration) float64 {
	return math.Round(float64(d)/1e3) / 1e3
}
