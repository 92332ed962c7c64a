package nvme

// index is the in-memory block index: key → size, plus an intrusive LRU
// list. Entries live in one slice linked by int32 indices, so the index holds
// no pointers (nothing for the GC to scan) and costs 48 B per entry plus the
// map slot. It is not safe for concurrent use; Store guards it with mu.
type index struct {
	m     map[Key]int32
	ents  []entry
	free  int32  // head of the free list (linked through next), nilIdx if empty
	head  int32  // most recently used
	tail  int32  // least recently used
	bytes int64  // sum of sizes
	walks uint64 // calls of walk (Stats.IndexWalks)
	// pinned, if set, marks the keys whose sizes pinnedBytes sums (the
	// store's Unevictable: parked blocks), kept here where every entry
	// comes and goes.
	pinned      func(Key) bool
	pinnedBytes int64
	// align is the segments' record alignment; padBytes sums the padding
	// that takes each block's size to it (charged by the byte budget).
	align    int64
	padBytes int64
}

type entry struct {
	key        Key
	size       int64
	seg        uint32 // segment holding the payload
	prev, next int32
}

const nilIdx int32 = -1

func newIndex(hint int) *index {
	return &index{m: make(map[Key]int32, hint), ents: make([]entry, 0, hint), free: nilIdx, head: nilIdx, tail: nilIdx}
}

func (x *index) len() int { return len(x.m) }

// pad is the padding of a size-byte record on disk.
func (x *index) pad(size int64) int64 {
	if x.align <= 1 {
		return 0
	}
	return (size+x.align-1)/x.align*x.align - size
}

func (x *index) get(k Key) (int32, bool) {
	i, ok := x.m[k]
	return i, ok
}

func (x *index) unlink(i int32) {
	e := &x.ents[i]
	if e.prev != nilIdx {
		x.ents[e.prev].next = e.next
	} else {
		x.head = e.next
	}
	if e.next != nilIdx {
		x.ents[e.next].prev = e.prev
	} else {
		x.tail = e.prev
	}
	e.prev, e.next = nilIdx, nilIdx
}

func (x *index) pushFront(i int32) {
	e := &x.ents[i]
	e.prev, e.next = nilIdx, x.head
	if x.head != nilIdx {
		x.ents[x.head].prev = i
	}
	x.head = i
	if x.tail == nilIdx {
		x.tail = i
	}
}

func (x *index) pushBack(i int32) {
	e := &x.ents[i]
	e.next, e.prev = nilIdx, x.tail
	if x.tail != nilIdx {
		x.ents[x.tail].next = i
	}
	x.tail = i
	if x.head == nilIdx {
		x.head = i
	}
}

func (x *index) touch(i int32) {
	if x.head == i {
		return
	}
	x.unlink(i)
	x.pushFront(i)
}

// put inserts or updates k as most recently used (or least recently used
// when cold is set) and returns the previous size (-1 if absent).
func (x *index) put(k Key, size int64, seg uint32, cold bool) int64 {
	if i, ok := x.m[k]; ok {
		old := x.ents[i].size
		x.ents[i].size = size
		x.ents[i].seg = seg
		x.bytes += size - old
		x.padBytes += x.pad(size) - x.pad(old)
		if x.pinned != nil && x.pinned(k) {
			x.pinnedBytes += size - old
		}
		x.unlink(i)
		if cold {
			x.pushBack(i)
		} else {
			x.pushFront(i)
		}
		return old
	}
	var i int32
	if x.free != nilIdx {
		i = x.free
		x.free = x.ents[i].next
	} else {
		x.ents = append(x.ents, entry{})
		i = int32(len(x.ents) - 1)
	}
	x.ents[i] = entry{key: k, size: size, seg: seg, prev: nilIdx, next: nilIdx}
	x.m[k] = i
	x.bytes += size
	x.padBytes += x.pad(size)
	if x.pinned != nil && x.pinned(k) {
		x.pinnedBytes += size
	}
	if cold {
		x.pushBack(i)
	} else {
		x.pushFront(i)
	}
	return -1
}

// remove deletes k and returns its size (-1 if absent) and segment.
func (x *index) remove(k Key) (int64, uint32) {
	i, ok := x.m[k]
	if !ok {
		return -1, 0
	}
	seg := x.ents[i].seg
	x.unlink(i)
	sz := x.ents[i].size
	x.bytes -= sz
	x.padBytes -= x.pad(sz)
	if x.pinned != nil && x.pinned(k) {
		x.pinnedBytes -= sz
	}
	delete(x.m, k)
	x.ents[i] = entry{prev: nilIdx, next: x.free}
	x.free = i
	return sz, seg
}

// walk visits entries from least to most recently used until fn returns false.
func (x *index) walk(fn func(k Key, size int64) bool) {
	x.walks++
	for i := x.tail; i != nilIdx; i = x.ents[i].prev {
		if !fn(x.ents[i].key, x.ents[i].size) {
			return
		}
	}
}
