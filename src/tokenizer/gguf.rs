//! Reading a [`TokenizerData`] from a GGUF file's `tokenizer.ggml.*` metadata, with llama.cpp's
//! defaults (`llama_vocab::impl::load`) for keys that may be absent.

use super::{Tokenizer, TokenizerData, TokenizerError, VocabType};
use crate::gguf::{GgufError, GgufFile, MetaArray};

/// `tokenizer.ggml.scores`: f32, or integers as llama.cpp also accepts; empty when absent.
fn scores(file: &GgufFile) -> Result<Vec<f32>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.scores";
    if file.get(KEY).is_none() {
        return Ok(Vec::new());
    }
    match file.get_array(KEY)? {
        MetaArray::F32(v) => Ok(v.clone()),
        a if a.elem_type().is_integer() => Ok(file.get_i32_array(KEY)?.into_iter().map(|x| x as f32).collect()),
        _ => Err(GgufError::WrongType {
            key: KEY.to_owned(),
            expected: "array of f32",
            found: file.get(KEY).map(|v| v.type_description()).unwrap_or_default(),
        }
        .into()),
    }
}

impl TokenizerData {
    /// The tokenizer metadata of `file`. Keys that llama.cpp treats as optional may be absent;
    /// present keys of the wrong type are errors.
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerData, TokenizerError> {
        let id = |key: &str| file.opt_token_id(&format!("tokenizer.ggml.{key}_token_id"));
        let token_types = match file.get("tokenizer.ggml.token_type") {
            Some(_) => file.get_i32_array("tokenizer.ggml.token_type")?,
            None => Vec::new(),
        };
        let model = file.get_str("tokenizer.ggml.model")?.to_owned();
        let pre = file.opt_str("tokenizer.ggml.pre")?.unwrap_or_default().to_owned();
        let vocab_type = VocabType::from_model_name(&model);
        // Merges are required for BPE (as in llama.cpp) and unused otherwise.
        let merges = match vocab_type {
            Some(VocabType::Spm) if file.get("tokenizer.ggml.merges").is_none() => Vec::new(),
            _ => file.get_str_array("tokenizer.ggml.merges")?.to_vec(),
        };
        let add_bos_default = vocab_type.is_some_and(|t| t.default_add_bos(&pre));
        let add_space_prefix_default = vocab_type.is_some_and(VocabType::default_add_space_prefix);
        Ok(TokenizerData {
            tokens: file.get_str_array("tokenizer.ggml.tokens")?.to_vec(),
            scores: scores(file)?,
            token_types,
            merges,
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
            add_bos: file.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default),
            add_eos: file.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            add_space_prefix: file.opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(add_space_prefix_default),
            model,
            pre,
        })
    }
}

impl Tokenizer {
    /// The tokenizer of a model file.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::new(TokenizerData::from_gguf(file)?)
    }
}
