//! The Qwen2 pre-tokenizer: splits text into the words that BPE then works on.
//!
//! Qwen2's `tokenizer.json` splits with the regex
//! `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
//! llama.cpp does not run that regex; it runs a hand-written matcher with the same intent, and
//! that matcher is what the reference ids come from. This is a matcher of our own with the
//! same observable behaviour, including its quirks:
//! * `\p{L}`, `\p{N}` and `\s` are llama.cpp's code point tables (see `unicode_classes.rs`),
//!   whose `\s` is the 25 White_Space code points (so U+001C..U+001F are not spaces, U+0085 is);
//! * the contraction suffixes are case-folded for ASCII letters only (llama.cpp's lowercase map
//!   sends no other code point to s, t, m, d, r, e, v or l);
//! * the input ends where the fragment ends, so `\s+(?!\S)` leaves the last space of a run for
//!   the next word only when a non-space follows inside the same fragment.

use super::unicode_classes::RUNS;

/// What the pre-tokenizer needs to know about a code point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Other,
    Letter,
    Number,
    Space,
    /// Past the end of the fragment.
    End,
}

impl Class {
    const fn from_bits(bits: u32) -> Class {
        match bits & 3 {
            1 => Class::Letter,
            2 => Class::Number,
            3 => Class::Space,
            _ => Class::Other,
        }
    }
}

/// The run table looked up once for every ASCII code point.
static ASCII_CLASSES: [Class; 128] = {
    let mut table = [Class::Other; 128];
    let mut run = 0usize;
    let mut cp = 0usize;
    while cp < 128 {
        while run + 1 < RUNS.len() && (RUNS[run + 1] >> 2) as usize <= cp {
            run += 1;
        }
        table[cp] = Class::from_bits(RUNS[run]);
        cp += 1;
    }
    table
};

/// The class of code point `cp` in llama.cpp's tables.
pub(crate) fn class_of(cp: u32) -> Class {
    if let Some(&class) = ASCII_CLASSES.get(cp as usize) {
        return class;
    }
    // RUNS[0] starts at U+0000, so the partition point is at least 1.
    let idx = RUNS.partition_point(|&run| run >> 2 <= cp).saturating_sub(1);
    RUNS.get(idx).map_or(Class::Other, |&run| Class::from_bits(run))
}

/// Reusable buffers, so that splitting many fragments allocates only once.
#[derive(Debug, Default)]
pub(crate) struct SplitScratch {
    cps: Vec<u32>,
    classes: Vec<Class>,
    /// Byte offset of every code point, plus the fragment length at the end.
    offsets: Vec<usize>,
}

/// Splits `text` into pre-tokens and calls `emit` with each, in order. The pre-tokens are
/// non-empty and cover `text` exactly.
pub(crate) fn split_qwen2<'t>(text: &'t str, scratch: &mut SplitScratch, mut emit: impl FnMut(&'t str)) {
    let SplitScratch { cps, classes, offsets } = scratch;
    cps.clear();
    classes.clear();
    offsets.clear();
    for (off, c) in text.char_indices() {
        let cp = u32::from(c);
        cps.push(cp);
        classes.push(class_of(cp));
        offsets.push(off);
    }
    offsets.push(text.len());

    let n = cps.len();
    let mut pos = 0;
    while pos < n {
        let end = next_word_end(cps, classes, pos);
        debug_assert!(end > pos && end <= n);
        let (start_byte, end_byte) = (offsets[pos], offsets[end]);
        if let Some(word) = text.get(start_byte..end_byte) {
            emit(word);
        }
        pos = end;
    }
}

fn ascii_lower(cp: u32) -> u32 {
    if (u32::from(b'A')..=u32::from(b'Z')).contains(&cp) { cp + 32 } else { cp }
}

fn is_cr_or_lf(cp: u32) -> bool {
    cp == u32::from(b'\r') || cp == u32::from(b'\n')
}

/// Index one past the pre-token that starts at `pos` (`pos < cps.len()`).
fn next_word_end(cps: &[u32], classes: &[Class], pos: usize) -> usize {
    let n = cps.len();
    let class_at = |i: usize| classes.get(i).copied().unwrap_or(Class::End);
    let cp_at = |i: usize| cps.get(i).copied().unwrap_or(u32::MAX);
    let cp = cps[pos];
    let class = classes[pos];

    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if cp == u32::from(b'\'') && pos + 1 < n {
        let c1 = ascii_lower(cp_at(pos + 1));
        if [b's', b't', b'm', b'd'].iter().any(|&c| u32::from(c) == c1) {
            return pos + 2;
        }
        if pos + 2 < n {
            let c2 = ascii_lower(cp_at(pos + 2));
            let pair = |a: u8, b: u8| c1 == u32::from(a) && c2 == u32::from(b);
            if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
                return pos + 3;
            }
        }
    }

    // [^\r\n\p{L}\p{N}]?\p{L}+
    if !is_cr_or_lf(cp) && class != Class::Number && (class == Class::Letter || class_at(pos + 1) == Class::Letter) {
        let mut end = pos + 1;
        while class_at(end) == Class::Letter {
            end += 1;
        }
        return end;
    }

    // \p{N}
    if class == Class::Number {
        return pos + 1;
    }

    // <space>?[^\s\p{L}\p{N}]+[\r\n]*   (a lone trailing space also ends up here)
    let is_symbol = |c: Class| matches!(c, Class::Other);
    let after_space = if cp == u32::from(b' ') { class_at(pos + 1) } else { class };
    if is_symbol(after_space) || after_space == Class::End {
        let mut end = pos + usize::from(cp == u32::from(b' '));
        while is_symbol(class_at(end)) {
            end += 1;
        }
        while is_cr_or_lf(cp_at(end)) {
            end += 1;
        }
        return end;
    }

    // Whitespace runs: \s*[\r\n]+ | \s+(?!\S) | \s+
    let mut run_end = pos;
    let mut after_last_newline = None;
    while class_at(run_end) == Class::Space {
        if is_cr_or_lf(cps[run_end]) {
            after_last_newline = Some(run_end + 1);
        }
        run_end += 1;
    }
    if let Some(end) = after_last_newline {
        return end;
    }
    let run_len = run_end - pos;
    if run_len > 1 && run_end < n {
        return run_end - 1;
    }
    if run_len > 0 {
        return run_end;
    }
    pos + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<String> {
        let mut words = Vec::new();
        split_qwen2(text, &mut SplitScratch::default(), |w| words.push(w.to_owned()));
        words
    }

    #[test]
    fn classes_follow_llama_cpp_tables() {
        assert_eq!(class_of(u32::from('a')), Class::Letter);
        assert_eq!(class_of(u32::from('7')), Class::Number);
        assert_eq!(class_of(u32::from(' ')), Class::Space);
        assert_eq!(class_of(0x85), Class::Space);
        assert_eq!(class_of(0x1C), Class::Other);
        assert_eq!(class_of(0x200B), Class::Other);
        assert_eq!(class_of(0x3000), Class::Space);
        assert_eq!(class_of(u32::from('é')), Class::Letter);
        assert_eq!(class_of(u32::from('½')), Class::Number);
        assert_eq!(class_of(u32::from('你')), Class::Letter);
        assert_eq!(class_of(0x10FFFF), Class::Other);
        assert_eq!(class_of(0x0378), Class::Other); // unassigned
    }

    #[test]
    fn splits_like_the_qwen2_regex() {
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("hello   world"), ["hello", "  ", " world"]);
        assert_eq!(split("I'M it''s"), ["I", "'M", " it", "''", "s"]);
        assert_eq!(split("12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(split("a\r\nb"), ["a", "\r\n", "b"]);
        assert_eq!(split("end.\n"), ["end", ".\n"]);
        assert_eq!(split("x=1;y"), ["x", "=", "1", ";y"]);
        assert_eq!(split("   \n\n   \n"), ["   \n\n   \n"]);
        assert_eq!(split("trailing   "), ["trailing", "   "]);
        assert_eq!(split("a \n b"), ["a", " \n", " b"]);
        assert_eq!(split(" ?!"), [" ?!"]);
        assert_eq!(split("x "), ["x", " "]);
        assert_eq!(split("\tword"), ["\tword"]);
    }

    /// llama.cpp's own splits of 828 random strings (see `tests/data/tokenizer_oracle.md`).
    #[test]
    fn splits_like_llama_cpp_on_random_strings() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizer_oracle.jsonl");
        let data = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut n = 0;
        for line in data.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}"));
            let text = v["text"].as_str().unwrap_or_else(|| panic!("text"));
            let want: Vec<&str> = v["words"]
                .as_array()
                .unwrap_or_else(|| panic!("words"))
                .iter()
                .map(|w| w.as_str().unwrap_or_else(|| panic!("word")))
                .collect();
            assert_eq!(split(text), want, "{text:?}");
            n += 1;
        }
        assert_eq!(n, 828);
    }
}
