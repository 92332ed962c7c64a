package nvme

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
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
// report, and so is a table it lists that is missing or not in the format
// this store writes (encrypted, compressed).
func checkTables(dir string, bo badger.Options) error {
	f, err := os.Open(filepath.Join(dir, badger.ManifestFilename))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	m, _, err := badger.ReplayManifestFile(f, bo.ExternalMagicVersion, bo)
	f.Close()
	if err != nil {
		return nil // badger's Open fails on it, without a panic
	}
	for id, tm := range m.Tables {
		if tm.KeyID != 0 || tm.Compression != options.None {
			continue
		}
		if err := checkTable(table.NewFilename(id, dir), id, bo); err != nil {
			return err
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
