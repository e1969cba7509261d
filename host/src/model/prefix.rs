//! The generation prefix cache: prompts' keys and values kept by token prefix, so that a
//! prefix an agent has already processed (turn 1's question and instructions, which every
//! agent of a frozen turn 1 sees; at turn t, the agent's own turn t-1 conversation) is not
//! computed again. In the manner of SGLang's RadixAttention: a lookup finds the longest
//! token prefix the prompt shares with any sequence kept for the same weights, and the
//! prompt's forward continues from that sequence's keys and values for those positions
//! (causal attention: a position's keys and values depend only on the tokens up to it).
//!
//! The cache is a radix tree per weights: each node holds a run of tokens and their keys and
//! values, and a sequence (prompt, or prompt and response) is a path from a root, so
//! sequences that share a prefix share its memory as well as its computation. A sequence
//! that extends a kept one adds a child for its new positions; one that parts from a kept
//! one inside a node splits the node there. Keys and values are stored at positions counted
//! from the sequence's first token (no padding); a batch places them after its row's padding
//! by rotating the keys (RoPE rotations compose). Bounded in bytes; the least recently used
//! leaf goes first, and a node whose children have all gone becomes a leaf.

use super::agent::Agent;
use anyhow::Result;
use candle_core::{DType, Tensor};
use std::sync::Arc;

/// How much of the prompts a cache served: positions taken from kept sequences (`reused`)
/// and positions computed (`computed`); and the most bytes of keys and values it held at
/// once (`peak_bytes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    pub reused: u64,
    pub computed: u64,
    pub peak_bytes: u64,
}

impl PrefixStats {
    /// The share of prompt positions taken from the cache (0 when nothing was asked).
    pub fn hit_rate(&self) -> f64 {
        let all = self.reused + self.computed;
        if all == 0 {
            0.0
        } else {
            self.reused as f64 / all as f64
        }
    }
}

impl std::ops::AddAssign for PrefixStats {
    fn add_assign(&mut self, o: PrefixStats) {
        self.reused += o.reused;
        self.computed += o.computed;
        // Caches apart hold their bytes side by side.
        self.peak_bytes += o.peak_bytes;
    }
}

/// Per layer: keys and values, each (1, kv heads, positions, head dim).
pub(crate) type LayerKvs = Vec<(Tensor, Tensor)>;

/// A node of the tree: the tokens it adds to its parent's sequence (never none), and their
/// keys and values (per layer, (1, kv heads, tokens, head dim)), stored apart from any
/// other node's.
struct Node {
    /// Which weights computed it ([`speaker_key`]).
    key: u64,
    parent: Option<usize>,
    /// Each child's tokens start with a different token.
    children: Vec<usize>,
    tokens: Vec<u32>,
    kvs: LayerKvs,
    bytes: usize,
    used: u64,
}

/// Keys and values of sequences generated before, by weights and token prefix. Valid only
/// while the weights a key names are unchanged: [`speaker_key`] fingerprints an adapter's
/// weights, but not the base's, so a cache must not outlive a change to a base's own
/// weights (full fine-tuning).
pub struct PrefixCache {
    budget: usize,
    /// The tree, in slots; `None` is a free slot.
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    bytes: usize,
    clock: u64,
    stats: PrefixStats,
}

/// Where a walk down the tree ended: the nodes it went through, with how many of each
/// one's tokens matched (all of them but perhaps the last one's), and the positions matched.
struct Walk {
    path: Vec<(usize, usize)>,
    matched: usize,
}

impl PrefixCache {
    /// A cache holding at most `budget_bytes` of keys and values.
    pub fn new(budget_bytes: usize) -> PrefixCache {
        PrefixCache {
            budget: budget_bytes,
            nodes: Vec::new(),
            free: Vec::new(),
            bytes: 0,
            clock: 0,
            stats: PrefixStats::default(),
        }
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sequences held: the tree's leaves.
    pub fn len(&self) -> usize {
        self.live().filter(|(_, n)| n.children.is_empty()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.live().next().is_none()
    }

    /// What the cache served since it was made or last asked by `take_stats`.
    pub fn take_stats(&mut self) -> PrefixStats {
        let stats = std::mem::take(&mut self.stats);
        self.stats.peak_bytes = self.bytes as u64;
        stats
    }

    pub(crate) fn count(&mut self, reused: usize, computed: usize) {
        self.stats.reused += reused as u64;
        self.stats.computed += computed as u64;
    }

    /// Forgets every sequence (what it served is still counted).
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.free.clear();
        self.bytes = 0;
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("a linked node is live")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("a linked node is live")
    }

    /// Follows `tokens` down `key`'s tree as far as it is held.
    fn walk(&self, key: u64, tokens: &[u32]) -> Walk {
        let mut walk = Walk {
            path: Vec::new(),
            matched: 0,
        };
        let mut next: Vec<usize> = self
            .live()
            .filter(|(_, n)| n.key == key && n.parent.is_none())
            .map(|(i, _)| i)
            .collect();
        while let Some(&first) = tokens.get(walk.matched) {
            let Some(i) = next
                .iter()
                .copied()
                .find(|&i| self.node(i).tokens[0] == first)
            else {
                break;
            };
            let node = self.node(i);
            let m = common_prefix(&node.tokens, &tokens[walk.matched..]);
            walk.path.push((i, m));
            walk.matched += m;
            if m < node.tokens.len() {
                break;
            }
            next.clone_from(&node.children);
        }
        walk
    }

    fn touch(&mut self, path: &[(usize, usize)]) {
        self.clock += 1;
        let clock = self.clock;
        for &(i, _) in path {
            self.node_mut(i).used = clock;
        }
    }

    /// The longest prefix of `tokens` held for `key`, at most all but the last token (the
    /// last one's forward gives the logits to sample from): its length and its keys and
    /// values, or `None` when nothing is shared.
    pub(crate) fn lookup(&mut self, key: u64, tokens: &[u32]) -> Option<(usize, LayerKvs)> {
        let most = tokens.len().saturating_sub(1);
        let walk = self.walk(key, &tokens[..most]);
        if walk.matched == 0 {
            return None;
        }
        self.touch(&walk.path);
        let layers = self.node(walk.path[0].0).kvs.len();
        let assemble = |layer: usize| -> candle_core::Result<(Tensor, Tensor)> {
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            for &(i, m) in &walk.path {
                let (k, v) = &self.node(i).kvs[layer];
                ks.push(k.narrow(2, 0, m)?);
                vs.push(v.narrow(2, 0, m)?);
            }
            match ks.len() {
                1 => Ok((ks.remove(0), vs.remove(0))),
                _ => Ok((Tensor::cat(&ks, 2)?, Tensor::cat(&vs, 2)?)),
            }
        };
        let kvs = (0..layers)
            .map(assemble)
            .collect::<candle_core::Result<LayerKvs>>()
            .ok()?;
        Some((walk.matched, kvs))
    }

    /// Keeps `tokens`' keys and values `kvs` (one position per token) for `key`: the part
    /// of `tokens` the tree already holds is shared, and only the rest is stored. Least
    /// recently used sequences make room (never the ones `tokens` extends); a sequence whose
    /// new part is larger than the whole budget, or that cannot fit beside what it extends,
    /// is not kept.
    pub(crate) fn insert(&mut self, key: u64, tokens: Vec<u32>, kvs: LayerKvs) -> Result<()> {
        if let Some((k, _)) = kvs.first() {
            anyhow::ensure!(
                k.dim(2)? == tokens.len(),
                "prefix cache: {} positions for {} tokens",
                k.dim(2)?,
                tokens.len()
            );
        }
        let walk = self.walk(key, &tokens);
        self.touch(&walk.path);
        let (n, len) = (walk.matched, tokens.len());
        if n == len || kvs.is_empty() {
            return Ok(());
        }
        let all_bytes: usize = kvs
            .iter()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum();
        let bytes = all_bytes / len * (len - n);
        if bytes > self.budget {
            return Ok(());
        }
        while self.bytes + bytes > self.budget {
            let now = self.clock;
            let oldest = self
                .live()
                .filter(|(_, n)| n.children.is_empty() && n.used < now)
                .min_by_key(|(_, n)| n.used)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => self.remove_leaf(i),
                None => return Ok(()),
            }
        }
        // Where the new part hangs: under the last node matched whole, after splitting
        // the one matched in part.
        let parent = match walk.path.last() {
            None => None,
            Some(&(i, m)) if m == self.node(i).tokens.len() => Some(i),
            Some(&(i, m)) => Some(self.split(i, m)?),
        };
        // Stored contiguous and apart from the batch they came from, which then can go.
        let kvs = kvs
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.narrow(2, n, len - n)?.force_contiguous()?,
                    v.narrow(2, n, len - n)?.force_contiguous()?,
                ))
            })
            .collect::<Result<LayerKvs>>()?;
        let node = Node {
            key,
            parent,
            children: Vec::new(),
            tokens: tokens[n..].to_vec(),
            kvs,
            bytes,
            used: self.clock,
        };
        let i = self.put(node);
        if let Some(p) = parent {
            self.node_mut(p).children.push(i);
        }
        self.bytes += bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.bytes as u64);
        Ok(())
    }

    fn put(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Cuts node `i` after its first `m` tokens (0 < m < its length): `i` keeps them, and a
    /// new child takes the rest with `i`'s children. Returns `i`.
    fn split(&mut self, i: usize, m: usize) -> Result<usize> {
        let node = self.node_mut(i);
        let len = node.tokens.len();
        let cut = |t: &Tensor, from: usize, n: usize| t.narrow(2, from, n)?.force_contiguous();
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        for (k, v) in &node.kvs {
            head.push((cut(k, 0, m)?, cut(v, 0, m)?));
            tail.push((cut(k, m, len - m)?, cut(v, m, len - m)?));
        }
        let head_bytes = node.bytes / len * m;
        let rest = Node {
            key: node.key,
            parent: Some(i),
            children: std::mem::take(&mut node.children),
            tokens: node.tokens.split_off(m),
            kvs: tail,
            bytes: node.bytes - head_bytes,
            used: node.used,
        };
        node.kvs = head;
        node.bytes = head_bytes;
        let j = self.put(rest);
        let grandchildren = self.node(j).children.clone();
        for c in grandchildren {
            self.node_mut(c).parent = Some(j);
        }
        self.node_mut(i).children.push(j);
        Ok(i)
    }

    fn remove_leaf(&mut self, i: usize) {
        let node = self.nodes[i].take().expect("a leaf to remove is live");
        self.free.push(i);
        self.bytes -= node.bytes;
        if let Some(p) = node.parent {
            self.node_mut(p).children.retain(|&c| c != i);
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Which weights an agent speaks with, for the cache: its base (by identity) and its
/// adapter's weights (by content, so that an adapter trained in place gets a new key).
/// `None` when its output is not a function of its weights alone: an adapter with dropout
/// switched on.
pub fn speaker_key(agent: &Agent) -> Result<Option<u64>> {
    let mut h = Fnv::new();
    h.write(&(Arc::as_ptr(&agent.base) as usize as u64).to_le_bytes());
    if let Some(lora) = &agent.lora {
        if lora.dropout_on() {
            return Ok(None);
        }
        h.write(&lora.config().scale().to_le_bytes());
        for (name, var) in lora.named_vars() {
            h.write(name.as_bytes());
            let t = var.as_tensor().to_dtype(DType::F32)?.flatten_all()?;
            for x in t.to_vec1::<f32>()? {
                h.write(&x.to_bits().to_le_bytes());
            }
        }
    }
    Ok(Some(h.0))
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn kvs(len: usize, fill: f32) -> LayerKvs {
        let t = Tensor::full(fill, (1, 2, len, 4), &Device::Cpu).unwrap();
        vec![(t.clone(), t)]
    }

    #[test]
    fn the_longest_shared_prefix_of_the_same_weights_is_found() {
        let mut c = PrefixCache::new(1 << 20);
        c.insert(1, vec![1, 2, 3, 4], kvs(4, 1.0)).unwrap();
        c.insert(1, vec![1, 2, 9], kvs(3, 2.0)).unwrap();
        c.insert(2, vec![1, 2, 3, 4, 5], kvs(5, 3.0)).unwrap();
        let (n, kv) = c.lookup(1, &[1, 2, 3, 7, 7]).unwrap();
        assert_eq!(n, 3);
        assert_eq!(kv[0].0.dims(), &[1, 2, 3, 4]);
        assert_eq!(
            kv[0].0.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0],
            1.0
        );
        // Never the whole prompt: its last token's forward gives the logits.
        assert_eq!(c.lookup(1, &[1, 2, 3, 4]).unwrap().0, 3);
        // Other weights, or nothing in common: no hit.
        assert!(c.lookup(3, &[1, 2, 3]).is_none());
        assert!(c.lookup(1, &[8, 1, 2]).is_none());
        assert_eq!(c.lookup(2, &[1, 2, 3, 4, 5, 6]).unwrap().0, 5);
    }

    #[test]
    fn an_extension_adds_its_new_positions_and_a_prefix_adds_nothing() {
        let mut c = PrefixCache::new(1 << 20);
        c.insert(1, vec![1, 2], kvs(2, 1.0)).unwrap();
        c.insert(1, vec![1, 2, 3], kvs(3, 1.0)).unwrap();
        assert_eq!(c.len(), 1);
        c.insert(1, vec![1], kvs(1, 1.0)).unwrap();
        assert_eq!(c.len(), 1);
        // The same tokens under other weights are another sequence.
        c.insert(2, vec![1, 2], kvs(2, 1.0)).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.bytes(), (3 + 2) * 2 * 2 * 4 * 4);
        c.clear();
        assert!((c.is_empty(), c.bytes()) == (true, 0));
        assert!(c.lookup(2, &[1, 2, 3]).is_none());
    }

    #[test]
    fn the_budget_holds_and_the_least_recently_used_goes_first() {
        let per_position = 2 * 2 * 4 * 4; // k and v, 2 heads, 4 dims, f32
        let mut c = PrefixCache::new(10 * per_position);
        c.insert(1, vec![1, 1, 1, 1], kvs(4, 1.0)).unwrap();
        c.insert(1, vec![2, 2, 2, 2], kvs(4, 2.0)).unwrap();
        assert_eq!(c.lookup(1, &[1, 1, 5]).unwrap().0, 2); // touches the first
        c.insert(1, vec![3, 3, 3, 3], kvs(4, 3.0)).unwrap();
        assert!(c.bytes() <= 10 * per_position);
        assert!(
            c.lookup(1, &[2, 2, 5]).is_none(),
            "the least recently used went"
        );
        assert!(c.lookup(1, &[1, 1, 5]).is_some());
        assert!(c.lookup(1, &[3, 3, 5]).is_some());
        // Larger than the whole budget: not kept, nothing else lost.
        c.insert(1, (0..11).collect(), kvs(11, 4.0)).unwrap();
        assert_eq!(c.len(), 2);
        // A length mismatch is refused.
        assert!(c.insert(1, vec![1, 2], kvs(3, 1.0)).is_err());
    }

    /// Keys and values that are the tokens themselves (values ten times them): what a
    /// lookup returns shows which positions it was assembled from.
    fn of(tokens: &[u32]) -> LayerKvs {
        let k: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| x * 10.0).collect();
        let shape = (1, 1, tokens.len(), 1);
        let k = Tensor::from_vec(k, shape, &Device::Cpu).unwrap();
        let v = Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
        vec![(k.clone(), v.clone()), (k, v)]
    }

    const PER_POSITION: usize = 2 * 2 * 4; // two layers, k and v, one f32 each

    /// The tokens a lookup's keys and values were made from, checked against the values.
    fn content(kvs: &LayerKvs) -> Vec<u32> {
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let k = flat(&kvs[0].0);
        for (lk, lv) in kvs {
            assert_eq!(flat(lk), k);
            assert_eq!(flat(lv), k.iter().map(|x| x * 10.0).collect::<Vec<_>>());
        }
        k.iter().map(|&x| x as u32).collect()
    }

    /// The tree's links and byte counts agree.
    fn check(c: &PrefixCache) {
        let mut bytes = 0;
        for (i, n) in c.live() {
            assert!(!n.tokens.is_empty());
            assert_eq!(n.bytes, n.tokens.len() * PER_POSITION);
            assert_eq!(n.kvs[0].0.dim(2).unwrap(), n.tokens.len());
            bytes += n.bytes;
            if let Some(p) = n.parent {
                assert!(c.node(p).children.contains(&i));
                assert_eq!(c.node(p).key, n.key);
            }
            for &ch in &n.children {
                assert_eq!(c.node(ch).parent, Some(i));
            }
            let firsts: std::collections::HashSet<u32> =
                n.children.iter().map(|&ch| c.node(ch).tokens[0]).collect();
            assert_eq!(
                firsts.len(),
                n.children.len(),
                "children part at their first token"
            );
        }
        assert_eq!(c.bytes(), bytes);
        assert!(c.bytes() <= c.budget);
    }

    #[test]
    fn sequences_that_share_a_prefix_share_its_memory() {
        let mut c = PrefixCache::new(1 << 20);
        for s in [&[1, 2, 3, 4][..], &[1, 2, 3, 5, 6], &[1, 2, 7]] {
            c.insert(1, s.to_vec(), of(s)).unwrap();
            check(&c);
        }
        // [1, 2] [3] [4] / [5, 6] / [7]: seven positions, not nine, and three sequences.
        assert_eq!((c.bytes(), c.len()), (7 * PER_POSITION, 3));
        c.clear();
        assert_eq!(c.take_stats().peak_bytes, 7 * PER_POSITION as u64);
        assert_eq!(
            c.take_stats().peak_bytes,
            0,
            "counted again from what is held"
        );
        for s in [&[1, 2, 3, 4][..], &[1, 2, 3, 5, 6], &[1, 2, 7]] {
            c.insert(1, s.to_vec(), of(s)).unwrap();
        }
        let (n, kv) = c.lookup(1, &[1, 2, 3, 5, 6, 9]).unwrap();
        assert_eq!((n, content(&kv)), (5, vec![1, 2, 3, 5, 6]));
        let (n, kv) = c.lookup(1, &[1, 2, 7, 7]).unwrap();
        assert_eq!((n, content(&kv)), (3, vec![1, 2, 7]));
        let (n, kv) = c.lookup(1, &[1, 2, 3, 4, 8]).unwrap();
        assert_eq!((n, content(&kv)), (4, vec![1, 2, 3, 4]));
        // Parting inside a node: [1, 2, 3] of [1, 2] [3] [4].
        let (n, kv) = c.lookup(1, &[1, 2, 3, 9]).unwrap();
        assert_eq!((n, content(&kv)), (3, vec![1, 2, 3]));
    }

    #[test]
    fn a_branch_goes_and_the_prefix_it_shared_stays() {
        let mut c = PrefixCache::new(7 * PER_POSITION);
        for s in [&[1, 2, 3, 4][..], &[1, 2, 3, 5, 6], &[1, 2, 7]] {
            c.insert(1, s.to_vec(), of(s)).unwrap();
        }
        c.lookup(1, &[1, 2, 3, 4, 0]).unwrap();
        c.lookup(1, &[1, 2, 7, 0]).unwrap();
        // Two new positions: the least recently used leaf, [5, 6], makes room.
        c.insert(1, vec![9, 9], of(&[9, 9])).unwrap();
        check(&c);
        assert_eq!((c.bytes(), c.len()), (7 * PER_POSITION, 3));
        let (n, kv) = c.lookup(1, &[1, 2, 3, 5, 6, 0]).unwrap();
        assert_eq!((n, content(&kv)), (3, vec![1, 2, 3]));
        // Extending a sequence never evicts what it extends, even when nothing else can
        // go: it is then not kept, and what was held stays.
        let mut c = PrefixCache::new(4 * PER_POSITION);
        c.insert(1, vec![1, 2, 3], of(&[1, 2, 3])).unwrap();
        c.insert(1, vec![1, 2, 3, 4, 5], of(&[1, 2, 3, 4, 5]))
            .unwrap();
        check(&c);
        assert_eq!(c.lookup(1, &[1, 2, 3, 4, 5, 6]).unwrap().0, 3);
        // The least recently used sequence makes room for others.
        c.insert(1, vec![8], of(&[8])).unwrap();
        c.insert(1, vec![2, 2, 2], of(&[2, 2, 2])).unwrap();
        check(&c);
        assert!(c.lookup(1, &[1, 2, 3, 9]).is_none());
        assert_eq!(c.lookup(1, &[2, 2, 2, 9]).unwrap().0, 3);
    }

    /// Random sequences over a small alphabet (so that they share prefixes and part inside
    /// nodes), under random keys: every lookup finds the longest prefix any kept sequence of
    /// its key shares, assembled from the right positions; without a budget the tree holds
    /// each distinct prefix once; with one, the links and bytes stay consistent.
    #[test]
    fn random_sequences_are_found_whole_and_stored_once() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for budget in [usize::MAX, 40 * PER_POSITION] {
            let mut c = PrefixCache::new(budget);
            let mut kept: Vec<(u64, Vec<u32>)> = Vec::new();
            for _ in 0..300 {
                let key = next(2);
                let len = 1 + next(9) as usize;
                let s: Vec<u32> = (0..len).map(|_| next(3) as u32).collect();
                if next(2) == 0 {
                    c.insert(key, s.clone(), of(&s)).unwrap();
                    kept.push((key, s));
                    check(&c);
                    continue;
                }
                let most = s.len() - 1;
                let best = kept
                    .iter()
                    .filter(|(k, _)| *k == key)
                    .map(|(_, t)| common_prefix(t, &s[..most]))
                    .max()
                    .unwrap_or(0);
                match c.lookup(key, &s) {
                    Some((n, kv)) => {
                        assert_eq!(content(&kv), s[..n]);
                        assert!(n <= best);
                        if budget == usize::MAX {
                            assert_eq!(n, best, "{s:?} under key {key}");
                        }
                    }
                    None => assert!(budget != usize::MAX || best == 0),
                }
            }
            if budget == usize::MAX {
                let prefixes: std::collections::HashSet<(u64, &[u32])> = kept
                    .iter()
                    .flat_map(|(k, s)| (1..=s.len()).map(move |n| (*k, &s[..n])))
                    .collect();
                assert_eq!(c.bytes(), prefixes.len() * PER_POSITION);
            }
        }
    }

    #[test]
    fn hit_rate_counts_positions() {
        let mut c = PrefixCache::new(0);
        assert_eq!(c.take_stats().hit_rate(), 0.0);
        c.count(30, 10);
        c.count(0, 60);
        let s = c.take_stats();
        assert_eq!((s.reused, s.computed, s.peak_bytes), (30, 70, 0));
        assert!((s.hit_rate() - 0.3).abs() < 1e-12);
        assert_eq!(c.take_stats(), PrefixStats::default());
    }
}
