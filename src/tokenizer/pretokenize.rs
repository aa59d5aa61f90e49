//! Pre-tokenizers: split text into the words that byte-level BPE then works on, matching the
//! hand-written splitters of llama.cpp's `src/unicode.cpp` (`unicode_regex_split_custom_*`) and
//! the `tokenizer_pre` name table of `llama-vocab.cpp`.
//!
//! Four splitters, one per regex family that llama.cpp runs through a custom matcher:
//! * [`Splitter::Qwen2`]: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
//! * [`Splitter::Llama3`]: the same with `\p{N}{1,3}` (runs of digits cut into threes from the left);
//! * [`Splitter::Gpt2`]: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
//!   (contractions lowercase only, only U+0020 as the optional leading space);
//! * [`Splitter::DigitsThenGpt2`]: llama.cpp's `{"\p{N}", <gpt2 regex>}` pair (starcoder, smollm,
//!   …): every `\p{N}` code point becomes a piece of its own first, then the GPT-2 rules run
//!   inside each remaining piece, which ends where the piece ends.
//!
//! llama.cpp does not run those regexes; it runs matchers with the same intent, and those are
//! what the reference ids come from. These are matchers of our own with the same observable
//! behaviour, including the quirks:
//! * `\p{L}`, `\p{N}` and `\s` are llama.cpp's code point tables (see `unicode_classes.rs`),
//!   whose `\s` is the 25 White_Space code points (so U+001C..U+001F are not spaces, U+0085 is);
//! * the Qwen2/Llama 3 contraction suffixes are case-folded for ASCII letters only (llama.cpp's
//!   lowercase map sends no other code point to s, t, m, d, r, e, v or l);
//! * the input ends where the fragment (or piece) ends, so `\s+(?!\S)` leaves the last space of
//!   a run for the next word only when a non-space follows inside the same fragment.

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

/// Which of llama.cpp's splitters a vocabulary uses (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Splitter {
    Qwen2,
    Llama3,
    Gpt2,
    DigitsThenGpt2,
}

/// What a `tokenizer.ggml.pre` name selects in llama.cpp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PreTokenizer {
    pub(crate) splitter: Splitter,
    /// llama.cpp's `ignore_merges`: a word that is a vocabulary entry as a whole is that token,
    /// whatever the merges would make of it.
    pub(crate) ignore_merges: bool,
    /// llama.cpp's `add_bos` before `tokenizer.ggml.add_bos_token` is read (its default).
    pub(crate) add_bos_default: bool,
}

const fn pre(splitter: Splitter) -> PreTokenizer {
    PreTokenizer { splitter, ignore_merges: false, add_bos_default: false }
}

/// llama.cpp's LLAMA3 pre-type: `ignore_merges` and BOS by default.
const LLAMA3: PreTokenizer = PreTokenizer { splitter: Splitter::Llama3, ignore_merges: true, add_bos_default: true };

/// The `tokenizer.ggml.pre` names supported, with what llama.cpp does for each: only names whose
/// pre-type runs one of our splitters and that change nothing else in the vocabulary (names that
/// also set token attributes or separator tokens, such as the jina and roberta ones, are left
/// out). This is the one list; anything else is [`super::TokenizerError::UnsupportedPreTokenizer`].
pub(crate) const PRE_TOKENIZERS: &[(&str, PreTokenizer)] = &[
    // LLAMA_VOCAB_PRE_TYPE_QWEN2 (and STABLELM2, which shares its regex)
    ("qwen2", pre(Splitter::Qwen2)),
    ("deepseek-r1-qwen", pre(Splitter::Qwen2)),
    ("kormo", pre(Splitter::Qwen2)),
    ("f2llmv2", pre(Splitter::Qwen2)),
    ("megrez", pre(Splitter::Qwen2)),
    ("stablelm2", pre(Splitter::Qwen2)),
    // LLAMA_VOCAB_PRE_TYPE_LLAMA3
    ("llama3", LLAMA3),
    ("llama-v3", LLAMA3),
    ("llama-bpe", LLAMA3),
    ("falcon3", LLAMA3),
    ("falcon-h1", LLAMA3),
    ("pixtral", LLAMA3),
    ("midm-2.0", LLAMA3),
    ("lfm2", LLAMA3),
    // DBRX and SMAUG: the Llama 3 regex without ignore_merges
    ("dbrx", pre(Splitter::Llama3)),
    ("smaug-bpe", pre(Splitter::Llama3)),
    // LLAMA_VOCAB_PRE_TYPE_GPT2 (and MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING)
    ("gpt-2", pre(Splitter::Gpt2)),
    ("phi-2", pre(Splitter::Gpt2)),
    ("gigachat", pre(Splitter::Gpt2)),
    ("a.x-4.0", pre(Splitter::Gpt2)),
    ("mellum", pre(Splitter::Gpt2)),
    ("exaone4", pre(Splitter::Gpt2)),
    ("mpt", pre(Splitter::Gpt2)),
    ("olmo", pre(Splitter::Gpt2)),
    ("jais", pre(Splitter::Gpt2)),
    ("trillion", pre(Splitter::Gpt2)),
    ("granite-docling", pre(Splitter::Gpt2)),
    // STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2
    ("starcoder", pre(Splitter::DigitsThenGpt2)),
    ("refact", pre(Splitter::DigitsThenGpt2)),
    ("command-r", pre(Splitter::DigitsThenGpt2)),
    ("smollm", pre(Splitter::DigitsThenGpt2)),
    ("codeshell", pre(Splitter::DigitsThenGpt2)),
    ("exaone", pre(Splitter::DigitsThenGpt2)),
    ("minerva-7b", pre(Splitter::DigitsThenGpt2)),
    ("mellum2", pre(Splitter::DigitsThenGpt2)),
];

/// The pre-tokenizer that `tokenizer.ggml.pre` = `name` selects, if supported.
pub(crate) fn pre_tokenizer(name: &str) -> Option<PreTokenizer> {
    PRE_TOKENIZERS.iter().find(|(n, _)| *n == name).map(|&(_, p)| p)
}

/// The supported names, quoted and comma-separated, for error messages.
pub(crate) fn supported_pre_names() -> String {
    PRE_TOKENIZERS.iter().map(|(n, _)| format!("{n:?}")).collect::<Vec<_>>().join(", ")
}

/// Splits `text` into pre-tokens and calls `emit` with each, in order. The pre-tokens are
/// non-empty and cover `text` exactly.
pub(crate) fn split<'t>(splitter: Splitter, text: &'t str, scratch: &mut SplitScratch, mut emit: impl FnMut(&'t str)) {
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

    let mut emit_range = |start: usize, end: usize| {
        if let (Some(&s), Some(&e)) = (offsets.get(start), offsets.get(end))
            && let Some(word) = text.get(s..e)
        {
            emit(word);
        }
    };
    let n = cps.len();
    match splitter {
        Splitter::Qwen2 => split_piece(cps, classes, 0, n, |c, k, p| qwen2_word_end(c, k, p, 1), &mut emit_range),
        Splitter::Llama3 => split_piece(cps, classes, 0, n, |c, k, p| qwen2_word_end(c, k, p, 3), &mut emit_range),
        Splitter::Gpt2 => split_piece(cps, classes, 0, n, gpt2_word_end, &mut emit_range),
        Splitter::DigitsThenGpt2 => {
            // "\p{N}" first: each number code point is a piece; the GPT-2 rules then see each
            // stretch between them as a text of its own.
            let mut start = 0;
            for i in 0..n {
                if classes[i] == Class::Number {
                    split_piece(cps, classes, start, i, gpt2_word_end, &mut emit_range);
                    emit_range(i, i + 1);
                    start = i + 1;
                }
            }
            split_piece(cps, classes, start, n, gpt2_word_end, &mut emit_range);
        }
    }
}

/// Runs a word matcher over code points `lo..hi`, as if the text ended at `hi`.
fn split_piece(
    cps: &[u32],
    classes: &[Class],
    lo: usize,
    hi: usize,
    word_end: impl Fn(&[u32], &[Class], usize) -> usize,
    emit: &mut impl FnMut(usize, usize),
) {
    let (Some(cps), Some(classes)) = (cps.get(lo..hi), classes.get(lo..hi)) else { return };
    let mut pos = 0;
    while pos < cps.len() {
        let end = word_end(cps, classes, pos).clamp(pos + 1, cps.len());
        emit(lo + pos, lo + end);
        pos = end;
    }
}

fn ascii_lower(cp: u32) -> u32 {
    if (u32::from(b'A')..=u32::from(b'Z')).contains(&cp) { cp + 32 } else { cp }
}

fn is_cr_or_lf(cp: u32) -> bool {
    cp == u32::from(b'\r') || cp == u32::from(b'\n')
}

/// Index one past the Qwen2/Llama 3 pre-token that starts at `pos` (`pos < cps.len()`); a run of
/// digits is cut every `max_digits`.
fn qwen2_word_end(cps: &[u32], classes: &[Class], pos: usize, max_digits: usize) -> usize {
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

    // \p{N} or \p{N}{1,3}
    if class == Class::Number {
        let mut end = pos + 1;
        while end - pos < max_digits && class_at(end) == Class::Number {
            end += 1;
        }
        return end;
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
    space_run_end(pos, run_end, n)
}

/// The end of the pre-token a whitespace run `pos..run_end` gives (`n` code points in all):
/// `\s+(?!\S)` leaves the run's last space to the word after it, `\s+` takes a run that ends
/// the text (or a lone space) whole; no run at all is a one-code-point token.
fn space_run_end(pos: usize, run_end: usize, n: usize) -> usize {
    let run_len = run_end - pos;
    if run_len > 1 && run_end < n {
        return run_end - 1;
    }
    if run_len > 0 {
        return run_end;
    }
    pos + 1
}

/// Index one past the GPT-2 pre-token that starts at `pos` (`pos < cps.len()`), as llama.cpp's
/// `unicode_regex_split_custom_gpt2`.
fn gpt2_word_end(cps: &[u32], classes: &[Class], pos: usize) -> usize {
    let n = cps.len();
    let class_at = |i: usize| classes.get(i).copied().unwrap_or(Class::End);
    let cp_at = |i: usize| cps.get(i).copied().unwrap_or(u32::MAX);
    let cp = cp_at(pos);

    // 's|'t|'re|'ve|'m|'ll|'d   (lowercase only)
    if cp == u32::from(b'\'') && pos + 1 < n {
        let c1 = cp_at(pos + 1);
        if [b's', b't', b'm', b'd'].iter().any(|&c| u32::from(c) == c1) {
            return pos + 2;
        }
        let c2 = cp_at(pos + 2);
        let pair = |a: u8, b: u8| c1 == u32::from(a) && c2 == u32::from(b);
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return pos + 3;
        }
    }

    // <space>?\p{L}+ | <space>?\p{N}+ | <space>?[^\s\p{L}\p{N}]+
    let space = usize::from(cp == u32::from(b' '));
    let class = class_at(pos + space);
    if matches!(class, Class::Letter | Class::Number | Class::Other) {
        let mut end = pos + space;
        while class_at(end) == class {
            end += 1;
        }
        return end;
    }

    // \s+(?!\S) | \s+
    let mut run_end = pos;
    while class_at(run_end) == Class::Space {
        run_end += 1;
    }
    space_run_end(pos, run_end, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_with(splitter: Splitter, text: &str) -> Vec<String> {
        let mut words = Vec::new();
        super::split(splitter, text, &mut SplitScratch::default(), |w| words.push(w.to_owned()));
        assert_eq!(words.concat(), text, "the words must cover the text");
        words
    }

    fn split(text: &str) -> Vec<String> {
        split_with(Splitter::Qwen2, text)
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

    /// Hand-checked against llama.cpp's `unicode_regex_split_custom_gpt2`.
    #[test]
    fn splits_like_the_gpt2_regex() {
        let split = |t| split_with(Splitter::Gpt2, t);
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("hello   world"), ["hello", "  ", " world"]);
        // Contractions are lowercase only: "'M" is a symbol, then a letter.
        assert_eq!(split("I'm I'M it's"), ["I", "'m", " I", "'", "M", " it", "'s"]);
        assert_eq!(split("we'll they've you're"), ["we", "'ll", " they", "'ve", " you", "'re"]);
        // Digits stay together, and a space joins a number as it joins a word.
        assert_eq!(split("12345 678"), ["12345", " 678"]);
        // No [\r\n]* after symbols, and no \s*[\r\n]+ rule: newlines are plain whitespace.
        assert_eq!(split("end.\n"), ["end", ".", "\n"]);
        assert_eq!(split("a\r\nb"), ["a", "\r", "\n", "b"]);
        assert_eq!(split("\t\ttabs"), ["\t", "\t", "tabs"]);
        assert_eq!(split("trailing   "), ["trailing", "   "]);
        assert_eq!(split("   leading"), ["  ", " leading"]);
        assert_eq!(split(" ?!x"), [" ?!", "x"]);
        // Only U+0020 is an optional leading space; a tab is whitespace of its own.
        assert_eq!(split("\tword\u{3000}word"), ["\t", "word", "\u{3000}", "word"]);
        assert_eq!(split("x "), ["x", " "]);
        assert_eq!(split("naïve café"), ["naïve", " café"]);
    }

    /// llama.cpp's `{"\p{N}", <gpt2>}` (smollm, starcoder, …): digits first, then GPT-2 rules
    /// inside each stretch between them, which ends where the stretch ends.
    #[test]
    fn splits_like_smollm() {
        let split = |t| split_with(Splitter::DigitsThenGpt2, t);
        assert_eq!(split("12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(split(" 42abc"), [" ", "4", "2", "abc"]);
        assert_eq!(split("x = 1;"), ["x", " =", " ", "1", ";"]);
        assert_eq!(split("v1.2"), ["v", "1", ".", "2"]);
        // "\p{N}" is llama.cpp's number class, not just ASCII digits.
        assert_eq!(split("½ ¾"), ["½", " ", "¾"]);
        assert_eq!(split("①②"), ["①", "②"]);
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("a  1"), ["a", "  ", "1"]);
        assert_eq!(split("it's 2"), ["it", "'s", " ", "2"]);
    }

    /// The Qwen2 rules with `\p{N}{1,3}`: runs of digits are cut into threes from the left.
    #[test]
    fn splits_like_llama3() {
        let split = |t| split_with(Splitter::Llama3, t);
        assert_eq!(split("12345"), ["123", "45"]);
        assert_eq!(split("1234567"), ["123", "456", "7"]);
        assert_eq!(split("a 1234"), ["a", " ", "123", "4"]);
        assert_eq!(split("I'M it's"), ["I", "'M", " it", "'s"]);
        assert_eq!(split("end.\n"), ["end", ".\n"]);
    }

    #[test]
    fn the_name_table_has_no_duplicates_and_finds_smollm() {
        let mut names: Vec<&str> = PRE_TOKENIZERS.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PRE_TOKENIZERS.len());
        assert_eq!(pre_tokenizer("smollm").map(|p| p.splitter), Some(Splitter::DigitsThenGpt2));
        assert_eq!(pre_tokenizer("llama-bpe"), Some(LLAMA3));
        assert_eq!(pre_tokenizer("qwen2").map(|p| p.ignore_merges), Some(false));
        assert_eq!(pre_tokenizer("default"), None);
        assert!(supported_pre_names().contains("\"smollm\""));
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
