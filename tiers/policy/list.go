package policy

// entry is the per-block record shared by the list-based policies.
type entry struct {
	key        Key
	prev, next *entry
	pins       int32
	seg        uint8 // which list the entry is on (policy-specific)
	freq       uint8 // S3-FIFO frequency, saturating at 3
}

// list is an intrusive doubly linked list with a sentinel; front = most
// recently inserted (warm end), back = cold end.
type list struct {
	root entry
	n    int
}

func (l *list) init() *list {
	l.root.next, l.root.prev = &l.root, &l.root
	l.n = 0
	return l
}

func (l *list) lazy() {
	if l.root.next == nil {
		l.init()
	}
}

func (l *list) insertAfter(e, at *entry) {
	e.prev, e.next = at, at.next
	at.next.prev = e
	at.next = e
	l.n++
}

func (l *list) pushFront(e *entry) { l.lazy(); l.insertAfter(e, &l.root) }
func (l *list) pushBack(e *entry)  { l.lazy(); l.insertAfter(e, l.root.prev) }

func (l *list) remove(e *entry) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
	l.n--
}

func (l *list) moveToFront(e *entry) { l.remove(e); l.pushFront(e) }

func (l *list) back() *entry {
	if l.n == 0 {
		return nil
	}
	return l.root.prev
}

// coldestUnpinned returns the entry nearest the cold end that is not pinned,
// moving pinned entries it passes to the warm end (amortized O(1)).
func (l *list) coldestUnpinned() *entry {
	for range l.n {
		e := l.root.prev
		if e.pins == 0 {
			return e
		}
		l.moveToFront(e)
	}
	return nil
}
