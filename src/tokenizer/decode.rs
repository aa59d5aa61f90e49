//! Token ids back to bytes and text: the per-token pieces (llama.cpp's `token_to_piece` for
//! both vocabulary types), whole-sequence decoding, and a streaming decoder that never emits a
//! broken code point (also when SentencePiece byte tokens `<0xNN>` carry a character in parts).

use super::byte_level::decode_token_text;
use super::error::TokenizerError;
use super::special::attr;
use super::vocab::Vocab;
use super::{Tokenizer, VocabType};

/// The raw bytes of every token, stored back to back.
#[derive(Debug)]
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    /// `offsets[id]..offsets[id + 1]` is token `id`'s piece.
    offsets: Vec<usize>,
}

impl Pieces {
    /// Pieces as llama.cpp's `token_to_piece(special = true)` renders them: control, unknown
    /// and user-defined tokens as their text, normal tokens through the byte-level alphabet
    /// (BPE) or with `▁` turned back into spaces (SentencePiece), byte tokens (`<0xAB>`) as
    /// their byte, anything else as nothing.
    pub(crate) fn new(vocab: &Vocab, attrs: &[u32], vocab_type: VocabType) -> Pieces {
        let mut bytes = Vec::with_capacity(vocab.iter().map(str::len).sum());
        let mut offsets = Vec::with_capacity(vocab.len() + 1);
        offsets.push(0);
        for (text, &a) in vocab.iter().zip(attrs) {
            if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
                bytes.extend_from_slice(text.as_bytes());
            } else if a & attr::NORMAL != 0 {
                match vocab_type {
                    VocabType::Bpe => bytes.extend_from_slice(&decode_token_text(text)),
                    VocabType::Spm => bytes.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
                }
            } else if a & attr::BYTE != 0 {
                bytes.extend(byte_token_value(text));
            }
            offsets.push(bytes.len());
        }
        Pieces { bytes, offsets }
    }

    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        let i = usize::try_from(id).ok()?;
        let (&start, &end) = (self.offsets.get(i)?, self.offsets.get(i + 1)?);
        self.bytes.get(start..end)
    }
}

/// The byte of a `<0xAB>` token, read as llama.cpp does (two hex digits at offset 3).
fn byte_token_value(text: &str) -> Option<u8> {
    u8::from_str_radix(text.get(3..5)?, 16).ok()
}

/// Turns a stream of token ids into text, one call per token, emitting only whole code points.
///
/// Bytes that may still become a code point are held back until the next token completes them;
/// bytes that can never be valid UTF-8 are replaced by U+FFFD the way
/// [`String::from_utf8_lossy`] would, so that the concatenation of everything `push` and
/// `flush` return equals [`Tokenizer::decode`] of the same ids.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder { tokenizer, pending: Vec::new() }
    }

    /// Adds one token and returns the text it completes (possibly empty). An id out of range
    /// is an error and leaves the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tokenizer.token_bytes(id)?;
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        let mut done = 0;
        loop {
            let rest = &self.pending[done..];
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    done = self.pending.len();
                    break;
                }
                Err(err) => {
                    let valid = err.valid_up_to();
                    if let Ok(text) = std::str::from_utf8(&rest[..valid]) {
                        out.push_str(text);
                    }
                    match err.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            done += valid + bad;
                        }
                        None => {
                            // An incomplete code point at the end: wait for more bytes.
                            done += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..done);
        Ok(out)
    }

    /// Bytes held back for a code point that is not complete yet.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: an incomplete code point left over becomes U+FFFD.
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
