//! llama-server's slot actions (`POST /slots/{id}?action=save|restore|erase`): a slot's KV
//! saved to a file under `--slot-save-path` and read back into any slot later, so that a long
//! prompt is evaluated once across restarts.
//!
//! Files are minfer session files ([`crate::generate::session`]: checksummed, tied to the
//! model's fingerprint and the KV cell type, written atomically) holding only the KV and its
//! tokens. A file name is one plain name inside the directory (llama.cpp's
//! `fs_validate_filename` rules: no separators, no `..`, no control or look-alike characters),
//! so no request reaches a path outside it.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{Value as Json, json};

use super::error::ApiError;
use crate::generate::session::{Session, model_fingerprint};
use crate::generate::Engine;
use crate::gguf::GgufFile;

/// What a slot action does.
#[derive(Debug, Clone)]
pub enum SlotAction {
    /// Write the slot's KV to `path` (`filename` inside `--slot-save-path`).
    Save { filename: String, path: PathBuf },
    /// Replace the slot's KV with the file's.
    Restore { filename: String, path: PathBuf },
    /// Forget the slot's KV.
    Erase,
}

/// What an action did (llama-server's answer fields).
#[derive(Debug, Clone)]
pub enum SlotReport {
    Saved { id: usize, filename: String, n_tokens: usize, n_bytes: u64, ms: f64 },
    Restored { id: usize, filename: String, n_tokens: usize, n_bytes: u64, ms: f64 },
    Erased { id: usize, n_tokens: usize },
}

impl SlotReport {
    pub fn to_json(&self) -> Json {
        match self {
            SlotReport::Saved { id, filename, n_tokens, n_bytes, ms } => {
                json!({"id_slot": id, "filename": filename, "n_saved": n_tokens, "n_written": n_bytes, "timings": {"save_ms": ms}})
            }
            SlotReport::Restored { id, filename, n_tokens, n_bytes, ms } => {
                json!({"id_slot": id, "filename": filename, "n_restored": n_tokens, "n_read": n_bytes, "timings": {"restore_ms": ms}})
            }
            SlotReport::Erased { id, n_tokens } => json!({"id_slot": id, "n_erased": n_tokens}),
        }
    }
}

/// The fingerprint slot files carry: the model's ([`model_fingerprint`]).
pub fn fingerprint(file: &GgufFile) -> u64 {
    model_fingerprint(file)
}

impl SlotAction {
    /// Runs the action on sequence `seq` of `engine` (slot `id`); `fingerprint` is the model's.
    pub fn run(&self, engine: &mut Engine, seq: usize, id: usize, fingerprint: u64) -> Result<SlotReport, ApiError> {
        let t0 = Instant::now();
        let ms = || t0.elapsed().as_secs_f64() * 1e3;
        match self {
            SlotAction::Save { filename, path } => {
                let kv = engine.seq_snapshot(seq).map_err(|e| ApiError::Internal(format!("Unable to save slot: {e}")))?;
                let n_tokens = kv.tokens.len();
                let session = Session { fingerprint, keep: 0, kv, dropped: Vec::new(), messages: Vec::new() };
                session.save(path).map_err(|e| ApiError::Internal(format!("Unable to save slot: {e}")))?;
                let n_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
                Ok(SlotReport::Saved { id, filename: filename.clone(), n_tokens, n_bytes, ms: ms() })
            }
            SlotAction::Restore { filename, path } => {
                let refused = |why: String| ApiError::param("filename", format!("Unable to restore slot from {filename:?}: {why}"));
                let n_bytes = std::fs::metadata(path).map_err(|e| refused(e.to_string()))?.len();
                let session = Session::load(path).map_err(|e| refused(e.to_string()))?;
                session.check_compatible(fingerprint, engine.kv_type()).map_err(|e| refused(e.to_string()))?;
                engine.seq_restore(seq, &session.kv).map_err(|e| refused(e.to_string()))?;
                Ok(SlotReport::Restored { id, filename: filename.clone(), n_tokens: session.kv.tokens.len(), n_bytes, ms: ms() })
            }
            SlotAction::Erase => {
                let n_tokens = engine.seq_tokens(seq).map_or(0, <[u32]>::len);
                engine.seq_truncate(seq, 0).map_err(|e| ApiError::Internal(e.to_string()))?;
                Ok(SlotReport::Erased { id, n_tokens })
            }
        }
    }
}

/// Is `name` one plain file name (llama.cpp's `fs_validate_filename`)? Not empty, at most 255
/// bytes, no path separator or `: * ? " < > |`, no control character, no Unicode look-alike of
/// a separator or dot, no surrogate, replacement character or BOM, no leading or trailing
/// space, no trailing dot, and not `.` or `..`.
pub fn valid_filename(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 || name.starts_with(' ') || name.ends_with(' ') || name.ends_with('.') {
        return false;
    }
    if name == "." || name == ".." {
        return false;
    }
    name.chars().all(|c| {
        let u = c as u32;
        !(u <= 0x1F
            || u == 0x7F
            || (0x80..=0x9F).contains(&u)
            || matches!(c, '\u{FF0E}' | '\u{2215}' | '\u{2216}' | '\u{FFFD}' | '\u{FEFF}')
            || matches!(c, '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|'))
    })
}

#[cfg(test)]
mod tests {
    use super::valid_filename;

    #[test]
    fn file_names_stay_inside_the_directory() {
        for ok in ["slot1.bin", "a", "my slot.kv", "ünïcode.bin", ".hidden"] {
            assert!(valid_filename(ok), "{ok:?}");
        }
        let long = "x".repeat(256);
        for bad in ["", ".", "..", "../etc/passwd", "a/b", "a\\b", "c:", "a*", "q?", "\"", "<", ">", "|", " lead", "trail ", "dot.", "nul\0", "tab\t", "del\u{7f}", "c1\u{85}", "dot\u{FF0E}", "sl\u{2215}", "bs\u{2216}", "rep\u{FFFD}", "bom\u{FEFF}", long.as_str()] {
            assert!(!valid_filename(bad), "{bad:?}");
        }
    }
}
