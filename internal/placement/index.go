package placement

import "time"

// placementHeap is an indexed binary min-heap of shared workers ordered by
// utilisation (load/capacity, compared exactly as load_a×cap_b against
// load_b×cap_a), ties by id. Each worker records its position in the heap of
// every weight class (pos[class]), so a load or capacity change is an
// O(log n) fix rather than a scan of the fleet.
type placementHeap struct {
	class int
	items []*placementWorker
}

func placementLess(a, b *placementWorker) bool {
	l, r := a.load*b.capacity, b.load*a.capacity
	if l != r {
		return l < r
	}
	return a.id < b.id
}

// best returns the minimum, or the second best when the minimum is exclude.
func (h *placementHeap) best(exclude *placementWorker) *placementWorker {
	if len(h.items) == 0 {
		return nil
	}
	if top := h.items[0]; top != exclude {
		return top
	}
	var second *placementWorker
	for _, i := range [2]int{1, 2} {
		if i < len(h.items) && (second == nil || placementLess(h.items[i], second)) {
			second = h.items[i]
		}
	}
	return second
}

func (h *placementHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].pos[h.class] = i
	h.items[j].pos[h.class] = j
}

func (h *placementHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !placementLess(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *placementHeap) down(i int) bool {
	start := i
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && placementLess(h.items[r], h.items[l]) {
			m = r
		}
		if !placementLess(h.items[m], h.items[i]) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}

func (h *placementHeap) push(w *placementWorker) {
	w.pos[h.class] = len(h.items)
	h.items = append(h.items, w)
	h.up(len(h.items) - 1)
}

func (h *placementHeap) remove(i int) {
	n := len(h.items) - 1
	w := h.items[i]
	if i != n {
		h.swap(i, n)
	}
	h.items[n] = nil
	h.items = h.items[:n]
	w.pos[h.class] = -1
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
}

func (h *placementHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

// placementSeenHeap is an indexed binary min-heap of workers by last
// heartbeat heard, ties by id. The state keeps two: the live workers
// (a tick expires the oldest) and the dead ones (a tick forgets the
// oldest), so a tick visits only the workers past its cutoff rather than
// the whole fleet. A worker is in exactly one of them, at seenPos.
type placementSeenHeap struct {
	items []*placementWorker
}

func placementSeenLess(a, b *placementWorker) bool {
	if !a.heard.Equal(b.heard) {
		return a.heard.Before(b.heard)
	}
	return a.id < b.id
}

func (h *placementSeenHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].seenPos = i
	h.items[j].seenPos = j
}

func (h *placementSeenHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !placementSeenLess(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *placementSeenHeap) down(i int) bool {
	start, n := i, len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && placementSeenLess(h.items[r], h.items[l]) {
			m = r
		}
		if !placementSeenLess(h.items[m], h.items[i]) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}

func (h *placementSeenHeap) push(w *placementWorker) {
	w.seenPos = len(h.items)
	h.items = append(h.items, w)
	h.up(w.seenPos)
}

func (h *placementSeenHeap) remove(w *placementWorker) {
	i, n := w.seenPos, len(h.items)-1
	if i != n {
		h.swap(i, n)
	}
	h.items[n] = nil
	h.items = h.items[:n]
	w.seenPos = -1
	if i != n && !h.down(i) {
		h.up(i)
	}
}

// before returns the workers last heard strictly before cutoff, in no
// particular order. The heap order lets it skip every subtree whose root
// is not before cutoff.
func (h *placementSeenHeap) before(cutoff time.Time) []*placementWorker {
	var out []*placementWorker
	var walk func(i int)
	walk = func(i int) {
		if i >= len(h.items) || !h.items[i].heard.Before(cutoff) {
			return
		}
		out = append(out, h.items[i])
		walk(2*i + 1)
		walk(2*i + 2)
	}
	walk(0)
	return out
}

// countBefore counts the workers last heard strictly before cutoff,
// visiting only them (and the roots of the subtrees it skips).
func (h *placementSeenHeap) countBefore(cutoff time.Time) int {
	n := 0
	stack := []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i >= len(h.items) || !h.items[i].heard.Before(cutoff) {
			continue
		}
		n++
		stack = append(stack, 2*i+1, 2*i+2)
	}
	return n
}

// reindexSeen puts w in the live or the dead heap, at its place by
// heard time.
func (s *State) reindexSeen(w *placementWorker) {
	want := &s.liveBySeen
	if !w.live {
		want = &s.deadBySeen
	}
	if w.seenPos >= 0 {
		cur := &s.liveBySeen
		if w.seenDead {
			cur = &s.deadBySeen
		}
		if cur == want {
			if !cur.down(w.seenPos) {
				cur.up(w.seenPos)
			}
			return
		}
		cur.remove(w)
	}
	w.seenDead = !w.live
	want.push(w)
}

// unindexSeen takes w out of its heap (it is being forgotten).
func (s *State) unindexSeen(w *placementWorker) {
	if w.seenPos < 0 {
		return
	}
	if w.seenDead {
		s.deadBySeen.remove(w)
	} else {
		s.liveBySeen.remove(w)
	}
}
