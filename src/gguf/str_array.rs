//! A compact array of strings for GGUF metadata: one text buffer and the end offset of each
//! string. A vocabulary of 151,936 tokens and 151,387 merges costs about its bytes on disk plus
//! four bytes an entry, where a `Vec<String>` costs 24 bytes of header and one allocation per
//! entry (about 10 MB for the Qwen2.5 tokenizer, kept for as long as the file is open).

use std::fmt;

/// Strings stored back to back; `ends[i]` is where string `i` stops in `text`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StrArray {
    text: String,
    ends: Vec<u32>,
}

/// The array's text would pass 4 GiB (the end offsets are u32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrArrayFull {
    pub bytes: u64,
}

impl StrArray {
    /// An empty array with room for `n` strings.
    pub fn with_capacity(n: usize) -> StrArray {
        StrArray { text: String::new(), ends: Vec::with_capacity(n) }
    }

    /// Gives back the text buffer's growth slack once every string is in.
    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
    }

    /// Appends `s`; refused when the text would no longer be addressable with u32 offsets.
    pub fn push(&mut self, s: &str) -> Result<(), StrArrayFull> {
        let end = self.text.len() as u64 + s.len() as u64;
        let end32 = u32::try_from(end).map_err(|_| StrArrayFull { bytes: end })?;
        self.text.push_str(s);
        self.ends.push(end32);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        // Offsets are char boundaries: each one is the end of a pushed `&str`.
        self.text.get(start..end)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// An array of `strs`, in order.
    pub fn from_strs<S: AsRef<str>>(strs: impl IntoIterator<Item = S>) -> Result<StrArray, StrArrayFull> {
        let mut a = StrArray::default();
        for s in strs {
            a.push(s.as_ref())?;
        }
        Ok(a)
    }

    /// The strings as owned values (for callers that keep their own copy).
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for StrArray {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for StrArray {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl fmt::Debug for StrArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_come_back_in_order_with_empty_and_multibyte_entries() {
        let src = ["Ġthe", "", "é", "日本", "a b"];
        let a = StrArray::from_strs(src).unwrap();
        assert_eq!(a.len(), 5);
        assert_eq!(a.get(0), Some("Ġthe"));
        assert_eq!(a.get(1), Some(""));
        assert_eq!(a.get(3), Some("日本"));
        assert_eq!(a.get(5), None);
        assert_eq!(a.iter().collect::<Vec<_>>(), src);
        assert_eq!(a, src);
        assert_eq!(a.to_vec(), src.map(String::from));
        assert!(StrArray::default().is_empty());
    }
}
