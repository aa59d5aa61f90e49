//! SentencePiece tokenization (`tokenizer.ggml.model` = `"llama"`), matching llama.cpp's
//! `llm_tokenizer_spm_session` and the `LLAMA_VOCAB_TYPE_SPM` branch of `llama_vocab::tokenize`.
//!
//! Each text fragment left by special-token splitting is handled on its own:
//! 1. a space is put in front when `add_space_prefix` is set and the fragment is the first one or
//!    follows a special token; then every U+0020 becomes `▁` (U+2581), llama.cpp's
//!    `llama_escape_whitespace` (no other normalisation);
//! 2. the text is cut into UTF-8 characters, and every adjacent pair whose concatenation is a
//!    vocabulary entry (of any token type) is a candidate;
//! 3. repeatedly, the candidate with the highest score is merged (ties: leftmost first), and the
//!    merged symbol's new pairs become candidates — a priority queue, as in llama.cpp, so the
//!    whole merge is O(n log n);
//! 4. every final symbol is its vocabulary entry, or — when it is a single character without an
//!    entry — one byte token per UTF-8 byte: `<0xAB>`, else the one-byte entry (llama.cpp's
//!    `byte_to_token`).
//!
//! llama.cpp's `rev_merge` re-segmentation never applies: a merged symbol is always a vocabulary
//! entry (pairs are only candidates when they are), so only single characters can miss, and a
//! single character is never a recorded pair.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::error::TokenizerError;
use super::vocab::Vocab;

/// The escaped form of a space.
pub(crate) const ESCAPED_SPACE: char = '\u{2581}';

const NONE: u32 = u32::MAX;

/// The score table and byte fallbacks of one SentencePiece vocabulary.
#[derive(Debug)]
pub(crate) struct Spm {
    /// `tokenizer.ggml.scores`, one per token (all 0 when the file has none, as in llama.cpp).
    scores: Vec<f32>,
    /// The token each byte falls back to, or `NONE`.
    byte_tokens: [u32; 256],
    /// Stands in for a byte without a byte token (llama.cpp throws there).
    unk: Option<u32>,
    add_space_prefix: bool,
}

/// One symbol of the text being merged: a byte span of the escaped text, in a linked list.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge of `left` and `right`, valid while their lengths still add up to `size`.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl Ord for Bigram {
    /// Highest score first, then the leftmost (llama.cpp's `llm_bigram_spm::comparator`).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Reusable buffers for [`Spm::encode_fragment`].
#[derive(Debug, Default)]
pub(crate) struct SpmScratch {
    text: String,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl Spm {
    /// `scores` may be empty (no `tokenizer.ggml.scores`); otherwise it needs an entry per token.
    pub(crate) fn new(
        scores: &[f32],
        vocab: &Vocab,
        unk: Option<u32>,
        add_space_prefix: bool,
    ) -> Result<Spm, TokenizerError> {
        let n_vocab = vocab.len();
        let scores = match scores.len() {
            0 => vec![0.0; n_vocab],
            n if n < n_vocab => return Err(TokenizerError::ScoreCount { got: n, n_vocab }),
            _ => scores[..n_vocab].to_vec(),
        };
        let mut byte_tokens = [NONE; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            let raw = [b as u8];
            *slot = vocab
                .id(&hex)
                .or_else(|| std::str::from_utf8(&raw).ok().and_then(|s| vocab.id(s)))
                .unwrap_or(NONE);
        }
        Ok(Spm { scores, byte_tokens, unk, add_space_prefix })
    }

    /// Appends the ids of one text fragment. `after_special`: the fragment is the first one or
    /// follows a special token (llama.cpp's `is_prev_special`), which is where the space prefix
    /// goes when the vocabulary asks for one.
    pub(crate) fn encode_fragment(
        &self,
        fragment: &str,
        after_special: bool,
        vocab: &Vocab,
        scratch: &mut SpmScratch,
        out: &mut Vec<u32>,
    ) {
        let mut text = std::mem::take(&mut scratch.text);
        text.clear();
        if self.add_space_prefix && after_special {
            text.push(ESCAPED_SPACE);
        }
        for c in fragment.chars() {
            text.push(if c == ' ' { ESCAPED_SPACE } else { c });
        }
        self.encode_escaped(&text, vocab, scratch, out);
        scratch.text = text;
    }

    /// The merge loop over already escaped text.
    pub(crate) fn encode_escaped(
        &self,
        text: &str,
        vocab: &Vocab,
        scratch: &mut SpmScratch,
        out: &mut Vec<u32>,
    ) {
        // Offsets are u32; a longer fragment is tokenized in pieces (never in practice: 4 GiB).
        if text.len() >= NONE as usize {
            let mut cut = text.len() / 2;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let (a, b) = text.split_at(cut);
            self.encode_escaped(a, vocab, scratch, out);
            self.encode_escaped(b, vocab, scratch, out);
            return;
        }
        let SpmScratch { symbols, queue, .. } = scratch;
        symbols.clear();
        queue.clear();
        let n = text.chars().count() as u32;
        for (i, (start, c)) in text.char_indices().enumerate() {
            let i = i as u32;
            symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
            });
        }
        for right in 1..n {
            self.try_add_bigram(text, symbols, right - 1, right, vocab, queue);
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (bigram.left as usize, bigram.right as usize);
            let (left_len, right_len) = (symbols[l].len, symbols[r].len);
            if left_len == 0 || right_len == 0 || left_len + right_len != bigram.size {
                continue; // one side was merged into something else since
            }
            symbols[l].len += right_len;
            symbols[r].len = 0;
            let after = symbols[r].next;
            symbols[l].next = after;
            if after != NONE {
                symbols[after as usize].prev = bigram.left;
            }
            let before = symbols[l].prev;
            self.try_add_bigram(text, symbols, before, bigram.left, vocab, queue);
            self.try_add_bigram(text, symbols, bigram.left, after, vocab, queue);
        }

        let mut i = if n == 0 { NONE } else { 0 };
        while let Some(sym) = symbols.get(i as usize) {
            let piece = text.get(sym.start as usize..(sym.start + sym.len) as usize).unwrap_or_default();
            match vocab.id(piece) {
                Some(id) => out.push(id),
                None => self.push_bytes(piece.as_bytes(), out),
            }
            i = sym.next;
        }
    }

    fn try_add_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: u32,
        right: u32,
        vocab: &Vocab,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (Some(l), Some(r)) = (symbols.get(left as usize), symbols.get(right as usize)) else { return };
        let size = l.len + r.len;
        let Some(pair) = text.get(l.start as usize..(l.start + size) as usize) else { return };
        let Some(id) = vocab.id(pair) else { return };
        let Some(&score) = self.scores.get(id as usize) else { return };
        queue.push(Bigram { score, left, right, size });
    }

    /// llama.cpp's byte fallback for a character that is not a vocabulary entry.
    fn push_bytes(&self, bytes: &[u8], out: &mut Vec<u32>) {
        for &b in bytes {
            match self.byte_tokens[usize::from(b)] {
                NONE => out.extend(self.unk),
                id => out.push(id),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny vocabulary: (text, score), ids in order.
    fn vocab(entries: &[(&str, f32)]) -> (Vocab, Vec<f32>) {
        let texts: Vec<String> = entries.iter().map(|(t, _)| (*t).to_owned()).collect();
        (Vocab::new(&texts).unwrap_or_else(|e| panic!("{e}")), entries.iter().map(|(_, s)| *s).collect())
    }

    fn encode(entries: &[(&str, f32)], text: &str, add_space_prefix: bool) -> Vec<u32> {
        let (map, scores) = vocab(entries);
        let spm = Spm::new(&scores, &map, None, add_space_prefix).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        spm.encode_fragment(text, true, &map, &mut SpmScratch::default(), &mut out);
        out
    }

    #[test]
    fn merges_the_best_scoring_pair_first() {
        // "abc": candidates "ab" (-2) and "bc" (-1); "bc" wins, then "abc" is not reachable from
        // "a"+"bc" unless it is an entry: it is, at -5.
        let v = [("a", -10.0), ("b", -10.0), ("c", -10.0), ("ab", -2.0), ("bc", -1.0), ("abc", -5.0)];
        assert_eq!(encode(&v, "abc", false), [5]);
        // Without "abc", the result is "a" + "bc".
        assert_eq!(encode(&v[..5], "abc", false), [0, 4]);
        // With "ab" better than "bc": "ab" + "c".
        let v2 = [("a", -10.0), ("b", -10.0), ("c", -10.0), ("ab", -1.0), ("bc", -2.0)];
        assert_eq!(encode(&v2, "abc", false), [3, 2]);
    }

    #[test]
    fn ties_go_to_the_leftmost_pair() {
        // "aaa": both "aa" pairs score the same; the left one merges first, leaving "aa" + "a".
        let v = [("a", -3.0), ("aa", -1.0)];
        assert_eq!(encode(&v, "aaa", false), [1, 0]);
        // "aaaa" → "aa" "aa" (the left pair, then the next free pair on the right).
        assert_eq!(encode(&v, "aaaa", false), [1, 1]);
    }

    #[test]
    fn merges_reach_long_tokens_through_intermediate_entries() {
        let mut v = vec![
            ("▁", -9.0), ("h", -9.0), ("e", -9.0), ("l", -9.0), ("o", -9.0),
            ("▁h", -1.0), ("▁he", -1.5), ("▁hel", -2.0), ("▁hell", -2.5), ("▁hello", -3.0), ("ll", -0.5),
        ];
        // "ll" (−0.5) merges first, then "▁h", "▁he"; "▁he" + "ll" is "▁hell", then "▁hello".
        assert_eq!(encode(&v, " hello", false), [9]);
        // The space prefix can come from add_space_prefix too.
        assert_eq!(encode(&v, "hello", true), [9]);
        // Without it there is no "▁": "he", "el", "llo" are no entries, only "ll" merges.
        assert_eq!(encode(&v, "hello", false), [1, 2, 10, 4]);
        // Without "▁hell", "▁hel" can never form ("l" went into "ll" first): ▁he + ll + o.
        v[8].0 = "▁hellx";
        assert_eq!(encode(&v, " hello", false), [6, 10, 4]);
    }

    #[test]
    fn characters_outside_the_vocabulary_fall_back_to_byte_tokens() {
        let mut v: Vec<(String, f32)> = (0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0)).collect();
        v.push(("a".into(), -1.0));
        let entries: Vec<(&str, f32)> = v.iter().map(|(t, s)| (t.as_str(), *s)).collect();
        // "é" is C3 A9; "€" is E2 82 AC; "a" is an entry.
        assert_eq!(encode(&entries, "aé€", false), [256, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]);
        // A space with no "▁" entry falls back to the bytes of "▁" (E2 96 81).
        assert_eq!(encode(&entries, " a", false), [0xE2, 0x96, 0x81, 256]);
    }

    #[test]
    fn missing_byte_tokens_fall_back_to_one_byte_entries_then_unk() {
        let (map, scores) = vocab(&[("<unk>", 0.0), ("x", -1.0)]);
        let spm = Spm::new(&scores, &map, Some(0), false).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        spm.encode_fragment("xyé", true, &map, &mut SpmScratch::default(), &mut out);
        assert_eq!(out, [1, 0, 0, 0]);
    }

    #[test]
    fn scores_must_cover_the_vocabulary() {
        let (map, _) = vocab(&[("a", 0.0), ("b", 0.0)]);
        assert!(matches!(Spm::new(&[1.0], &map, None, false), Err(TokenizerError::ScoreCount { got: 1, n_vocab: 2 })));
        assert!(Spm::new(&[], &map, None, false).is_ok());
    }

    #[test]
    fn long_inputs_merge_in_n_log_n() {
        let v = [("a", -3.0), ("aa", -1.0), ("aaaa", -0.5)];
        let (map, scores) = vocab(&v);
        let spm = Spm::new(&scores, &map, None, false).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        spm.encode_fragment(&"a".repeat(100_001), true, &map, &mut SpmScratch::default(), &mut out);
        // Pairs "aa" first (left to right), then pairs of those into "aaaa"; one "a" left over.
        assert_eq!(out.len(), 25_001);
        assert!(out[..25_000].iter().all(|&id| id == 2));
        assert_eq!(out[25_000], 0);
    }
}
