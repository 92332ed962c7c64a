package tiers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvtier/kvtier/shm"
)

// Parked requests keep their TTL across a restart: Wait writes every
// parked block's expiry to ChainConfig.ParkStatePath, the next NewChain
// reads it, and that chain's Start removes the file (so that a crash later
// does not apply it to a request parked again under the same id). Not
// NewChain: a start-up that fails after it (a later step errors) must
// leave the file for the next start. Without it a
// daemon restarted more often than park_ttl_s (upgrades, a crash loop)
// gave every parked block a fresh TTL each time: the blocks of a client
// gone for good were never expired, and parked blocks are unevictable in
// NVMe. A restart after a crash still gives the blocks a fresh TTL.
//
// The time between the stop and the start is known only from the wall
// clock: the file holds the stop's wall-clock time and each block's
// remaining TTL then (a duration: an expiry as a date would not fit
// UnixNano for the longest park_ttl_s). Read back, the time since the stop
// is taken off, and the result clamped to [0, what was left at the stop]
// and to ParkTTL: a clock stepped back while the daemon was down cannot
// lengthen a TTL, one stepped forward shortens it by the step at most.
//
// Format, little-endian: magic "KVPARK01", count u64, stop time unix
// nanoseconds i64, then count entries of 32 bytes (namespace u32, reserved
// u32, hash hi u64, hash lo u64, remaining nanoseconds i64), then XXH3-64
// of everything before.
const (
	parkStateMagic    = "KVPARK01"
	parkStateHdrLen   = 24
	parkStateEntryLen = 32
)

// loadParkState reads the expiries a previous Wait stored, as deadlines on
// this process's clock; Start removes the file (dropParkState). A missing
// file is no prior state; a corrupt one is logged and ignored.
func (c *Chain) loadParkState() map[Key]time.Time {
	p := c.cfg.ParkStatePath
	if p == "" {
		return nil
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var prior map[Key]time.Time
	if err == nil {
		prior, err = decodeParkState(data, time.Now(), c.cfg.ParkTTL)
	}
	if err != nil {
		c.log.Warn("parked requests' stored expiries unreadable; their blocks get a fresh TTL", "path", p, "err", err)
		return nil
	}
	return prior
}

func decodeParkState(data []byte, now time.Time, ttl time.Duration) (map[Key]time.Time, error) {
	le := binary.LittleEndian
	if len(data) < parkStateHdrLen+8 || string(data[:len(parkStateMagic)]) != parkStateMagic {
		return nil, errors.New("not a parked expiry file")
	}
	if le.Uint64(data[len(data)-8:]) != xxh3.Hash(data[:len(data)-8]) {
		return nil, errors.New("checksum mismatch")
	}
	n := le.Uint64(data[8:])
	since := now.Round(0).Sub(time.Unix(0, int64(le.Uint64(data[16:]))))
	body := data[parkStateHdrLen : len(data)-8]
	if uint64(len(body))%parkStateEntryLen != 0 || n != uint64(len(body))/parkStateEntryLen {
		return nil, fmt.Errorf("%d entries claimed in %d bytes", n, len(body))
	}
	prior := make(map[Key]time.Time, n)
	for p := body; len(p) > 0; p = p[parkStateEntryLen:] {
		k := Key{NS: le.Uint32(p[0:]), Hash: shm.Hash{Hi: le.Uint64(p[8:]), Lo: le.Uint64(p[16:])}}
		if !k.Parked() || le.Uint32(p[4:]) != 0 {
			return nil, fmt.Errorf("entry %v is not a parked block's", k)
		}
		left := time.Duration(le.Uint64(p[24:]))
		if left < 0 {
			return nil, fmt.Errorf("entry %v: negative TTL left", k)
		}
		if since > 0 {
			left = max(left-since, 0)
		}
		prior[k] = now.Add(min(left, ttl))
	}
	return prior, nil
}

// dropParkState removes the stored expiries once Start has taken them
// over: from then on Wait stores them again, and a crash must not apply
// them to a request parked again under the same id.
func (c *Chain) dropParkState() {
	p := c.cfg.ParkStatePath
	if p == "" {
		return
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("cannot remove the parked requests' stored expiries; a later start may apply them again", "path", p, "err", err)
	}
}

// storeParkState writes the parked blocks' expiries for the next start.
// A chain stopped without Start never scanned NVMe for its parked blocks:
// the expiries it read and did not use (parkPrior) are kept, not lost; so
// are those a chain without an NVMe tier could not apply (parkKept).
func (c *Chain) storeParkState() {
	p := c.cfg.ParkStatePath
	if p == "" {
		return
	}
	c.parkMu.Lock()
	parked := c.parked
	if len(c.parkPrior) > 0 || len(c.parkKept) > 0 {
		parked = maps.Clone(c.parkKept)
		if parked == nil {
			parked = map[Key]time.Time{}
		}
		maps.Copy(parked, c.parkPrior)
		maps.Copy(parked, c.parked)
	}
	buf := encodeParkState(parked, time.Now())
	c.parkMu.Unlock()
	if err := writeFileAtomic(p, buf); err != nil {
		c.log.Warn("cannot store the parked requests' expiries; their blocks get a fresh TTL at the next start", "path", p, "err", err)
	}
}

// encodeParkState is the file of the expiries parked, stored at now.
func encodeParkState(parked map[Key]time.Time, now time.Time) []byte {
	le := binary.LittleEndian
	buf := make([]byte, parkStateHdrLen, parkStateHdrLen+len(parked)*parkStateEntryLen+8)
	copy(buf, parkStateMagic)
	le.PutUint64(buf[8:], uint64(len(parked)))
	le.PutUint64(buf[16:], uint64(now.UnixNano()))
	for k, exp := range parked {
		buf = le.AppendUint32(buf, k.NS)
		buf = le.AppendUint32(buf, 0)
		buf = le.AppendUint64(buf, k.Hash.Hi)
		buf = le.AppendUint64(buf, k.Hash.Lo)
		buf = le.AppendUint64(buf, uint64(max(exp.Sub(now), 0)))
	}
	return le.AppendUint64(buf, xxh3.Hash(buf))
}

// writeFileAtomic replaces path with data (a temporary file renamed over
// it, synced): a crash leaves the old file or the new one.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
