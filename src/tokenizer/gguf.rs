//! Reading a [`TokenizerData`] from a GGUF file's `tokenizer.ggml.*` metadata.

use super::{Tokenizer, TokenizerData, TokenizerError};
use crate::gguf::GgufFile;

impl TokenizerData {
    /// The tokenizer metadata of `file`. Keys that llama.cpp treats as optional may be absent;
    /// present keys of the wrong type are errors.
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerData, TokenizerError> {
        let id = |key: &str| file.opt_token_id(&format!("tokenizer.ggml.{key}_token_id"));
        let token_types = match file.get("tokenizer.ggml.token_type") {
            Some(_) => file.get_i32_array("tokenizer.ggml.token_type")?,
            None => Vec::new(),
        };
        Ok(TokenizerData {
            model: file.get_str("tokenizer.ggml.model")?.to_owned(),
            pre: file.opt_str("tokenizer.ggml.pre")?.unwrap_or_default().to_owned(),
            tokens: file.get_str_array("tokenizer.ggml.tokens")?.to_vec(),
            token_types,
            merges: file.get_str_array("tokenizer.ggml.merges")?.to_vec(),
            bos_id: id("bos")?,
            eos_id: id("eos")?,
            eot_id: id("eot")?,
            eom_id: id("eom")?,
            unk_id: id("unknown")?,
            // (sic: the GGUF key is spelled "seperator")
            sep_id: id("seperator")?,
            pad_id: id("padding")?,
            mask_id: id("mask")?,
            // The deprecated prefix/suffix/middle keys win when present, as in llama.cpp.
            fim_pre_id: id("prefix")?.or(id("fim_pre")?),
            fim_suf_id: id("suffix")?.or(id("fim_suf")?),
            fim_mid_id: id("middle")?.or(id("fim_mid")?),
            fim_pad_id: id("fim_pad")?,
            fim_rep_id: id("fim_rep")?,
            fim_sep_id: id("fim_sep")?,
            add_bos: file.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
            add_eos: file.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
        })
    }
}

impl Tokenizer {
    /// The tokenizer of a model file.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::new(TokenizerData::from_gguf(file)?)
    }
}
