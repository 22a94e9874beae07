//! Kept prefix states: the state of a sequence after some ids, looked up by those ids.
//!
//! A session keeps one ([`KeptPrefix`], the latest prefix: an agent's prefix only grows, so each step's prefix
//! extends the last); the server keeps many, least recently used first out, bounded in bytes ([`PrefixLru`]). A
//! state is whole (attention KV, conv and recurrent state), so it is restored, never trimmed: a kept state is only
//! of use to a request whose ids begin with all of its ids.

use std::sync::Arc;

/// Where a decision finds and leaves prefix states.
pub trait PrefixStore<S> {
    /// The longest kept state whose ids begin `ids`: its length and the state (which the caller copies before it
    /// continues it). Counts a hit or a miss.
    fn longest(&mut self, ids: &[u32]) -> Option<(usize, &S)>;
    /// Keeps `state`, the state after `ids`, which holds `bytes`.
    fn insert(&mut self, ids: &[u32], state: S, bytes: usize);
    /// Bytes of every state kept.
    fn bytes(&self) -> usize;
    /// Bytes of the state kept for exactly `ids`, if any.
    fn bytes_of(&self, ids: &[u32]) -> Option<usize>;
}

/// One kept state: the latest prefix a decision stored.
#[derive(Debug)]
pub struct KeptPrefix<S> {
    kept: Option<Entry<S>>,
}

#[derive(Debug)]
struct Entry<S> {
    ids: Vec<u32>,
    state: S,
    bytes: usize,
    /// Logical time of the last use, for the LRU.
    used: u64,
}

impl<S> Default for KeptPrefix<S> {
    fn default() -> Self {
        KeptPrefix { kept: None }
    }
}

impl<S> KeptPrefix<S> {
    /// Drops the kept state (a generation does: the state is worth its memory only while decisions follow one
    /// another).
    pub fn clear(&mut self) {
        self.kept = None;
    }

    /// The ids of the kept state, if any.
    pub fn ids(&self) -> Option<&[u32]> {
        self.kept.as_ref().map(|e| e.ids.as_slice())
    }
}

impl<S> PrefixStore<S> for KeptPrefix<S> {
    fn longest(&mut self, ids: &[u32]) -> Option<(usize, &S)> {
        let e = self.kept.as_ref()?;
        ids.starts_with(&e.ids).then_some((e.ids.len(), &e.state))
    }

    fn insert(&mut self, ids: &[u32], state: S, bytes: usize) {
        self.kept = Some(Entry {
            ids: ids.to_vec(),
            state,
            bytes,
            used: 0,
        });
    }

    fn bytes(&self) -> usize {
        self.kept.as_ref().map_or(0, |e| e.bytes)
    }

    fn bytes_of(&self, ids: &[u32]) -> Option<usize> {
        self.kept.as_ref().filter(|e| e.ids == ids).map(|e| e.bytes)
    }
}

/// What a [`PrefixLru`] has done and holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups that found a kept state.
    pub hits: u64,
    pub misses: u64,
    /// States dropped to make room.
    pub evictions: u64,
    pub entries: usize,
    pub bytes: usize,
    pub cap_bytes: usize,
}

/// Prefix states keyed by their ids, at most `cap_bytes` of them (the least recently used go first; a state larger
/// than the cap is not kept). Hits, misses and evictions are counted for `/metrics`. The states are shared
/// ([`PrefixLru::shared`]): a caller can fork one after letting the LRU go.
#[derive(Debug)]
pub struct PrefixLru<S> {
    cap_bytes: usize,
    entries: Vec<Entry<Arc<S>>>,
    bytes: usize,
    clock: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

impl<S> PrefixLru<S> {
    pub fn new(cap_bytes: usize) -> PrefixLru<S> {
        PrefixLru {
            cap_bytes,
            entries: Vec::new(),
            bytes: 0,
            clock: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    pub fn cap_bytes(&self) -> usize {
        self.cap_bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The counters and sizes `/metrics` shows.
    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            entries: self.entries.len(),
            bytes: self.bytes,
            cap_bytes: self.cap_bytes,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The longest kept state whose ids begin `ids`, marked used; counts a hit or a miss.
    fn find(&mut self, ids: &[u32]) -> Option<&Entry<Arc<S>>> {
        let now = self.tick();
        let found = self
            .entries
            .iter_mut()
            .filter(|e| ids.starts_with(&e.ids))
            .max_by_key(|e| e.ids.len());
        match found {
            Some(e) => {
                e.used = now;
                self.hits += 1;
                Some(&*e)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// [`PrefixStore::longest`] with the state shared, not borrowed: the LRU can be let go before the state is
    /// copied. Counts a hit or a miss.
    pub fn shared(&mut self, ids: &[u32]) -> Option<(usize, Arc<S>)> {
        self.find(ids).map(|e| (e.ids.len(), e.state.clone()))
    }
}

impl<S> PrefixStore<S> for PrefixLru<S> {
    fn longest(&mut self, ids: &[u32]) -> Option<(usize, &S)> {
        self.find(ids).map(|e| (e.ids.len(), &*e.state))
    }

    fn insert(&mut self, ids: &[u32], state: S, bytes: usize) {
        let now = self.tick();
        if let Some(i) = self.entries.iter().position(|e| e.ids == ids) {
            let old = self.entries.swap_remove(i);
            self.bytes -= old.bytes;
        }
        if bytes > self.cap_bytes {
            return;
        }
        while self.bytes + bytes > self.cap_bytes {
            let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used) else {
                break;
            };
            let old = self.entries.swap_remove(i);
            self.bytes -= old.bytes;
            self.evictions += 1;
        }
        self.bytes += bytes;
        self.entries.push(Entry {
            ids: ids.to_vec(),
            state: Arc::new(state),
            bytes,
            used: now,
        });
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn bytes_of(&self, ids: &[u32]) -> Option<usize> {
        self.entries.iter().find(|e| e.ids == ids).map(|e| e.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_prefix_is_the_latest_and_serves_what_extends_it() {
        let mut k = KeptPrefix::<u32>::default();
        assert!(k.longest(&[1, 2]).is_none());
        k.insert(&[1, 2], 12, 10);
        assert_eq!(k.longest(&[1, 2, 3]).map(|(n, s)| (n, *s)), Some((2, 12)));
        assert_eq!(k.longest(&[1, 2]).map(|(n, _)| n), Some(2));
        assert!(
            k.longest(&[1]).is_none(),
            "a shorter prefix cannot use a longer state"
        );
        assert!(k.longest(&[1, 3, 2]).is_none());
        k.insert(&[5], 5, 4);
        assert!(
            k.longest(&[1, 2, 3]).is_none(),
            "one state: the latest replaces it"
        );
        assert_eq!(
            (k.bytes(), k.bytes_of(&[5]), k.bytes_of(&[1, 2])),
            (4, Some(4), None)
        );
        k.clear();
        assert_eq!(k.bytes(), 0);
    }

    #[test]
    fn the_lru_keeps_the_longest_match_and_evicts_the_least_recently_used() {
        let mut l = PrefixLru::<u32>::new(100);
        l.insert(&[1], 1, 40);
        l.insert(&[1, 2], 12, 40);
        assert_eq!(l.longest(&[1, 2, 3]).map(|(n, s)| (n, *s)), Some((2, 12)));
        assert_eq!(l.longest(&[1, 5]).map(|(n, s)| (n, *s)), Some((1, 1)));
        assert!(l.longest(&[7]).is_none());
        assert_eq!((l.hits, l.misses), (2, 1));
        // [1] was used last; [1, 2] goes first.
        l.insert(&[9], 9, 40);
        assert_eq!((l.len(), l.bytes(), l.evictions), (2, 80, 1));
        assert!(l.bytes_of(&[1, 2]).is_none() && l.bytes_of(&[1]).is_some());
        // Too large for the cap: not kept, nothing evicted for it.
        l.insert(&[4], 4, 101);
        assert_eq!((l.len(), l.bytes()), (2, 80));
        // The same ids again replace their entry.
        l.insert(&[9], 99, 10);
        assert_eq!((l.len(), l.bytes()), (2, 50));
        assert_eq!(l.longest(&[9]).map(|(_, s)| *s), Some(99));
        // Shared: the state outlives its eviction.
        let (n, kept) = l.shared(&[9, 1]).unwrap();
        l.insert(&[8], 8, 100);
        assert_eq!((n, *kept, l.len(), l.hits), (1, 99, 1, 4));
    }
}
