//! The vocabulary's token texts, stored once: llama.cpp's `id_to_token[].text` and
//! `token_to_id` in one structure. All texts sit back to back in one buffer, and an
//! open-addressing table of ids finds a text's id; a 262144-token vocabulary (Gemma 3) takes
//! about 6 MB instead of the ~30 MB of a `Vec<String>` plus a `HashMap<String, u32>` of copies.

use std::hash::Hasher;

use super::bpe::WordHasher;
use super::error::TokenizerError;

const EMPTY: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct Vocab {
    /// Every token's text, back to back.
    text: String,
    /// `offsets[id]..offsets[id + 1]` is token `id`'s text.
    offsets: Vec<u32>,
    /// Ids by hash of their text, linear probing; `EMPTY` marks a free slot. The length is a
    /// power of two at least twice the number of tokens.
    slots: Vec<u32>,
}

/// The keys are vocabulary entries, not user text, so an unkeyed fast hash is fine: lookups of
/// user text never insert.
fn hash(text: &str) -> u64 {
    let mut h = WordHasher::default();
    h.write(text.as_bytes());
    h.finish()
}

impl Vocab {
    /// Builds the vocabulary; two entries with the same text are an error, as in llama.cpp.
    pub(crate) fn new(tokens: &[String]) -> Result<Vocab, TokenizerError> {
        let n_vocab = tokens.len();
        let total: usize = tokens.iter().map(String::len).sum();
        if u32::try_from(total).is_err() || u32::try_from(n_vocab).map_or(true, |n| n == EMPTY) {
            return Err(TokenizerError::VocabularyTooLarge { n_vocab });
        }
        let mut text = String::with_capacity(total);
        let mut offsets = Vec::with_capacity(n_vocab + 1);
        offsets.push(0);
        for t in tokens {
            text.push_str(t);
            offsets.push(text.len() as u32);
        }
        let n_slots = (n_vocab * 2).next_power_of_two().max(2);
        let mut vocab = Vocab { text, offsets, slots: vec![EMPTY; n_slots] };
        let mask = n_slots - 1;
        for (id, t) in tokens.iter().enumerate() {
            let id = id as u32;
            let mut slot = hash(t) as usize & mask;
            loop {
                match vocab.slots[slot] {
                    EMPTY => {
                        vocab.slots[slot] = id;
                        break;
                    }
                    other if vocab.get(other) == Some(t.as_str()) => {
                        return Err(TokenizerError::DuplicateToken { text: t.clone(), first: other, second: id });
                    }
                    _ => slot = (slot + 1) & mask,
                }
            }
        }
        Ok(vocab)
    }

    /// Number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The text of token `id`.
    pub(crate) fn get(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        let (&start, &end) = (self.offsets.get(i)?, self.offsets.get(i + 1)?);
        self.text.get(start as usize..end as usize)
    }

    /// The id of the token whose text is exactly `text`.
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut slot = hash(text) as usize & mask;
        loop {
            match self.slots[slot] {
                EMPTY => return None,
                id if self.get(id) == Some(text) => return Some(id),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Every token's text, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        self.offsets.windows(2).map(|w| self.text.get(w[0] as usize..w[1] as usize).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(words: &[&str]) -> Result<Vocab, TokenizerError> {
        Vocab::new(&words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn finds_every_token_and_nothing_else() {
        let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
        let v = Vocab::new(&words).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.len(), 5000);
        for (i, w) in words.iter().enumerate() {
            assert_eq!(v.id(w), Some(i as u32));
            assert_eq!(v.get(i as u32), Some(w.as_str()));
        }
        assert_eq!(v.id("w5000"), None);
        assert_eq!(v.id(""), None);
        assert_eq!(v.get(5000), None);
        assert_eq!(v.iter().count(), 5000);
    }

    #[test]
    fn duplicates_are_reported_with_both_ids() {
        assert!(matches!(vocab(&["a", "b", "a"]), Err(TokenizerError::DuplicateToken { first: 0, second: 2, .. })));
        let one = vocab(&["x"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((one.id("x"), one.id("y")), (Some(0), None));
    }
}
