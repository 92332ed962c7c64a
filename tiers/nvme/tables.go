package nvme

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
)

// checkTables opens each table the MANIFEST in dir lists, as badger's
// Open will, but on this goroutine, from a copy in memory (the tables hold
// the index's keys and 48-byte records, read once more at each start).
// Badger opens them on goroutines of its own (levels.go,
// newLevelsController), and a table whose footer is damaged (a torn or
// zeroed file, a bad sector) panics there (table.go,
// initBiggestAndSmallest re-panics after its debug dump; z.MmapFile.Bytes
// slices a negative offset), out of openDB's recover's reach: the process
// died, at every start. An error here is a corrupt directory (moved
// aside). A MANIFEST that cannot be read is left to badger's Open to
// report (listed is nil then), and so is a table it lists that is missing
// or not in the format this store writes (encrypted, compressed). listed
// is the set of tables the MANIFEST lists (empty without a MANIFEST).
// A torn tail of the MANIFEST is saved first (saveTornTail); failing that
// is logged, not an error: it is evidence, not the cache.
func checkTables(dir string, bo badger.Options, log *slog.Logger) (listed map[uint64]bool, err error) {
	f, err := os.Open(filepath.Join(dir, badger.ManifestFilename))
	if errors.Is(err, fs.ErrNotExist) {
		return map[uint64]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, whole, err := badger.ReplayManifestFile(f, bo.ExternalMagicVersion, bo)
	if err != nil {
		return nil, nil // badger's Open fails on it, without a panic
	}
	if err := saveTornTail(f, whole, dir); err != nil {
		log.Warn("nvme: cannot keep the torn tail of the MANIFEST that badger's open cuts", "err", err)
	}
	listed = make(map[uint64]bool, len(m.Tables))
	for id, tm := range m.Tables {
		listed[id] = true
		if tm.KeyID != 0 || tm.Compression != options.None {
			continue
		}
		if err := checkTable(table.NewFilename(id, dir), id, bo); err != nil {
			return nil, err
		}
	}
	return listed, nil
}

// tornTailName holds the bytes of a torn MANIFEST tail (a change set cut
// by a crash) while the store opens: badger's Open truncates them, and if
// the directory then turns out corrupt and is moved aside, the MANIFEST
// there is to be read as the crash left it (MANIFEST, then this file).
// Removed once the store has opened in place.
const tornTailName = "MANIFEST.torn-tail"

// saveTornTail writes the bytes of the MANIFEST f past whole (the end of
// its last whole change set), if any, to tornTailName.
func saveTornTail(f *os.File, whole int64, dir string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat MANIFEST: %w", err)
	}
	if fi.Size() <= whole {
		return nil
	}
	tail := make([]byte, fi.Size()-whole)
	if _, err := f.ReadAt(tail, whole); err != nil {
		return fmt.Errorf("read the MANIFEST's torn tail: %w", err)
	}
	if err := writeFileSync(filepath.Join(dir, tornTailName), tail); err != nil {
		return fmt.Errorf("save the MANIFEST's torn tail: %w", err)
	}
	return nil
}

// unlistedDirName is the subdirectory Open moves the tables the MANIFEST
// does not list into, out of badger's reach, until it has checked them.
const unlistedDirName = "unlisted"

// errLostTables: tables the MANIFEST does not list hold index records the
// opened index lacks. A MANIFEST cut short (or missing) still replays, to
// an older list of tables, and badger deletes the tables it does not list
// (levels.go, revertToManifest): without this check the store opened with
// part of its index or none, and reindex removed the segments no record
// pointed into, i.e. the whole cache, silently and with the evidence.
var errLostTables = errors.New("the MANIFEST does not list tables holding blocks the index lacks (MANIFEST truncated or lost)")

// setAsideUnlisted moves the tables in dir that listed does not name into
// dir/unlisted, where badger's Open neither deletes nor reads them. Those
// of an earlier Open that did not get to check them stay there.
func setAsideUnlisted(dir string, listed map[uint64]bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	ud := filepath.Join(dir, unlistedDirName)
	for _, e := range ents {
		id, ok := table.ParseFileID(e.Name())
		if !ok || listed[id] || !e.Type().IsRegular() {
			continue
		}
		if err := os.MkdirAll(ud, 0o700); err != nil {
			return err
		}
		dst := filepath.Join(ud, e.Name())
		for n := 1; ; n++ { // badger reuses the ids of tables it no longer lists
			if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
				break
			}
			dst = filepath.Join(ud, fmt.Sprintf("%s.%d", e.Name(), n))
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), dst); err != nil {
			return err
		}
	}
	return nil
}

// newestEntry is the newest version of a block key found in the tables the
// MANIFEST does not list.
type newestEntry struct {
	version uint64
	deleted bool
}

// checkUnlisted checks the tables setAsideUnlisted moved aside against the
// opened db and removes them when nothing in them is lost. A crash leaves
// such tables without loss: a flush's output whose MANIFEST entry it cut
// off (its log, replayed by badger's Open, holds the same records), a
// compaction's output (its inputs are still listed) or input (the
// compaction's output holds their newer versions). A block key whose
// newest version among them is a record the db has no version as new of
// (a record or a tombstone) was lost: errLostTables, a corrupt directory.
// A table that cannot be decoded is one a crash cut short while it was
// written when crashed (badger's log was left to replay), else a loss.
func checkUnlisted(dir string, db *badger.DB, bo badger.Options, crashed bool, log *slog.Logger) error {
	ud := filepath.Join(dir, unlistedDirName)
	ents, err := os.ReadDir(ud)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the tables the MANIFEST does not list: %w", err)
	}
	newest := map[[keyLen]byte]newestEntry{}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(ud, e.Name()))
		if err != nil {
			return fmt.Errorf("reading a table the MANIFEST does not list: %w", err)
		}
		if err := tableEntries(data, bo, newest); err != nil {
			if !crashed {
				return fmt.Errorf("%w: table %s: %v", errLostTables, e.Name(), err)
			}
			log.Warn("nvme: ignoring a damaged table the MANIFEST does not list, left by a crash while it was written", "table", e.Name(), "err", err)
		}
	}
	lost := 0
	err = db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: false, AllVersions: true, Prefix: []byte{prefixBlock}})
		defer it.Close()
		var last [keyLen]byte
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			if len(item.Key()) != keyLen {
				continue
			}
			kb := [keyLen]byte(item.Key())
			if kb == last {
				continue // an older version
			}
			last = kb
			// The db's newest version of the key, tombstones included.
			if ne, ok := newest[kb]; ok && item.Version() >= ne.version {
				delete(newest, kb)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("checking the tables the MANIFEST does not list: %w", err)
	}
	for _, ne := range newest {
		if !ne.deleted {
			lost++
		}
	}
	if lost > 0 {
		return fmt.Errorf("%w: %d tables not listed, %d blocks lost", errLostTables, len(ents), lost)
	}
	if err := os.RemoveAll(ud); err != nil {
		return fmt.Errorf("removing the tables the MANIFEST does not list: %w", err)
	}
	log.Info("nvme: removed tables the MANIFEST does not list, left by a crash; no block lost", "tables", len(ents))
	return nil
}

// bitDelete is badger's meta bit of a tombstone (value.go).
const bitDelete = 1 << 0

// tableEntries adds the newest version of each block key in the table
// data to newest.
func tableEntries(data []byte, bo badger.Options, newest map[[keyLen]byte]newestEntry) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("badger panicked reading it: %v", r)
		}
	}()
	t, err := table.OpenInMemoryTable(data, 0, &table.Options{
		ReadOnly: true, Compression: options.None, BlockSize: bo.BlockSize,
		BloomFalsePositive: bo.BloomFalsePositive, TableSize: uint64(bo.BaseTableSize),
	})
	if err != nil {
		return err
	}
	if err := t.VerifyChecksum(); err != nil {
		return err
	}
	it := t.NewIterator(0)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		k := y.ParseKey(it.Key())
		if len(k) != keyLen || k[0] != prefixBlock {
			continue
		}
		kb := [keyLen]byte(k)
		v := y.ParseTs(it.Key())
		if ne, ok := newest[kb]; !ok || v > ne.version {
			newest[kb] = newestEntry{version: v, deleted: it.Value().Meta&bitDelete != 0}
		}
	}
	return nil
}

// checkTable reads the table at path and opens it from memory (no
// mapping or descriptor of the file for badger to own).
func checkTable(path string, id uint64, bo badger.Options) (err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("table %s: %w", filepath.Base(path), err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("table %s is damaged: badger panicked reading it: %v", filepath.Base(path), r)
		}
	}()
	t, err := table.OpenInMemoryTable(data, id, &table.Options{
		ReadOnly: true, Compression: options.None, BlockSize: bo.BlockSize,
		BloomFalsePositive: bo.BloomFalsePositive, TableSize: uint64(bo.BaseTableSize),
	})
	if err != nil {
		return fmt.Errorf("table %s: %w", filepath.Base(path), err)
	}
	// Badger's Open reads only the footer, the index and the last block;
	// a damaged block before those (a bad sector, a torn page) panicked
	// later in reindex's iteration (a slice out of range, at every start)
	// or silently hid the keys after it. Every block's checksum is
	// verified here (the tables are small: the index's records only).
	if err := t.VerifyChecksum(); err != nil {
		return fmt.Errorf("table %s: %w", filepath.Base(path), err)
	}
	return nil
}

// writeFileSync writes b to path (created or truncated) and syncs it.
func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
