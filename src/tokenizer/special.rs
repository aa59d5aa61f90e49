//! Special tokens: token attributes, the special ids (with llama.cpp's auto-detection by text),
//! the end-of-generation set, and the splitting of text around special-token text. Matches
//! llama.cpp's `llama_vocab::impl::load` (defaults per vocabulary type, the text-based detection
//! of EOT/EOM/FIM/EOG tokens) and `tokenizer_st_partition`, for both vocabulary types.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasherDefault;
use std::ops::Range;

use memchr::memmem::Finder;

use super::bpe::PairHasher;
use super::error::TokenizerError;
use super::vocab::Vocab;
use super::{TokenizerData, VocabType};

/// Token attribute bits, as llama.cpp's `llama_token_attr`.
pub(crate) mod attr {
    pub(crate) const UNDEFINED: u32 = 0;
    pub(crate) const UNKNOWN: u32 = 1 << 0;
    pub(crate) const UNUSED: u32 = 1 << 1;
    pub(crate) const NORMAL: u32 = 1 << 2;
    pub(crate) const CONTROL: u32 = 1 << 3;
    pub(crate) const USER_DEFINED: u32 = 1 << 4;
    pub(crate) const BYTE: u32 = 1 << 5;
}

/// Attributes from `tokenizer.ggml.token_type` (all normal when the array is absent).
pub(crate) fn attrs_from_types(types: &[i32], n_vocab: usize) -> Result<Vec<u32>, TokenizerError> {
    if types.is_empty() {
        return Ok(vec![attr::NORMAL; n_vocab]);
    }
    if types.len() < n_vocab {
        return Err(TokenizerError::TokenTypeCount { got: types.len(), n_vocab });
    }
    Ok(types[..n_vocab]
        .iter()
        .map(|&t| match t {
            1 => attr::NORMAL,
            2 => attr::UNKNOWN,
            3 => attr::CONTROL,
            4 => attr::USER_DEFINED,
            5 => attr::UNUSED,
            6 => attr::BYTE,
            _ => attr::UNDEFINED,
        })
        .collect())
}

/// The special token ids after llama.cpp's defaults and auto-detection.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialIds {
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) sep: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) mask: Option<u32>,
    pub(crate) fim_pre: Option<u32>,
    pub(crate) fim_suf: Option<u32>,
    pub(crate) fim_mid: Option<u32>,
    pub(crate) fim_pad: Option<u32>,
    pub(crate) fim_rep: Option<u32>,
    pub(crate) fim_sep: Option<u32>,
    /// End-of-generation tokens.
    pub(crate) eog: BTreeSet<u32>,
}

/// Texts that llama.cpp takes for a special role when the metadata does not name one.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts that always end generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
];
/// gpt-oss tokens that llama.cpp always renders (it makes them user-defined).
const ALWAYS_RENDERED_TEXTS: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Resolves the special ids the way llama.cpp's vocabulary loader does, adjusting `attrs` where
/// it does (tokens it recognises as control tokens by their text get the control attribute).
pub(crate) fn resolve_special_ids(
    data: &TokenizerData,
    vocab_type: VocabType,
    vocab: &Vocab,
    attrs: &mut [u32],
) -> Result<SpecialIds, TokenizerError> {
    let n_vocab = attrs.len();
    let check = |role: &'static str, id: Option<u32>| -> Result<Option<u32>, TokenizerError> {
        match id {
            Some(id) if id as usize >= n_vocab => Err(TokenizerError::SpecialIdOutOfRange { role, id, n_vocab }),
            other => Ok(other),
        }
    };
    // llama.cpp's defaults, used when in range: bos = eos = 11 for "gpt2" vocabularies;
    // bos = 1, eos = 2, unk = 0 for "llama" (SentencePiece) ones.
    let default = |id: u32| ((id as usize) < n_vocab).then_some(id);
    let (bos_default, eos_default, unk_default) = match vocab_type {
        VocabType::Bpe => (default(11), default(11), None),
        VocabType::Spm => (default(1), default(2), default(0)),
    };
    let mut ids = SpecialIds {
        bos: check("bos", data.bos_id)?.or(bos_default),
        eos: check("eos", data.eos_id)?.or(eos_default),
        eot: check("eot", data.eot_id)?,
        eom: check("eom", data.eom_id)?,
        unk: check("unk", data.unk_id)?.or(unk_default),
        sep: check("sep", data.sep_id)?,
        pad: check("pad", data.pad_id)?,
        mask: check("mask", data.mask_id)?,
        fim_pre: check("fim_pre", data.fim_pre_id)?,
        fim_suf: check("fim_suf", data.fim_suf_id)?,
        fim_mid: check("fim_mid", data.fim_mid_id)?,
        fim_pad: check("fim_pad", data.fim_pad_id)?,
        fim_rep: check("fim_rep", data.fim_rep_id)?,
        fim_sep: check("fim_sep", data.fim_sep_id)?,
        eog: BTreeSet::new(),
    };

    // Auto-detection by text for roles the metadata left open. llama.cpp takes whichever
    // candidate its hash map yields first; we take the first candidate in list order.
    let mut detect = |slot: &mut Option<u32>, texts: &[&str]| {
        if slot.is_some() {
            return;
        }
        if let Some(id) = texts.iter().find_map(|t| vocab.id(t)) {
            *slot = Some(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    };
    detect(&mut ids.eot, EOT_TEXTS);
    detect(&mut ids.eom, EOM_TEXTS);
    detect(&mut ids.fim_pre, FIM_PRE_TEXTS);
    detect(&mut ids.fim_suf, FIM_SUF_TEXTS);
    detect(&mut ids.fim_mid, FIM_MID_TEXTS);
    detect(&mut ids.fim_pad, FIM_PAD_TEXTS);
    detect(&mut ids.fim_rep, FIM_REP_TEXTS);
    detect(&mut ids.fim_sep, FIM_SEP_TEXTS);

    ids.eog.extend([ids.fim_pad, ids.fim_rep, ids.fim_sep].into_iter().flatten());
    for text in EOG_TEXTS {
        if let Some(id) = vocab.id(text) {
            ids.eog.insert(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    for text in ALWAYS_RENDERED_TEXTS {
        if let Some(id) = vocab.id(text) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    ids.eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());

    // "<|end|>" ends a turn but not generation in vocabularies with "<|return|>"/"<|call|>"
    // (gpt-oss) or "<|calls|>"/"<|flush|>" (solar-open).
    let eog_has = |ids: &SpecialIds, texts: &[&str]| texts.iter().any(|t| vocab.id(t).is_some_and(|id| ids.eog.contains(&id)));
    let (has_return, has_call, has_flush) =
        (eog_has(&ids, &["<|return|>"]), eog_has(&ids, &["<|call|>", "<|calls|>"]), eog_has(&ids, &["<|flush|>"]));
    if let Some(end) = vocab.id("<|end|>")
        && ids.eog.contains(&end)
        && has_call
        && (has_return || has_flush)
    {
        ids.eog.remove(&end);
        attrs[end as usize] = attr::USER_DEFINED;
    }
    // Gemma 4 and PLaMo have an ordinary "</s>".
    if let Some(s) = vocab.id("</s>")
        && ids.eog.contains(&s)
        && eog_has(&ids, &["<|tool_response>", "<|plamo:eos|>"])
    {
        ids.eog.remove(&s);
        attrs[s as usize] = attr::NORMAL;
    }
    Ok(ids)
}

/// A piece of the input after special-token splitting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Byte range of ordinary text, to be pre-tokenized and merged.
    Text(Range<usize>),
    /// A special token found in the text.
    Token(u32),
}

#[derive(Debug)]
struct SpecialEntry {
    id: u32,
    finder: Finder<'static>,
    /// Control and unknown tokens are only recognised when parsing special tokens;
    /// user-defined ones always are.
    needs_parse_special: bool,
}

/// Finds special-token text in input, in llama.cpp's order.
#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    entries: Vec<SpecialEntry>,
    /// A byte trie over the entries' texts, to find which of them occur in a text at all before
    /// running llama.cpp's one-token-at-a-time loop over those only (Gemma 3 has 6414 special
    /// tokens; searching the text for each would cost 6414 passes). Key `node << 8 | byte`.
    edges: HashMap<u64, u32, BuildHasherDefault<PairHasher>>,
    /// Index into `entries` of the text ending at each trie node (0 is the root), or `NO_ENTRY`.
    ends: Vec<u32>,
}

const NO_ENTRY: u32 = u32::MAX;

impl SpecialMatcher {
    /// Control, user-defined and unknown tokens, longest text first (ties by id).
    pub(crate) fn new(vocab: &Vocab, attrs: &[u32]) -> SpecialMatcher {
        let text = |id: u32| vocab.get(id).unwrap_or_default();
        let mut ids: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| attrs.get(id as usize).is_some_and(|a| a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0))
            .collect();
        ids.sort_by_key(|&id| std::cmp::Reverse(text(id).len()));
        let entries: Vec<SpecialEntry> = ids
            .into_iter()
            .map(|id| SpecialEntry {
                id,
                finder: Finder::new(text(id).as_bytes()).into_owned(),
                needs_parse_special: attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0,
            })
            .collect();
        let mut edges = HashMap::default();
        let mut ends = vec![NO_ENTRY];
        for (k, entry) in entries.iter().enumerate() {
            let mut node = 0u32;
            for &b in entry.finder.needle() {
                let next = ends.len() as u32;
                node = *edges.entry((u64::from(node) << 8) | u64::from(b)).or_insert(next);
                if node == next {
                    ends.push(NO_ENTRY);
                }
            }
            if let Some(end) = ends.get_mut(node as usize) {
                *end = k as u32;
            }
        }
        SpecialMatcher { entries, edges, ends }
    }

    /// Marks in `present` every entry whose text occurs somewhere in `bytes`.
    fn mark_present(&self, bytes: &[u8], present: &mut [bool]) {
        for start in 0..bytes.len() {
            let mut node = 0u32;
            for &b in &bytes[start..] {
                let Some(&child) = self.edges.get(&((u64::from(node) << 8) | u64::from(b))) else { break };
                node = child;
                if let Some(&k) = self.ends.get(node as usize)
                    && let Some(flag) = present.get_mut(k as usize)
                {
                    *flag = true;
                }
            }
        }
    }

    /// Splits `text` like llama.cpp's `tokenizer_st_partition`: each special token in turn, longest
    /// first, is cut out of every remaining text fragment at each of its non-overlapping
    /// occurrences. With `parse_special == false` only user-defined tokens are cut out.
    ///
    /// Rather than rebuilding the fragment list once per token (llama.cpp's loop, which costs
    /// tokens × fragments), the cut-out spans are kept in an ordered map: a token's next
    /// occurrence is taken when it lies wholly in text not yet cut out — exactly the occurrences
    /// that llama.cpp's scan of each remaining fragment, left to right, finds.
    pub(crate) fn partition(&self, text: &str, parse_special: bool, out: &mut Vec<Fragment>) {
        out.clear();
        if text.is_empty() {
            return;
        }
        let bytes = text.as_bytes();
        // A token that does not occur in the whole text occurs in none of its fragments.
        let mut present = vec![false; self.entries.len()];
        self.mark_present(bytes, &mut present);
        // Cut-out spans: start -> (end, token id); disjoint.
        let mut cut: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        for (entry, _) in self.entries.iter().zip(&present).filter(|(_, p)| **p) {
            if entry.needs_parse_special && !parse_special {
                continue;
            }
            let len = entry.finder.needle().len();
            let mut from = 0;
            while let Some(found) = bytes.get(from..).and_then(|hay| entry.finder.find(hay)) {
                let at = from + found;
                let end = at + len;
                // The span starting last before `end` is the only one that can overlap.
                match cut.range(..end).next_back() {
                    Some((_, &(span_end, _))) if span_end > at => {
                        // Every occurrence starting before `span_end` overlaps that span too.
                        from = span_end.max(at + 1);
                    }
                    _ => {
                        cut.insert(at, (end, entry.id));
                        from = end;
                    }
                }
            }
        }
        let mut pos = 0;
        for (start, (end, id)) in cut {
            if start > pos {
                out.push(Fragment::Text(pos..start));
            }
            out.push(Fragment::Token(id));
            pos = end;
        }
        if pos < text.len() {
            out.push(Fragment::Text(pos..text.len()));
        }
    }

    /// llama.cpp's loop as it is written, for the tests to compare with.
    #[cfg(test)]
    fn partition_by_fragments(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut out = vec![Fragment::Text(0..text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        let bytes = text.as_bytes();
        for entry in &self.entries {
            if entry.needs_parse_special && !parse_special {
                continue;
            }
            let mut next = Vec::new();
            for frag in &out {
                let Fragment::Text(range) = frag else {
                    next.push(frag.clone());
                    continue;
                };
                let mut start = range.start;
                while let Some(found) = bytes.get(start..range.end).and_then(|hay| entry.finder.find(hay)) {
                    let at = start + found;
                    if at > start {
                        next.push(Fragment::Text(start..at));
                    }
                    next.push(Fragment::Token(entry.id));
                    start = at + entry.finder.needle().len();
                }
                if start < range.end {
                    next.push(Fragment::Text(start..range.end));
                }
            }
            out = next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(specials: &[(&str, u32)]) -> (SpecialMatcher, Vec<String>) {
        let tokens: Vec<String> = specials.iter().map(|(t, _)| (*t).to_owned()).collect();
        let attrs: Vec<u32> = specials.iter().map(|(_, a)| *a).collect();
        let vocab = Vocab::new(&tokens).unwrap_or_else(|e| panic!("{e}"));
        (SpecialMatcher::new(&vocab, &attrs), tokens)
    }

    #[test]
    fn longest_token_is_cut_first_across_the_whole_text() {
        // llama.cpp handles tokens one at a time, longest first: "xyz" wins over an earlier "wx".
        let (m, _) = matcher(&[("wx", attr::CONTROL), ("xyz", attr::CONTROL)]);
        let mut out = Vec::new();
        m.partition("wxyz wx", true, &mut out);
        assert_eq!(out, [Fragment::Text(0..1), Fragment::Token(1), Fragment::Text(4..5), Fragment::Token(0)]);
    }

    #[test]
    fn user_defined_tokens_split_even_without_parse_special() {
        let (m, _) = matcher(&[("<c>", attr::CONTROL), ("<u>", attr::USER_DEFINED)]);
        let mut out = Vec::new();
        m.partition("a<c>b<u>", false, &mut out);
        assert_eq!(out, [Fragment::Text(0..5), Fragment::Token(1)]);
        m.partition("a<c>b<u>", true, &mut out);
        assert_eq!(out, [Fragment::Text(0..1), Fragment::Token(0), Fragment::Text(4..5), Fragment::Token(1)]);
    }

    #[test]
    fn cut_spans_agree_with_llama_cpp_loop_on_random_text() {
        // Overlapping, nested and repeated tokens over a small alphabet, so that conflicts are
        // frequent: "aba" vs "ab"/"ba", "aaaa" vs "aa", tokens inside tokens.
        let specials = [
            ("aa", attr::CONTROL), ("ab", attr::USER_DEFINED), ("ba", attr::CONTROL), ("aba", attr::USER_DEFINED),
            ("aaaa", attr::CONTROL), ("bab", attr::UNKNOWN), ("c", attr::USER_DEFINED), ("cab", attr::CONTROL),
            ("bb", attr::USER_DEFINED),
        ];
        let (m, _) = matcher(&specials);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut out = Vec::new();
        for round in 0..4000 {
            let len = round % 40;
            let text: String = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ['a', 'b', 'c', 'd'][(seed >> 62) as usize]
                })
                .collect();
            for parse_special in [false, true] {
                m.partition(&text, parse_special, &mut out);
                assert_eq!(out, m.partition_by_fragments(&text, parse_special), "{text:?} {parse_special}");
            }
        }
    }
}
