//! The generation prefix cache: prompts' keys and values kept by token prefix, so that a
//! prefix an agent has already processed (turn 1's question and instructions, which every
//! agent of a frozen turn 1 sees; at turn t, the agent's own turn t-1 conversation) is not
//! computed again. In the manner of SGLang's RadixAttention: a lookup finds the longest
//! token prefix the prompt shares with any sequence kept for the same weights, and the
//! prompt's forward continues from that sequence's keys and values for those positions
//! (causal attention: a position's keys and values depend only on the tokens up to it).
//!
//! What is kept is the tree's leaves, each a whole sequence (prompt, or prompt and
//! response) with its own copy of its keys and values: a sequence that extends a kept one
//! replaces it, and leaves that share a prefix hold it twice (the computation is shared, the
//! memory is not). Keys and values are stored at positions counted from the sequence's
//! first token (no padding); a batch places them after its row's padding by rotating the
//! keys (RoPE rotations compose). Bounded in bytes; the least recently used leaf goes first.

use super::agent::Agent;
use anyhow::Result;
use candle_core::{DType, Tensor};
use std::sync::Arc;

/// How much of the prompts a cache served: positions taken from kept sequences (`reused`)
/// and positions computed (`computed`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    pub reused: u64,
    pub computed: u64,
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
    }
}

/// Per layer: keys and values, each (1, kv heads, positions, head dim).
pub(crate) type LayerKvs = Vec<(Tensor, Tensor)>;

struct Leaf {
    /// Which weights computed it ([`speaker_key`]).
    key: u64,
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
    leaves: Vec<Leaf>,
    bytes: usize,
    clock: u64,
    stats: PrefixStats,
}

impl PrefixCache {
    /// A cache holding at most `budget_bytes` of keys and values.
    pub fn new(budget_bytes: usize) -> PrefixCache {
        PrefixCache {
            budget: budget_bytes,
            leaves: Vec::new(),
            bytes: 0,
            clock: 0,
            stats: PrefixStats::default(),
        }
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.leaves.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    /// What the cache served since it was made or last asked by `take_stats`.
    pub fn take_stats(&mut self) -> PrefixStats {
        std::mem::take(&mut self.stats)
    }

    pub(crate) fn count(&mut self, reused: usize, computed: usize) {
        self.stats.reused += reused as u64;
        self.stats.computed += computed as u64;
    }

    /// Forgets every sequence (what it served is still counted).
    pub fn clear(&mut self) {
        self.leaves.clear();
        self.bytes = 0;
    }

    /// The longest prefix of `tokens` held for `key`, at most all but the last token (the
    /// last one's forward gives the logits to sample from): its length and its keys and
    /// values, or `None` when nothing is shared.
    pub(crate) fn lookup(&mut self, key: u64, tokens: &[u32]) -> Option<(usize, LayerKvs)> {
        let most = tokens.len().saturating_sub(1);
        let (best, len) = self
            .leaves
            .iter()
            .enumerate()
            .filter(|(_, l)| l.key == key)
            .map(|(i, l)| (i, common_prefix(&l.tokens, tokens).min(most)))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))?;
        if len == 0 {
            return None;
        }
        self.clock += 1;
        let leaf = &mut self.leaves[best];
        leaf.used = self.clock;
        let kvs = leaf
            .kvs
            .iter()
            .map(|(k, v)| Ok((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?)))
            .collect::<Result<LayerKvs>>()
            .ok()?;
        Some((len, kvs))
    }

    /// Keeps `tokens`' keys and values `kvs` (one position per token) for `key`. A kept
    /// sequence of `key` that `tokens` extends is dropped; when a kept one already extends
    /// `tokens`, nothing is added. Least recently used sequences make room; one larger than
    /// the whole budget is not kept.
    pub(crate) fn insert(&mut self, key: u64, tokens: Vec<u32>, kvs: LayerKvs) -> Result<()> {
        if let Some((k, _)) = kvs.first() {
            anyhow::ensure!(
                k.dim(2)? == tokens.len(),
                "prefix cache: {} positions for {} tokens",
                k.dim(2)?,
                tokens.len()
            );
        }
        self.clock += 1;
        let clock = self.clock;
        if let Some(l) = self
            .leaves
            .iter_mut()
            .find(|l| l.key == key && l.tokens.starts_with(&tokens))
        {
            l.used = clock;
            return Ok(());
        }
        let bytes: usize = kvs
            .iter()
            .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
            .sum();
        if bytes > self.budget {
            return Ok(());
        }
        self.leaves
            .retain(|l| !(l.key == key && tokens.starts_with(&l.tokens)));
        self.bytes = self.leaves.iter().map(|l| l.bytes).sum();
        while self.bytes + bytes > self.budget {
            let (oldest, _) = self
                .leaves
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| l.used)
                .expect("bytes held means a leaf is held");
            self.bytes -= self.leaves.swap_remove(oldest).bytes;
        }
        // Stored contiguous and apart from the batch they came from, which then can go.
        let kvs = kvs
            .into_iter()
            .map(|(k, v)| Ok((k.force_contiguous()?, v.force_contiguous()?)))
            .collect::<Result<LayerKvs>>()?;
        self.bytes += bytes;
        self.leaves.push(Leaf {
            key,
            tokens,
            kvs,
            bytes,
            used: clock,
        });
        Ok(())
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
    fn an_extension_replaces_its_prefix_and_a_prefix_adds_nothing() {
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

    #[test]
    fn hit_rate_counts_positions() {
        let mut c = PrefixCache::new(0);
        assert_eq!(c.take_stats().hit_rate(), 0.0);
        c.count(30, 10);
        c.count(0, 60);
        let s = c.take_stats();
        assert_eq!((s.reused, s.computed), (30, 70));
        assert!((s.hit_rate() - 0.3).abs() < 1e-12);
        assert_eq!(c.take_stats(), PrefixStats::default());
    }
}
