//! KV session files: a conversation's KV, token history and messages, saved so that a later
//! process continues without prefilling again.
//!
//! Layout (little-endian):
//!
//! ```text
//! magic "MINFERKV" | version u32 (2) | kv format u32 (f32 0, f16 1, q8_0 2)
//! | model fingerprint u64 | n_layer u32 | row bytes u32 | keep u32
//! | n_tokens u32 | tokens u32[n] | positions i32[n] | n_dropped u32 | dropped u32[..]
//! | messages: byte length u32 + JSON | per layer: K rows, V rows (n * row bytes each, as
//! the cells store them)
//! | checksum u64 (FNV-1a of every byte before it)
//! ```
//!
//! The file records the KV *format* (cell type and row bytes), not the backend that held the
//! cells: a session saved on one backend restores on any other whose cells have that format
//! (the bytes are read and written through the backends' `get_tensor` / `set_tensor`).
//! Version 1 files also carried a backend tag; they are refused as an unsupported version.
//!
//! Reading checks the checksum first, then every header field, before anything is restored:
//! a file from another model, truncated, of another version or corrupted is an error and the
//! conversation it was meant for is left as it was.
//!
//! Saving goes through [`super::durable`]: the file under the name is the old session or the
//! complete new one, even when the disk fills or the process dies mid-save.

use std::path::{Path, PathBuf};

use super::durable::{AtomicWrite, DurableError};
use super::engine::kv::KvSnapshot;
use crate::graph::KvType;
use crate::chat::ChatMessage;
use crate::gguf::GgufFile;

pub const MAGIC: &[u8; 8] = b"MINFERKV";
pub const VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Saving failed; the file under the name, if any, is the previous session.
    #[error(transparent)]
    Save(#[from] DurableError),
    #[error("not a minfer session file (no MINFERKV magic)")]
    NotASession,
    #[error("unsupported session version {found} (this minfer reads version {supported}): start the conversation again to save a new session")]
    Version { found: u32, supported: u32 },
    #[error("session file is truncated: {need} bytes needed, {have} present")]
    Truncated { need: usize, have: usize },
    #[error("session file checksum mismatch (stored {stored:016x}, computed {computed:016x}): the file is corrupted")]
    Checksum { stored: u64, computed: u64 },
    #[error("the session was saved with another model (fingerprint {file:016x}, this model's is {this:016x})")]
    ModelMismatch { file: u64, this: u64 },
    #[error("the session's KV cells are {found}; this engine's are {this} (use --cache-type {found})")]
    KvFormat { found: String, this: KvType },
    #[error("session file has an unknown KV format tag {0}")]
    UnknownKvFormat(u32),
    #[error("session file is malformed: {0}")]
    Malformed(String),
}

/// What a session file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub fingerprint: u64,
    pub keep: usize,
    pub kv: KvSnapshot,
    pub dropped: Vec<u32>,
    pub messages: Vec<ChatMessage>,
}

/// FNV-1a, 64 bits.
pub fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;

/// A cheap model fingerprint: every tensor's name, type, shape and offset, and the first
/// 4 KiB of every tensor's data.
pub fn model_fingerprint(file: &GgufFile) -> u64 {
    let mut h = FNV_OFFSET;
    for t in file.tensors() {
        h = fnv1a(t.name.as_bytes(), h);
        h = fnv1a(&t.type_id.to_le_bytes(), h);
        for d in &t.dims {
            h = fnv1a(&d.to_le_bytes(), h);
        }
        h = fnv1a(&t.offset.to_le_bytes(), h);
        if let Ok(data) = file.tensor_data(t) {
            h = fnv1a(&data[..data.len().min(4096)], h);
        }
    }
    h
}

struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, x: u32) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }

    fn len(&mut self, n: usize) -> Result<(), SessionError> {
        self.u32(u32::try_from(n).map_err(|_| SessionError::Malformed(format!("{n} items do not fit the format")))?);
        Ok(())
    }

    fn u32s(&mut self, xs: impl IntoIterator<Item = u32>) {
        xs.into_iter().for_each(|x| self.u32(x));
    }

}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SessionError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(SessionError::Truncated {
            need: self.at.saturating_add(n),
            have: self.b.len(),
        })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, SessionError> {
        let mut x = [0u8; 4];
        x.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(x))
    }

    fn u64(&mut self) -> Result<u64, SessionError> {
        let mut x = [0u8; 8];
        x.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(x))
    }

    /// `n` 4-byte values; the length is checked against the bytes left before allocating.
    fn words(&mut self, n: usize) -> Result<impl Iterator<Item = [u8; 4]> + 'a, SessionError> {
        let bytes = self.take(n.checked_mul(4).ok_or(SessionError::Malformed("a length overflows".into()))?)?;
        Ok(bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]))
    }
}

impl Session {
    pub fn encode(&self) -> Result<Vec<u8>, SessionError> {
        let kv = &self.kv;
        let mut w = Writer(Vec::new());
        w.0.extend_from_slice(MAGIC);
        w.u32s([VERSION, kv.kv_type.tag()]);
        w.0.extend_from_slice(&self.fingerprint.to_le_bytes());
        w.len(kv.layers.len())?;
        w.len(kv.row_bytes)?;
        w.len(self.keep)?;
        w.len(kv.tokens.len())?;
        w.u32s(kv.tokens.iter().copied());
        w.u32s(kv.positions.iter().map(|&p| p as u32));
        w.len(self.dropped.len())?;
        w.u32s(self.dropped.iter().copied());
        let messages = serde_json::to_vec(&self.messages).map_err(|e| SessionError::Malformed(e.to_string()))?;
        w.len(messages.len())?;
        w.0.extend_from_slice(&messages);
        for (k, v) in &kv.layers {
            w.0.extend_from_slice(k);
            w.0.extend_from_slice(v);
        }
        let sum = fnv1a(&w.0, FNV_OFFSET);
        w.0.extend_from_slice(&sum.to_le_bytes());
        Ok(w.0)
    }

    pub fn decode(bytes: &[u8]) -> Result<Session, SessionError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(SessionError::NotASession);
        }
        let mut r = Reader { b: bytes, at: MAGIC.len() };
        let version = r.u32()?;
        if version != VERSION {
            return Err(SessionError::Version { found: version, supported: VERSION });
        }
        let body_len = bytes.len().checked_sub(8).ok_or(SessionError::Truncated { need: 8, have: bytes.len() })?;
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&bytes[body_len..]);
        let stored = u64::from_le_bytes(tail);
        let computed = fnv1a(&bytes[..body_len], FNV_OFFSET);
        if stored != computed {
            return Err(SessionError::Checksum { stored, computed });
        }
        let mut r = Reader { b: &bytes[..body_len], at: r.at };
        let (kv_format, fingerprint) = (r.u32()?, r.u64()?);
        let kv_type = [KvType::F32, KvType::F16, KvType::Q8_0]
            .into_iter()
            .find(|t| t.tag() == kv_format)
            .ok_or(SessionError::UnknownKvFormat(kv_format))?;
        let (n_layer, row_bytes, keep, n) = (r.u32()? as usize, r.u32()? as usize, r.u32()? as usize, r.u32()? as usize);
        let tokens: Vec<u32> = r.words(n)?.map(u32::from_le_bytes).collect();
        let positions: Vec<i32> = r.words(n)?.map(i32::from_le_bytes).collect();
        let n_dropped = r.u32()? as usize;
        let dropped: Vec<u32> = r.words(n_dropped)?.map(u32::from_le_bytes).collect();
        let n_json = r.u32()? as usize;
        let messages: Vec<ChatMessage> =
            serde_json::from_slice(r.take(n_json)?).map_err(|e| SessionError::Malformed(format!("messages: {e}")))?;
        let size = n.checked_mul(row_bytes).ok_or(SessionError::Malformed("KV size overflows".into()))?;
        // No model has this many layers; the bound keeps a crafted count from looping for long.
        if n_layer > 4096 {
            return Err(SessionError::Malformed(format!("{n_layer} layers")));
        }
        let mut layers = Vec::with_capacity(n_layer.min(1024));
        for _ in 0..n_layer {
            let k = r.take(size)?.to_vec();
            let v = r.take(size)?.to_vec();
            layers.push((k, v));
        }
        if r.at != r.b.len() {
            return Err(SessionError::Malformed(format!("{} bytes after the KV", r.b.len() - r.at)));
        }
        let kv = KvSnapshot { tokens, positions, kv_type, row_bytes, layers };
        Ok(Session { fingerprint, keep, kv, dropped, messages })
    }

    /// Writes the session to `path` atomically and durably ([`super::durable`]).
    pub fn save(&self, path: &Path) -> Result<(), SessionError> {
        self.save_with(path, &AtomicWrite::default())
    }

    /// [`save`](Self::save) with explicit write settings (tests inject failures through them).
    pub fn save_with(&self, path: &Path, how: &AtomicWrite) -> Result<(), SessionError> {
        let bytes = self.encode()?;
        how.write(path, |w| w.write_all(&bytes))?;
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Session, SessionError> {
        let bytes = std::fs::read(path).map_err(|source| SessionError::Io { path: path.to_path_buf(), source })?;
        Session::decode(&bytes)
    }

    /// Checks that this session can be restored into an engine of `fingerprint`'s model whose
    /// cells are `kv_type`.
    pub fn check_compatible(&self, fingerprint: u64, kv_type: KvType) -> Result<(), SessionError> {
        if self.fingerprint != fingerprint {
            return Err(SessionError::ModelMismatch { file: self.fingerprint, this: fingerprint });
        }
        if self.kv.kv_type != kv_type {
            return Err(SessionError::KvFormat { found: self.kv.kv_type.to_string(), this: kv_type });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Session {
        Session {
            fingerprint: 0xABCD,
            keep: 1,
            kv: KvSnapshot {
                tokens: vec![5, 6, 7],
                positions: vec![0, 1, 2],
                kv_type: KvType::Q8_0,
                row_bytes: 2,
                layers: vec![((0..6).collect(), vec![7; 6])],
            },
            dropped: vec![9],
            messages: vec![ChatMessage::user("hi")],
        }
    }

    #[test]
    fn round_trips() {
        let s = sample();
        assert_eq!(Session::decode(&s.encode().unwrap()).unwrap(), s);
    }

    #[test]
    fn every_corruption_is_an_error() {
        let bytes = sample().encode().unwrap();
        assert!(matches!(Session::decode(b"GGUF...."), Err(SessionError::NotASession)));
        for cut in [0, 4, 12, 20, bytes.len() - 1] {
            let r = Session::decode(&bytes[..cut]);
            assert!(r.is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(matches!(Session::decode(&flipped), Err(SessionError::Checksum { .. })));
        let mut v3 = bytes.clone();
        v3[8] = 3;
        assert!(matches!(Session::decode(&v3), Err(SessionError::Version { found: 3, .. })));
        // A version 1 file, as minfer wrote it before the backend seam (a backend tag after
        // the version): refused by its version, with a message that says so.
        let mut v1 = MAGIC.to_vec();
        for word in [1u32, 0, 0] {
            v1.extend_from_slice(&word.to_le_bytes());
        }
        v1.extend_from_slice(&0xABCDu64.to_le_bytes());
        v1.extend_from_slice(&[0u8; 32]);
        let err = Session::decode(&v1).unwrap_err();
        assert!(matches!(err, SessionError::Version { found: 1, supported: 2 }), "{err}");
        assert!(err.to_string().starts_with("unsupported session version 1"), "{err}");
        assert!(matches!(sample().check_compatible(1, KvType::Q8_0), Err(SessionError::ModelMismatch { .. })));
        assert!(matches!(sample().check_compatible(0xABCD, KvType::F32), Err(SessionError::KvFormat { .. })));
        assert!(sample().check_compatible(0xABCD, KvType::Q8_0).is_ok());
    }
}
