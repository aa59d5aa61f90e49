//! llama.cpp's GBNF grammars, translated to llguidance's Lark syntax.
//!
//! GBNF: rules `name ::= alternatives`, the start rule `root`; items are string literals
//! (`"..."`), character classes (`[a-z]`, `[^"\\]`), `.` (any character), rule names and
//! groups, each optionally followed by `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`; `#` starts a
//! comment. A rule ends at the end of its line, except after `::=` or `|` and inside
//! parentheses (as llama.cpp parses it); a line that starts with `|` continues the rule above.
//! Escapes: `\n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH`.
//!
//! Translation: every rule becomes a Lark rule `g_<name>` (`start: g_root`), literals stay
//! literals, character classes and `.` become one-character regular expressions. The text is
//! checked here first, so an error names its line and column in the GBNF the user wrote.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::error::GrammarError;

/// One GBNF expression.
#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Literal(String),
    /// Ranges of characters (inclusive), negated or not.
    Class { negated: bool, ranges: Vec<(char, char)> },
    Any,
    /// A rule name and where it is referenced (a char offset, for errors).
    Rule(String, usize),
    /// Alternatives of sequences.
    Alt(Vec<Vec<Expr>>),
    Repeat(Box<Expr>, usize, Option<usize>),
}

/// Deepest nesting of parentheses: the parser and the translation recurse once per level.
const MAX_DEPTH: usize = 64;

/// Most repetition operators stacked on one item (`"a"*?+`).
const MAX_STACKED: usize = 4;

/// Largest count of a `{m,n}` repetition (the compiler unrolls them).
const MAX_REPEAT: usize = 1000;

struct Parser<'a> {
    src: &'a [char],
    pos: usize,
    depth: usize,
}

/// Line and column (from 1) of char offset `pos` in `src`.
fn line_col(src: &[char], pos: usize) -> (usize, usize) {
    let before = &src[..pos.min(src.len())];
    let line = before.iter().filter(|&&c| c == '\n').count() + 1;
    let col = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
    (line, col)
}

impl Parser<'_> {
    fn fail<T>(&self, message: impl Into<String>) -> Result<T, GrammarError> {
        let (line, column) = line_col(self.src, self.pos);
        Err(GrammarError::Gbnf { line, column, message: message.into() })
    }

    fn peek(&self) -> Option<char> {
        self.src.get(self.pos).copied()
    }

    /// Skips spaces, tabs and comments, and newlines when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.pos += 1;
                }
            } else if c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// After a newline at the top level: whether the next line starts with `|` (continuing
    /// the rule).
    fn continues(&self) -> bool {
        let mut p = self.pos;
        while let Some(&c) = self.src.get(p) {
            match c {
                ' ' | '\t' | '\r' | '\n' => p += 1,
                '|' => return true,
                _ => return false,
            }
        }
        false
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.src[start..self.pos].iter().collect())
    }

    fn escaped(&mut self) -> Result<char, GrammarError> {
        // At the character after the backslash.
        let Some(c) = self.peek() else { return self.fail("a backslash ends the grammar") };
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> Result<char, GrammarError> {
            let digits: String = p.src.get(p.pos..p.pos + n).map(|d| d.iter().collect()).unwrap_or_default();
            let hex_only = digits.chars().all(|d| d.is_ascii_hexdigit());
            match u32::from_str_radix(&digits, 16).ok().filter(|_| hex_only).and_then(char::from_u32) {
                Some(ch) if digits.len() == n => {
                    p.pos += n;
                    Ok(ch)
                }
                _ => p.fail(format!("\\{c} must be followed by {n} hexadecimal digits of a valid character")),
            }
        };
        match c {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => Ok(c),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            _ => {
                self.pos -= 1;
                self.fail(format!("unknown escape \\{c}"))
            }
        }
    }

    fn literal(&mut self) -> Result<Expr, GrammarError> {
        self.pos += 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some('\n') => return self.fail("unterminated string literal"),
                Some('"') => {
                    self.pos += 1;
                    return Ok(Expr::Literal(s));
                }
                Some('\\') => {
                    self.pos += 1;
                    s.push(self.escaped()?);
                }
                Some(c) => {
                    self.pos += 1;
                    s.push(c);
                }
            }
        }
    }

    fn class(&mut self) -> Result<Expr, GrammarError> {
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let start = self.pos;
            let lo = match self.peek() {
                None | Some('\n') => return self.fail("unterminated character class"),
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                Some('\\') => {
                    self.pos += 1;
                    self.escaped()?
                }
                Some(c) => {
                    self.pos += 1;
                    c
                }
            };
            let hi = if self.peek() == Some('-') && self.src.get(self.pos + 1).is_some_and(|&c| c != ']') {
                self.pos += 1;
                match self.peek() {
                    Some('\\') => {
                        self.pos += 1;
                        self.escaped()?
                    }
                    Some(c) => {
                        self.pos += 1;
                        c
                    }
                    None => return self.fail("unterminated character class"),
                }
            } else {
                lo
            };
            if hi < lo {
                self.pos = start;
                return self.fail(format!("the range {lo:?}-{hi:?} is backwards"));
            }
            ranges.push((lo, hi));
        }
        if ranges.is_empty() {
            if negated {
                // `[^]` excludes nothing: any character, as llama.cpp reads it.
                return Ok(Expr::Any);
            }
            return self.fail("an empty character class matches nothing");
        }
        Ok(Expr::Class { negated, ranges })
    }

    /// Digits at the cursor (`None`: none there); a number too large to hold reads as
    /// `usize::MAX`, which the repetition bound then refuses.
    fn number(&mut self) -> Option<usize> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.src[start..self.pos].iter().collect::<String>().parse().unwrap_or(usize::MAX))
    }

    fn alternatives(&mut self, nested: bool) -> Result<Expr, GrammarError> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            if !nested && self.peek() == Some('\n') && self.continues() {
                self.space(true);
            }
            if self.peek() != Some('|') {
                break;
            }
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(Expr::Alt(alts))
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Expr>, GrammarError> {
        let mut items = Vec::new();
        loop {
            self.space(nested);
            let start = self.pos;
            let item = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('.') => {
                    self.pos += 1;
                    Expr::Any
                }
                Some('(') => {
                    if self.depth >= MAX_DEPTH {
                        return self.fail(format!("parentheses nest deeper than {MAX_DEPTH}"));
                    }
                    self.pos += 1;
                    self.space(true);
                    self.depth += 1;
                    let inner = self.alternatives(true)?;
                    self.depth -= 1;
                    self.space(true);
                    if self.peek() != Some(')') {
                        return self.fail("expected ')'");
                    }
                    self.pos += 1;
                    inner
                }
                Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                    let at = start;
                    let name = self.name().unwrap_or_default();
                    // `name ::=` starts the next rule: this sequence has ended.
                    let mut p = self.pos;
                    while matches!(self.src.get(p), Some(' ' | '\t')) {
                        p += 1;
                    }
                    if self.src.get(p..p + 3).is_some_and(|s| s == [':', ':', '=']) {
                        self.pos = start;
                        return Ok(items);
                    }
                    Expr::Rule(name, at)
                }
                // A postfix operator applies to the item before it (spaces between allowed,
                // operators may stack, as llama.cpp reads them).
                Some('*' | '+' | '?' | '{') => match items.pop() {
                    Some(last) => self.repetition(last)?,
                    None => return self.fail("a repetition operator needs an item before it"),
                },
                _ => return Ok(items),
            };
            // `x{0}` matches only the empty string: nothing to add.
            if !matches!(item, Expr::Repeat(_, 0, Some(0))) {
                items.push(item);
            }
        }
    }

    fn repetition(&mut self, item: Expr) -> Result<Expr, GrammarError> {
        let mut stacked = 0;
        let mut e = &item;
        while let Expr::Repeat(inner, ..) = e {
            stacked += 1;
            e = inner;
        }
        if stacked >= MAX_STACKED {
            return self.fail(format!("more than {MAX_STACKED} repetition operators stacked on one item"));
        }
        let rep = |lo, hi| Expr::Repeat(Box::new(item.clone()), lo, hi);
        Ok(match self.peek() {
            Some('*') => {
                self.pos += 1;
                rep(0, None)
            }
            Some('+') => {
                self.pos += 1;
                rep(1, None)
            }
            Some('?') => {
                self.pos += 1;
                rep(0, Some(1))
            }
            Some('{') => {
                self.pos += 1;
                self.space(false);
                let Some(lo) = self.number() else { return self.fail("expected a number after '{'") };
                self.space(false);
                let hi = if self.peek() == Some(',') {
                    self.pos += 1;
                    self.space(false);
                    self.number()
                } else {
                    Some(lo)
                };
                self.space(false);
                if self.peek() != Some('}') {
                    return self.fail("expected '}'");
                }
                self.pos += 1;
                if lo.max(hi.unwrap_or(0)) > MAX_REPEAT {
                    return self.fail(format!("repetition counts above {MAX_REPEAT} are not supported"));
                }
                if hi.is_some_and(|h| h < lo) {
                    return self.fail(format!("the repetition {{{lo},{}}} is backwards", hi.unwrap_or(0)));
                }
                rep(lo, hi)
            }
            _ => item,
        })
    }
}

/// The GBNF rules, in order of definition.
fn parse(src: &[char]) -> Result<Vec<(String, Expr)>, GrammarError> {
    let mut p = Parser { src, pos: 0, depth: 0 };
    let mut rules: Vec<(String, Expr)> = Vec::new();
    let mut defined: BTreeSet<String> = BTreeSet::new();
    loop {
        p.space(true);
        if p.peek().is_none() {
            break;
        }
        let Some(name) = p.name() else { return p.fail("expected a rule name") };
        p.space(false);
        if p.src.get(p.pos..p.pos + 3) != Some(&[':', ':', '='][..]) {
            return p.fail(format!("expected '::=' after the rule name '{name}'"));
        }
        p.pos += 3;
        p.space(true);
        let body = p.alternatives(false)?;
        p.space(false);
        if p.peek().is_some_and(|c| c != '\n') {
            return p.fail(format!("unexpected {:?} in the rule '{name}'", p.peek().unwrap_or(' ')));
        }
        if !defined.insert(name.clone()) {
            return p.fail(format!("the rule '{name}' is defined twice"));
        }
        rules.push((name, body));
    }
    if !defined.contains("root") {
        return Err(GrammarError::Gbnf { line: 1, column: 1, message: "the grammar has no 'root' rule".into() });
    }
    Ok(rules)
}

/// GBNF text → a Lark grammar for llguidance; errors name the line and column.
pub fn gbnf_to_lark(text: &str) -> Result<String, GrammarError> {
    let src: Vec<char> = text.chars().collect();
    let rules = parse(&src)?;
    // GBNF names may hold '-' and capitals (Lark reads capitals as terminals): each rule gets
    // a lowercase name of its own.
    let mut names: BTreeMap<&str, String> = BTreeMap::new();
    let mut taken: BTreeSet<String> = BTreeSet::new();
    for (n, _) in &rules {
        let base = format!("g_{}", n.to_ascii_lowercase().replace('-', "_"));
        let mut name = base.clone();
        let mut k = 1;
        while !taken.insert(name.clone()) {
            k += 1;
            name = format!("{base}_{k}");
        }
        names.insert(n.as_str(), name);
    }
    let mut out = format!("start: {}\n", names["root"]);
    for (n, body) in &rules {
        let mut s = String::new();
        emit(body, &names, &src, &mut s)?;
        let _ = writeln!(out, "{}: {s}", names[n.as_str()]);
    }
    Ok(out)
}

/// A Lark string literal (JSON syntax) of one character.
fn lark_char(c: char, out: &mut String) {
    out.push('"');
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        c if (c as u32) < 0x20 || c as u32 == 0x7f => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c => out.push(c),
    }
    out.push('"');
}

fn emit(e: &Expr, names: &BTreeMap<&str, String>, src: &[char], out: &mut String) -> Result<(), GrammarError> {
    match e {
        // One literal per character: llguidance lexes a longer literal greedily, which would
        // refuse texts that GBNF's character-level reading accepts (`"a" "b" | "ab" "c"`).
        Expr::Literal(s) if s.is_empty() => out.push_str("\"\""),
        Expr::Literal(s) => {
            out.push('(');
            for (i, c) in s.chars().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                lark_char(c, out);
            }
            out.push(')');
        }
        Expr::Any => out.push_str("/(?s:.)/"),
        Expr::Class { negated, ranges } => {
            out.push_str(if *negated { "/[^" } else { "/[" });
            for &(lo, hi) in ranges {
                let _ = write!(out, "\\x{{{:x}}}", lo as u32);
                if hi != lo {
                    let _ = write!(out, "-\\x{{{:x}}}", hi as u32);
                }
            }
            out.push_str("]/");
        }
        Expr::Rule(name, at) => match names.get(name.as_str()) {
            Some(n) => out.push_str(n),
            None => {
                let (line, column) = line_col(src, *at);
                return Err(GrammarError::Gbnf { line, column, message: format!("the rule '{name}' is not defined") });
            }
        },
        Expr::Alt(alts) => {
            let empty = alts.iter().any(Vec::is_empty);
            let full: Vec<&Vec<Expr>> = alts.iter().filter(|a| !a.is_empty()).collect();
            if full.is_empty() {
                out.push_str("\"\"");
                return Ok(());
            }
            out.push('(');
            for (i, seq) in full.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                for (j, item) in seq.iter().enumerate() {
                    if j > 0 {
                        out.push(' ');
                    }
                    emit(item, names, src, out)?;
                }
            }
            out.push(')');
            if empty {
                out.push('?');
            }
        }
        Expr::Repeat(inner, lo, hi) => {
            out.push('(');
            emit(inner, names, src, out)?;
            out.push(')');
            match (lo, hi) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (lo, None) => {
                    let _ = write!(out, "{{{lo},}}");
                }
                (lo, Some(hi)) => {
                    let _ = write!(out, "{{{lo},{hi}}}");
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_translates() {
        let g = "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ # digits\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: g_root\ng_root: (g_expr)\ng_expr: (g_term ((((\"+\") | (\"-\")) g_term))*)\ng_term: ((/[\\x{30}-\\x{39}]/)+)\n"
        );
    }

    #[test]
    fn multi_line_rules_and_names() {
        let g = "root ::=\n  \"{\" ws (\n   my-Item\n  )? \"}\"\n  | \"x\"\nmy-Item ::= [^\"\\\\] ws\nws ::= [ \\t\\n]*\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert!(lark.contains("g_my_item: (/[^\\x{22}\\x{5c}]/ g_ws)"), "{lark}");
        assert!(lark.contains("| (\"x\"))"), "{lark}");
    }

    #[test]
    fn errors_name_line_and_column() {
        let cases = [
            ("root ::= \"a\" b\n", (1, 14), "not defined"),
            ("root ::= \"a\n", (1, 12), "unterminated string"),
            ("root = \"a\"\n", (1, 6), "expected '::='"),
            ("rot ::= \"a\"\n", (1, 1), "no 'root'"),
            ("root ::= [z-a]\n", (1, 11), "backwards"),
            ("root ::= \"a\"{3,1}\n", (1, 18), "backwards"),
            ("root ::= (\"a\"\n", (2, 1), "expected ')'"),
            ("root ::= \"\\q\"\n", (1, 12), "unknown escape"),
            ("root ::= \"\\x+f\"\n", (1, 13), "hexadecimal"),
            ("root ::= * \"a\"\n", (1, 10), "needs an item"),
            ("root ::= \"a\"{2000}\n", (1, 19), "above 1000"),
            ("root ::= \"a\"{99999999999999999999999,}\n", (1, 39), "above 1000"),
            ("root ::= \"a\"*****\n", (1, 17), "stacked on one item"),
        ];
        let deep = format!("root ::= {}\"a\"{}\n", "(".repeat(100_000), ")".repeat(100_000));
        assert!(matches!(gbnf_to_lark(&deep), Err(GrammarError::Gbnf { message, .. }) if message.contains("nest deeper")));
        for (g, (line, column), what) in cases {
            match gbnf_to_lark(g) {
                Err(GrammarError::Gbnf { line: l, column: c, message }) => {
                    assert_eq!((l, c), (line, column), "{g:?}: {message}");
                    assert!(message.contains(what), "{g:?}: {message}");
                }
                other => panic!("{g:?}: {other:?}"),
            }
        }
    }
}
