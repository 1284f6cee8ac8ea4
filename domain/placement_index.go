package domain

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
