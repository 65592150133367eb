// The shared n-gram trie of specbench.drafters.ngram_trie, compiled (drafter.impl=native).
//
// The same trie and the same trees as the Python NgramTrie / NgramTrieDrafter.draft (see that
// module's docstring for the rules): counts per n-gram, a global least-recently-used list over
// every node but the root (a path is touched deepest first, so the least recent node is a
// leaf), children ranked by count then recency, breadth-first drafting from the longest
// matched window down. The Python module builds this file with the host's C++ compiler and
// calls it through ctypes, one call a round for every request's inserts and one for every
// request's tree. A round allocates for its new nodes (amortised: the node records and the edge
// map double when full, a one-off stall of a few ms past a million nodes), each request's kept
// paths and the draft's small scratch vectors.
//
// Letters: B requests, L max_depth, M max_nodes (the draft budget, the root excluded).

#include <algorithm>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using i64 = int64_t;

// (node, token) -> child: open addressing, linear probing, at most half full, key and value side
// by side: one cache line read per lookup where a node-based std::unordered_map reads several.
class EdgeMap {
 public:
  explicit EdgeMap(size_t entries) {  // room for `entries` before the first doubling
    size_t n = 64;
    while (n < 2 * entries) n *= 2;
    rehash(n);
  }

  static uint64_t key(i64 node, i64 tok) { return (uint64_t(node) << 32) | uint32_t(tok); }

  i64 get(uint64_t k) const {
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (table_[i].key == k) return table_[i].value;
      if (table_[i].key == kEmpty) return -1;
    }
  }

  size_t size() const { return used_; }

  void put(uint64_t k, i64 v) {  // k is not present
    if (2 * (used_ + 1) > table_.size()) rehash(2 * table_.size());
    size_t i = slot(k);
    while (table_[i].key != kEmpty) i = (i + 1) & mask_;
    table_[i] = {k, v}, ++used_;
  }

  void erase(uint64_t k) {  // k is present; the entries after it shift back over the hole
    size_t i = slot(k);
    while (table_[i].key != k) i = (i + 1) & mask_;
    table_[i].key = kEmpty, --used_;
    for (size_t j = (i + 1) & mask_; table_[j].key != kEmpty; j = (j + 1) & mask_) {
      size_t home = slot(table_[j].key);
      bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);  // home in (i, j], cyclically
      if (!stays) {
        table_[i] = table_[j], table_[j].key = kEmpty;
        i = j;
      }
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);  // no key: node ids stay below 2^31
  struct Entry {
    uint64_t key;
    i64 value;
  };
  std::vector<Entry> table_;
  size_t mask_ = 0, used_ = 0;

  size_t slot(uint64_t k) const {  // a 64-bit mix (murmur3's finaliser)
    k ^= k >> 33, k *= 0xff51afd7ed558ccdULL, k ^= k >> 33, k *= 0xc4ceb9fe1a85ec53ULL, k ^= k >> 33;
    return size_t(k) & mask_;
  }

  void rehash(size_t n) {
    std::vector<Entry> old(n, Entry{kEmpty, 0});
    table_.swap(old), mask_ = n - 1, used_ = 0;
    for (const Entry& e : old)
      if (e.key != kEmpty) put(e.key, e.value);
  }
};

struct Trie {
  // One node, 0 the root: its children are first_child, then each one's next_sibling (-1 ends).
  struct Node {
    i64 token, parent, count, stamp, first_child, next_sibling;  // stamp: the clock at its last touch
  };
  i64 capacity, max_depth;
  i64 size = 0;   // nodes held, the root excluded
  i64 clock = 0;  // the last stamp given
  std::vector<Node> nodes{Node{-1, -1, 0, 0, -1, -1}};
  EdgeMap edges;
  std::vector<i64> free_ids;  // evicted nodes' ids, reused
  // The LRU list (node 0 its head and tail sentinel: next[0] is the least recent node) is kept
  // only once an insertion could reach capacity, as in the Python trie: until then a touch is
  // one stamp, and the stamps order the nodes as the list would.
  bool lru = false;
  std::vector<i64> prev, next;
  using Paths = std::vector<std::vector<i64>>;
  std::unordered_map<i64, Paths> growing;  // request slot -> node lists of its paths that may grow

  // Sized for the capacity up to half a million nodes (24 MB of records, 16 MB of edge map):
  // no doubling, a copy of every node inside some round, until then. Small tries run dense, so
  // that the tests' evictions shift edge-map entries back too.
  static constexpr i64 kReserved = i64(1) << 19;

  Trie(i64 capacity, i64 max_depth)
      : capacity(capacity), max_depth(max_depth), edges(size_t(std::min(capacity, kReserved))) {
    nodes.reserve(size_t(std::min(capacity, kReserved)) + 1);
  }

  i64 child(i64 node, i64 tok) const {  // -1: none (a node without children is not looked up)
    return nodes[node].first_child < 0 ? -1 : edges.get(EdgeMap::key(node, tok));
  }

  i64 find(const i64* ngram, i64 n) const {
    i64 node = 0;
    for (i64 i = 0; i < n && node >= 0; ++i) node = child(node, ngram[i]);
    return node;
  }

  void unlink(i64 node) {
    next[prev[node]] = next[node];
    prev[next[node]] = prev[node];
  }

  void append(i64 node) {  // as the most recent
    prev[node] = prev[0];
    next[node] = 0;
    next[prev[0]] = node;
    prev[0] = node;
  }

  // A root-to-node path used, deepest first: ancestors end up the more recent (the LRU list kept).
  void touch(const std::vector<i64>& path) {
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      nodes[*it].stamp = ++clock;
      unlink(*it), append(*it);
    }
  }

  void start_lru() {  // every node but the root, least recently touched first
    std::vector<i64> order;
    order.reserve(size);
    for (i64 node = 1; node < i64(nodes.size()); ++node) order.push_back(node);  // none was freed yet
    std::sort(order.begin(), order.end(), [this](i64 a, i64 b) { return nodes[a].stamp < nodes[b].stamp; });
    prev.assign(nodes.size(), 0), next.assign(nodes.size(), 0);
    for (i64 node : order) append(node);
    lru = true;
  }

  void evict() {  // the least recently used node, always a leaf
    i64 node = next[0];
    unlink(node);
    --size;
    Node& gone = nodes[node];
    edges.erase(EdgeMap::key(gone.parent, gone.token));
    i64* link = &nodes[gone.parent].first_child;  // unhook it from its siblings
    while (*link != node) link = &nodes[*link].next_sibling;
    *link = gone.next_sibling;
    free_ids.push_back(node);
  }

  i64 new_node(i64 tok, i64 up) {  // count 1: a new occurrence, or an evicted n-gram restarting
    i64 node;
    Node fresh{tok, up, 1, 0, -1, nodes[up].first_child};
    if (!free_ids.empty()) {
      node = free_ids.back();
      free_ids.pop_back();
      nodes[node] = fresh;
    } else {
      node = i64(nodes.size());
      nodes.push_back(fresh);
      if (lru) prev.push_back(0), next.push_back(0);
    }
    if (lru) append(node);  // touched with its path below
    nodes[up].first_child = node;
    edges.put(EdgeMap::key(up, tok), node);
    ++size;
    return node;
  }

  // One path from the root, once the LRU list is kept; nodes at depth >= new_depth (1-based)
  // are new occurrences. Its existing nodes are touched before any eviction, so the path never
  // loses a node.
  void insert_path(const i64* path, i64 n, i64 new_depth, std::vector<i64>& walked) {
    walked.clear();
    for (i64 node = 0; i64(walked.size()) < n;) {
      node = child(node, path[walked.size()]);
      if (node < 0) break;
      walked.push_back(node);
    }
    i64 missing = n - i64(walked.size());
    if (size + missing > capacity) {
      touch(walked);
      while (size + missing > capacity) evict();
    }
    for (i64 d = new_depth; d <= i64(walked.size()); ++d) ++nodes[walked[d - 1]].count;
    for (i64 i = i64(walked.size()); i < n; ++i) walked.push_back(new_node(path[i], i ? walked[i - 1] : 0));
    touch(walked);
  }

  // Every n-gram (length <= L) of tokens[0:t] that ends at a position >= first_new, for the
  // request in `slot`. Until eviction is possible, each path is walked and extended once and the
  // paths that may still grow are kept per slot: the next insert of the same history re-stamps
  // their old parts and extends them (about L lookups per new token instead of L^2 / 2), the
  // same trie, stamp for stamp, as NgramTrie.insert's `known`.
  void insert(const i64* tokens, i64 t, i64 first_new, i64 slot, std::vector<i64>& walked) {
    i64 first_s = std::max<i64>(0, first_new - max_depth + 1);
    Paths old, grown;
    auto it = growing.find(slot);
    if (it != growing.end()) old.swap(it->second), growing.erase(it);
    bool use_old = first_new > 0 && !lru && i64(old.size()) == first_new - first_s;
    for (i64 s = first_s; s < t; ++s) {
      i64 end = std::min(s + max_depth, t), n = end - s;
      if (!lru && size + n > capacity) start_lru();
      if (lru) {
        insert_path(tokens + s, n, std::max<i64>(1, first_new - s + 1), walked);
        continue;
      }
      // No eviction can happen: its nodes are stamped deepest first, as touch() does.
      bool known = use_old && s < first_new;
      std::vector<i64>& path = known ? old[s - first_s] : walked;
      i64 node = 0, start = s, now = clock += n;
      if (known) {  // the old part: nodes known, only touched
        for (i64 x : path) nodes[x].stamp = now--;
        node = path.back(), start = first_new;
      } else {
        path.clear();
      }
      i64 counted = std::max(s, first_new);  // tokens[i] for i >= counted end a new occurrence
      for (i64 i = start; i < end; ++i) {
        i64 c = child(node, tokens[i]);
        if (c < 0)
          c = new_node(tokens[i], node);
        else if (i >= counted)
          ++nodes[c].count;
        nodes[c].stamp = now--;
        node = c;
        path.push_back(c);
      }
      if (n < max_depth) grown.push_back(path);  // it ends at the last token: it may grow
    }
    if (!lru) growing[slot] = std::move(grown);
  }

  // The `width` best children: highest count first, ties to the most recently touched.
  void ranked(i64 node, i64 width, std::vector<i64>& out) const {
    out.clear();
    for (i64 c = nodes[node].first_child; c >= 0; c = nodes[c].next_sibling) out.push_back(c);
    auto better = [this](i64 a, i64 b) {
      const Node &x = nodes[a], &y = nodes[b];
      return x.count != y.count ? x.count > y.count : x.stamp > y.stamp;
    };
    width = std::min<i64>(width, i64(out.size()));
    std::partial_sort(out.begin(), out.begin() + width, out.end(), better);
    out.resize(width);
  }
};

struct Params {
  i64 k, max_nodes, min_window, max_window, min_breadth, max_breadth;

  i64 breadth(i64 depth) const {  // SGLang's linear rule, floored (as Python's //), >= 1
    i64 span = max_window - min_window + 1;
    i64 step = (max_breadth - min_breadth) * (max_window - depth);
    i64 q = step / span - (step % span != 0 && (step < 0) != (span < 0));
    return std::max<i64>(1, min_breadth + q);
  }
};

// One request's tree after its history's last n tokens `tail`: tokens [m] and parents [m]
// (0 the root) written level by level, siblings in drafting order; returns m. paths: the
// request's growing paths from its insert of this same history, whose last nodes are its
// windows' nodes (no lookup; the Python drafter's window_nodes), or null: found from the root.
i64 draft(const Trie& trie, const Params& p, const i64* tail, i64 n, const Trie::Paths* paths, i64* out_tokens,
          i64* out_parents) {
  if (p.k < 1 || p.max_nodes < 1) return 0;
  std::vector<std::pair<i64, i64>> drafted;  // (token, draft parent), in drafting order; node i is drafted[i - 1]
  struct Item { i64 at, node, depth, level; };
  std::deque<Item> queue;
  std::vector<i64> ranked;
  auto full = [&] { return i64(drafted.size()) >= p.max_nodes; };
  i64 held = paths ? i64(paths->size()) : 0;  // paths in start order: the last is 1 token long
  for (i64 w = std::min(n, p.max_window); w >= p.min_window && !full(); --w) {
    i64 matched = w <= held ? (*paths)[held - w].back() : trie.find(tail + n - w, w);
    if (matched < 0) continue;
    queue.clear();
    queue.push_back({0, matched, w, 0});
    while (!queue.empty() && !full()) {
      Item item = queue.front();
      queue.pop_front();
      if (item.level >= p.k) continue;
      trie.ranked(item.node, std::min(p.breadth(item.depth), p.max_nodes), ranked);
      for (i64 c : ranked) {
        if (full()) break;
        i64 tok = trie.nodes[c].token, at = 0;
        for (i64 j = 0; j < i64(drafted.size()) && !at; ++j)  // the same token under the same parent: reused
          if (drafted[j].first == tok && drafted[j].second == item.at) at = j + 1;
        if (!at) {
          drafted.emplace_back(tok, item.at);
          at = i64(drafted.size());
        }
        queue.push_back({at, c, item.depth + 1, item.level + 1});
      }
    }
  }
  // Level order: breadth-first from the root over the drafted nodes, siblings in drafting order.
  i64 m = i64(drafted.size());
  std::vector<i64> order, renumber(m + 1, 0);
  order.reserve(m);
  for (i64 head = -1; head < i64(order.size()); ++head) {
    i64 from = head < 0 ? 0 : order[head];
    for (i64 c = 1; c <= m; ++c)
      if (drafted[c - 1].second == from) {
        order.push_back(c);
        renumber[c] = i64(order.size());
      }
  }
  for (i64 i = 0; i < m; ++i) {
    out_tokens[i] = drafted[order[i] - 1].first;
    out_parents[i] = renumber[drafted[order[i] - 1].second];
  }
  return m;
}

}  // namespace

extern "C" {

void* trie_new(i64 capacity, i64 max_depth) { return new Trie(capacity, max_depth); }

void trie_free(void* trie) { delete static_cast<Trie*>(trie); }

i64 trie_size(void* trie) { return static_cast<Trie*>(trie)->size; }

// Occurrences of an n-gram (0 when absent or evicted).
i64 trie_count(void* trie, const i64* ngram, i64 n) {
  auto* t = static_cast<Trie*>(trie);
  i64 node = t->find(ngram, n);
  return node < 0 ? 0 : t->nodes[node].count;
}

// B requests' inserts, in order. args: offsets [B + 1], first_new [B], slots [B], then the
// tokens: request b (in slots[b], a number the caller keeps per request) has
// tokens[offsets[b] : offsets[b + 1]], of which those from first_new[b] on are new;
// first_new[b] = 0: its history starts over.
void trie_insert(void* trie, const i64* args, i64 B) {
  auto* t = static_cast<Trie*>(trie);
  const i64 *offsets = args, *first_new = args + B + 1, *slots = first_new + B, *tokens = slots + B;
  std::vector<i64> walked;
  walked.reserve(t->max_depth);
  for (i64 b = 0; b < B; ++b)
    t->insert(tokens + offsets[b], offsets[b + 1] - offsets[b], first_new[b], slots[b], walked);
}

// B requests' trees from the trie as it is. args: offsets [B + 1], slots [B], then the tails:
// request b's history tail is tails[offsets[b] : offsets[b + 1]]; slots[b] is its slot if its
// last insert was of this same history (its windows are then taken from the paths kept), else
// -1. out: tokens [B, M] (-1 past each tree), parents [B, M] (0 there), then counts [B].
void trie_draft(void* trie, const i64* args, i64 B, i64 k, i64 max_nodes, i64 min_window, i64 max_window,
                i64 min_breadth, i64 max_breadth, i64* out) {
  const Trie& t = *static_cast<Trie*>(trie);
  const Params p{k, max_nodes, min_window, max_window, min_breadth, max_breadth};
  const i64 *offsets = args, *slots = args + B + 1, *tails = slots + B;
  i64 *tokens = out, *parents = out + B * max_nodes, *num = parents + B * max_nodes;
  std::fill(tokens, parents, -1);
  std::fill(parents, num, 0);
  for (i64 b = 0; b < B; ++b) {
    auto it = t.lru || slots[b] < 0 ? t.growing.end() : t.growing.find(slots[b]);  // evicting: none kept
    num[b] = draft(t, p, tails + offsets[b], offsets[b + 1] - offsets[b], it == t.growing.end() ? nullptr : &it->second,
                   tokens + b * max_nodes, parents + b * max_nodes);
  }
}

// Nodes that the edge map or their parent's child list does not lead to (0 for a sound trie),
// for the tests: every live node is found under (parent, token), as often as the map has
// entries, and is on its parent's list of children.
i64 trie_check(void* trie) {
  const Trie& t = *static_cast<Trie*>(trie);
  std::vector<bool> freed(t.nodes.size(), false);
  for (i64 node : t.free_ids) freed[node] = true;
  i64 bad = t.edges.size() == size_t(t.size) ? 0 : 1;
  for (i64 node = 1; node < i64(t.nodes.size()); ++node) {
    if (freed[node]) continue;
    const auto& n = t.nodes[node];
    bad += t.edges.get(EdgeMap::key(n.parent, n.token)) != node;
    i64 c = t.nodes[n.parent].first_child;
    while (c >= 0 && c != node) c = t.nodes[c].next_sibling;
    bad += c != node;
  }
  return bad;
}

// A finished request's kept paths dropped (its n-grams stay).
void trie_forget(void* trie, i64 slot) { static_cast<Trie*>(trie)->growing.erase(slot); }

}  // extern "C"
