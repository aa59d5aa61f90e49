//! Byte-level BPE: merge ranks and the merge loop that turns one pre-token into token ids.
//!
//! Symbols are identified by "string ids": a vocabulary entry's string id is its token id, and
//! strings that only occur in merges (not in the vocabulary) get ids from `n_vocab` upwards.
//! Merging then works on integers: the rank table maps a pair of string ids to the merge's rank
//! and the string id of the merged text. The result is the one llama.cpp's
//! `llm_tokenizer_bpe_session` gives: repeatedly merge the adjacent pair with the lowest rank,
//! the leftmost one among equals, until no adjacent pair has a rank.

use std::collections::{BinaryHeap, HashMap};
use std::cmp::Reverse;
use std::hash::{BuildHasherDefault, Hasher};

use super::byte_level::BYTE_TO_CHAR;
use super::error::TokenizerError;
use super::vocab::Vocab;

/// "No string id": a byte whose character is neither a token nor part of any merge.
const NO_ID: u32 = u32::MAX;

/// Words with at most this many bytes are merged by rescanning a small array; longer ones use a
/// priority queue so that pathological inputs (a megabyte without a space) stay O(n log n).
const SCAN_LIMIT: usize = 48;

/// A cheap hasher for the packed `(left, right)` id pairs; the keys come from the vocabulary,
/// not from the text being tokenized, so flooding is not a concern.
#[derive(Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, key: u64) {
        // Folded multiply: mixes high and low input bits into the low bits the table indexes by.
        let product = u128::from(key ^ self.0) * 0x9E37_79B9_7F4A_7C15_u128;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

type PairMap = HashMap<u64, Merge, BuildHasherDefault<PairHasher>>;

/// The same folded multiply over byte strings (8 bytes at a time), for the word cache.
#[derive(Default)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        let mut tail = [0u8; 8];
        let rest = chunks.remainder();
        tail[..rest.len()].copy_from_slice(rest);
        self.write_u64(u64::from_le_bytes(tail) ^ ((rest.len() as u64) << 59));
    }

    fn write_u8(&mut self, byte: u8) {
        self.write_u64(u64::from(byte));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, key: u64) {
        let product = u128::from(key ^ self.0) * 0x9E37_79B9_7F4A_7C15_u128;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

/// Most cached words per `encode` call; past this, new words are merged without being cached.
const WORD_CACHE_LIMIT: usize = 1 << 16;

/// Where the ids of each word already encoded in one `encode` call sit in its output, so that
/// repeated words (most of them, in prose) are copied instead of merged again. It lives for
/// one call only: the tokenizer itself holds no mutable state.
#[derive(Default)]
pub(crate) struct WordCache<'t> {
    spans: HashMap<&'t [u8], (u32, u32), BuildHasherDefault<WordHasher>>,
}

#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    merged: u32,
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// The merge table of one vocabulary.
#[derive(Debug)]
pub(crate) struct Bpe {
    merges: PairMap,
    /// String id of the one-character string that stands for each byte.
    byte_ids: [u32; 256],
    /// Token id of each one-byte (ASCII) vocabulary entry, for llama.cpp's fallback.
    ascii_tokens: [u32; 128],
    n_vocab: u32,
}

/// One symbol of the word being merged: a span of its bytes and the string id of that span.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    id: u32,
}

/// Reusable buffers for [`Bpe::encode_word`].
#[derive(Debug, Default)]
pub(crate) struct BpeScratch {
    symbols: Vec<Symbol>,
    /// `ranks[i]` is the merge of `symbols[i]` and `symbols[i + 1]`, if any (scan path).
    ranks: Vec<Option<Merge>>,
    /// Linked list over `symbols` (queue path).
    prev: Vec<u32>,
    next: Vec<u32>,
    queue: BinaryHeap<Reverse<u64>>,
}

/// A candidate merge in the queue path, packed as `rank << 32 | left` so that the smallest
/// entry is the lowest rank, leftmost among equals. The right symbol is not stored: an entry is
/// current exactly when `left` is alive and its pair with its right neighbour still has this
/// rank (a symbol only grows, so once its pair changed it never has the same texts again).
fn queue_entry(rank: u32, left: u32) -> Reverse<u64> {
    Reverse((u64::from(rank) << 32) | u64::from(left))
}

const NONE_IDX: u32 = u32::MAX;

impl Bpe {
    /// Builds the merge table over the vocabulary's ids.
    pub(crate) fn new(merges: &[String], vocab: &Vocab) -> Result<Bpe, TokenizerError> {
        let n_vocab = u32::try_from(vocab.len()).map_err(|_| TokenizerError::VocabularyTooLarge { n_vocab: vocab.len() })?;
        let mut extra: HashMap<String, u32> = HashMap::new();
        let intern = |text: &str, extra: &mut HashMap<String, u32>| -> u32 {
            if let Some(id) = vocab.id(text) {
                return id;
            }
            let next = n_vocab.saturating_add(u32::try_from(extra.len()).unwrap_or(u32::MAX));
            *extra.entry(text.to_owned()).or_insert(next)
        };

        let mut table = PairMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (line, text) in merges.iter().enumerate() {
            let (left, right) = split_merge(line, text)?;
            let rank = u32::try_from(line).map_err(|_| TokenizerError::BadMerge {
                line,
                text: text.clone(),
                reason: "too many merges",
            })?;
            let left_id = intern(left, &mut extra);
            let right_id = intern(right, &mut extra);
            let merged = intern(&format!("{left}{right}"), &mut extra);
            // Like llama.cpp, the first line for a pair wins.
            table.entry(pair_key(left_id, right_id)).or_insert(Merge { rank, merged });
        }

        let mut byte_ids = [NO_ID; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let mut buf = [0u8; 4];
            let text: &str = BYTE_TO_CHAR[b].encode_utf8(&mut buf);
            *slot = vocab.id(text).or_else(|| extra.get(text).copied()).unwrap_or(NO_ID);
        }
        let mut ascii_tokens = [NO_ID; 128];
        for (b, slot) in ascii_tokens.iter_mut().enumerate() {
            let mut buf = [0u8; 4];
            let text: &str = char::from(b as u8).encode_utf8(&mut buf);
            *slot = vocab.id(text).unwrap_or(NO_ID);
        }
        Ok(Bpe { merges: table, byte_ids, ascii_tokens, n_vocab })
    }

    fn lookup(&self, left: u32, right: u32) -> Option<Merge> {
        if left == NO_ID || right == NO_ID {
            return None;
        }
        self.merges.get(&pair_key(left, right)).copied()
    }

    /// [`Bpe::encode_word`], reusing the ids of an earlier occurrence of the same word.
    pub(crate) fn encode_word_cached<'t>(
        &self,
        word: &'t [u8],
        scratch: &mut BpeScratch,
        cache: &mut WordCache<'t>,
        out: &mut Vec<u32>,
    ) {
        if let Some(&(start, len)) = cache.spans.get(word) {
            let (start, len) = (start as usize, len as usize);
            out.extend_from_within(start..start + len);
            return;
        }
        let start = out.len();
        self.encode_word(word, scratch, out);
        if cache.spans.len() < WORD_CACHE_LIMIT
            && let (Ok(s), Ok(n)) = (u32::try_from(start), u32::try_from(out.len() - start))
        {
            cache.spans.insert(word, (s, n));
        }
    }

    /// Appends the token ids of one pre-token (raw bytes) to `out`.
    pub(crate) fn encode_word(&self, word: &[u8], scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        let symbols = &mut scratch.symbols;
        symbols.clear();
        symbols.extend(word.iter().enumerate().map(|(i, &b)| Symbol {
            start: i as u32,
            len: 1,
            id: self.byte_ids[usize::from(b)],
        }));
        if word.len() <= SCAN_LIMIT {
            self.merge_by_scan(scratch);
            for sym in &scratch.symbols {
                self.emit(word, *sym, out);
            }
        } else {
            self.merge_by_queue(scratch);
            let mut i = 0u32;
            while let Some(sym) = scratch.symbols.get(i as usize) {
                self.emit(word, *sym, out);
                i = scratch.next[i as usize];
            }
        }
    }

    /// Few symbols: keep them in order in a vector and rescan the cached pair ranks.
    fn merge_by_scan(&self, scratch: &mut BpeScratch) {
        let BpeScratch { symbols, ranks, .. } = scratch;
        ranks.clear();
        ranks.extend(symbols.windows(2).map(|w| self.lookup(w[0].id, w[1].id)));
        loop {
            let mut best: Option<(usize, Merge)> = None;
            for (i, merge) in ranks.iter().enumerate() {
                if let Some(m) = merge
                    && best.is_none_or(|(_, b)| m.rank < b.rank)
                {
                    best = Some((i, *m));
                }
            }
            let Some((i, merge)) = best else { break };
            let right_len = symbols[i + 1].len;
            symbols[i].len += right_len;
            symbols[i].id = merge.merged;
            symbols.remove(i + 1);
            ranks.remove(i);
            if i > 0 {
                ranks[i - 1] = self.lookup(symbols[i - 1].id, symbols[i].id);
            }
            if i + 1 < symbols.len() {
                ranks[i] = self.lookup(symbols[i].id, symbols[i + 1].id);
            }
        }
    }

    /// Many symbols: a linked list and a priority queue of candidate pairs; stale entries are
    /// recognised by looking the pair up again.
    fn merge_by_queue(&self, scratch: &mut BpeScratch) {
        let BpeScratch { symbols, prev, next, queue, .. } = scratch;
        let n = symbols.len() as u32;
        prev.clear();
        next.clear();
        prev.extend((0..n).map(|i| if i == 0 { NONE_IDX } else { i - 1 }));
        next.extend((0..n).map(|i| if i + 1 == n { NONE_IDX } else { i + 1 }));
        queue.clear();

        let pair_merge = |symbols: &[Symbol], next: &[u32], left: u32| -> Option<(u32, Merge)> {
            let right = *next.get(left as usize)?;
            let (l, r) = (symbols.get(left as usize)?, symbols.get(right as usize)?);
            self.lookup(l.id, r.id).map(|m| (right, m))
        };
        queue.extend((0..n).filter_map(|left| pair_merge(symbols, next, left).map(|(_, m)| queue_entry(m.rank, left))));
        while let Some(Reverse(entry)) = queue.pop() {
            let (rank, left) = ((entry >> 32) as u32, entry as u32);
            if symbols[left as usize].len == 0 {
                continue;
            }
            let Some((right, merge)) = pair_merge(symbols, next, left).filter(|(_, m)| m.rank == rank) else {
                continue;
            };
            let (l, r) = (left as usize, right as usize);
            symbols[l].len += symbols[r].len;
            symbols[l].id = merge.merged;
            symbols[r].len = 0;
            let after = next[r];
            next[l] = after;
            if after != NONE_IDX {
                prev[after as usize] = left;
            }
            let before = prev[l];
            if before != NONE_IDX
                && let Some((_, m)) = pair_merge(symbols, next, before)
            {
                queue.push(queue_entry(m.rank, before));
            }
            if let Some((_, m)) = pair_merge(symbols, next, left) {
                queue.push(queue_entry(m.rank, left));
            }
        }
    }

    /// Emits the token for one final symbol; a symbol whose text is not a vocabulary entry falls
    /// back, like llama.cpp, to the one-byte entries for each byte of its byte-level text.
    fn emit(&self, word: &[u8], sym: Symbol, out: &mut Vec<u32>) {
        if sym.len == 0 {
            return;
        }
        if sym.id < self.n_vocab {
            out.push(sym.id);
            return;
        }
        let bytes = word.get(sym.start as usize..(sym.start + sym.len) as usize).unwrap_or_default();
        for &b in bytes {
            // A byte's character is one UTF-8 byte only when it is printable ASCII; bytes of
            // longer characters are never one-byte vocabulary entries.
            let c = BYTE_TO_CHAR[usize::from(b)];
            if let Some(&id) = u8::try_from(c).ok().and_then(|a| self.ascii_tokens.get(usize::from(a)))
                && id != NO_ID
            {
                out.push(id);
            }
        }
    }
}

/// Splits a merge line `"left right"` (llama.cpp splits at the first space after position 0).
fn split_merge(line: usize, text: &str) -> Result<(&str, &str), TokenizerError> {
    let bad = |reason| TokenizerError::BadMerge { line, text: text.to_owned(), reason };
    let sep = text
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == ' ')
        .map(|(i, _)| i)
        .ok_or_else(|| bad("no space separating the two parts"))?;
    let (left, right) = (&text[..sep], &text[sep + 1..]);
    if right.is_empty() {
        return Err(bad("empty right part"));
    }
    if right.contains(' ') {
        return Err(bad("more than two parts"));
    }
    Ok((left, right))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(words: &[&str]) -> Vocab {
        Vocab::new(&words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn rejects_malformed_merges_naming_the_line() {
        let v = vocab(&["a", "b", "ab"]);
        for (text, reason) in [("ab", "no space"), ("a ", "empty right"), ("a b c", "more than two")] {
            let merges = vec!["a b".to_owned(), text.to_owned()];
            match Bpe::new(&merges, &v) {
                Err(TokenizerError::BadMerge { line: 1, reason: r, .. }) => assert!(r.starts_with(reason), "{r}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn scan_and_queue_paths_agree() {
        let v = vocab(&["a", "b", "ab", "aa", "aaa", "ba", "aab", "bab"]);
        let merges: Vec<String> = ["a a", "a b", "aa a", "b a", "aa b", "b ab"].iter().map(|s| (*s).to_owned()).collect();
        let bpe = Bpe::new(&merges, &v).unwrap_or_else(|e| panic!("{e}"));
        let mut scratch = BpeScratch::default();
        let mut seed = 12345u64;
        for len in 1..200 {
            let word: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    if seed >> 63 == 0 { b'a' } else { b'b' }
                })
                .collect();
            let (mut by_scan, mut by_queue) = (Vec::new(), Vec::new());
            scratch.symbols = word.iter().enumerate().map(|(i, &b)| Symbol { start: i as u32, len: 1, id: bpe.byte_ids[usize::from(b)] }).collect();
            bpe.merge_by_scan(&mut scratch);
            for s in &scratch.symbols {
                bpe.emit(&word, *s, &mut by_scan);
            }
            scratch.symbols = word.iter().enumerate().map(|(i, &b)| Symbol { start: i as u32, len: 1, id: bpe.byte_ids[usize::from(b)] }).collect();
            bpe.merge_by_queue(&mut scratch);
            let mut i = 0u32;
            while let Some(s) = scratch.symbols.get(i as usize) {
                bpe.emit(&word, *s, &mut by_queue);
                i = scratch.next[i as usize];
            }
            assert_eq!(by_scan, by_queue, "{}", String::from_utf8_lossy(&word));
        }
    }

    #[test]
    fn merges_of_non_vocabulary_strings_fall_back_to_bytes() {
        // "xy" is produced by a merge but is not a token: llama.cpp emits "x" and "y".
        let v = vocab(&["x", "y", "z", "xyz"]);
        let merges: Vec<String> = ["x y"].iter().map(|s| (*s).to_owned()).collect();
        let bpe = Bpe::new(&merges, &v).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        bpe.encode_word(b"xyz", &mut BpeScratch::default(), &mut out);
        assert_eq!(out, [0, 1, 2]);
    }
}
